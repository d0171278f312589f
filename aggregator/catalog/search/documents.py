"""What the search reads of a tool and of a server: the tokens of each field (`scoring.FIELDS`).

A tool's own fields are its name (also whole, as one `identifier` token),
title, description, parameters and annotations; every tool of a server also
carries the server's name and operator metadata. A server whose catalog is
not loaded is indexed as a *card* of its name and metadata alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

from aggregator.catalog.model import ToolEntry
from aggregator.catalog.search.query import lexicon
from aggregator.catalog.search.tokens import identifier, stem, tokenize

MAX_INDEXED_CHARS = 16_384  # of one description or parameter text: a 1 MB one would block the loop on load


def tool_fields(entry: ToolEntry) -> dict[str, list[str]]:
    """The tokens of a tool's own fields."""
    return {
        "name": (name := tokenize(entry.name)),
        "identifier": [] if (whole := identifier(name)) is None else [whole],
        "title": tokenize(entry.title),
        "description": tokenize(entry.description[:MAX_INDEXED_CHARS]),
        "params": tokens_of(param_texts(entry.input_schema)),
        "annotations": annotation_tokens(entry.annotations),
    }


def server_fields(server: str, description: str, capabilities: Iterable[str]) -> dict[str, list[str]]:
    """The tokens of the fields every tool of a server has: its name and operator metadata."""
    return {
        "server_name": tokenize(server),
        "server_description": [*tokenize(description), *tokens_of(capabilities)],
    }


# (server field, tool field): a server field equal to the tool's own is not counted again
SERVER_ECHOES = (("server_name", "name"), ("server_description", "description"))


def counted_server_fields(own: Mapping[str, list[str]], server: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """The server fields that count for a tool with fields `own`: all but one that only repeats the
    tool's own (a one-tool server named and described as its tool), whose words counted twice would
    weigh as two pieces of evidence."""
    echoes = {field for field, mine in SERVER_ECHOES if server.get(field) and server[field] == own.get(mine)}
    return {field: tokens for field, tokens in server.items() if field not in echoes}


def card_fields(server_fields: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """A card's fields: on its own, the server's name and description weigh as a tool's."""
    return {"name": server_fields["server_name"], "description": server_fields["server_description"]}


NameParts = tuple[str, frozenset[str]]  # stems of a tool name's verb and of its other words
# Verbs that change something, by what they do: a name opening with one says what the tool does
# to its object. A request's verb of another kind contradicts it (delete a row: no create_table);
# one of the same kind does not (create a file: write_file). "make" is of two ("make the volume
# 20" sets it). A reading verb (get, list, read, find) contradicts no request: nearly any
# request reads something.
_KINDS = (
    ("make", "create make new add insert write save store start"),
    ("remove", "delete remove erase drop"),
    ("alter", "update edit modify change set move rename make"),
)


@cache
def changing() -> dict[str, frozenset[str]]:
    """Stem of a changing verb → its kinds (`_KINDS`), worked out on first use: stemming loads
    the stemmer, which `serve` defers to the first search (issue 24: memory)."""
    return {
        stem(verb): frozenset(kind for kind, verbs in _KINDS if verb in verbs.split())
        for _, verbs in _KINDS
        for verb in verbs.split()
    }


def name_parts(name: list[str], server: list[str]) -> NameParts | None:
    """A tool name that is a verb and its object (`create_table`, `git_create_branch` of server
    "git"): the verb's stem, a word of the lexicon, and the other words' stems; None for any other
    name. Its object words say what the tool acts on, not what it does: "table" in "delete the
    rows of the events table" is no evidence for `create_table` (`RankingParams.name_damping`)."""
    words = name[len(server) :] if name[: len(server)] == server else name
    if len(words) < 2 or (verb := stem(words[0])) not in lexicon().known:
        return None
    return verb, frozenset(stem(word) for word in words[1:]) - {verb}


def annotation_tokens(annotations: Mapping[str, Any] | None) -> list[str]:
    """Tokens of a tool's annotations: each hint set to true as one token, and string values.

    `readOnlyHint: true` gives `readonly`, not `read` + `only`: nearly every tool
    carries hints, and splitting them would make "read" or "open" look common
    in the catalog and weigh them down in every query. ("read only" still
    prefix-matches `readonly`.)
    """
    if not annotations:
        return []
    tokens: list[str] = []
    for key in sorted(annotations):
        value = annotations[key]
        if value is True:
            joined = "".join(tokenize(key.removesuffix("Hint")))
            if joined:
                tokens.append(joined)
        elif isinstance(value, str):
            tokens.extend(tokenize(value))
    return tokens


def tokens_of(texts: Iterable[str]) -> list[str]:
    """The tokens of several texts, each cut to MAX_INDEXED_CHARS (one tokenizer call: a space
    never joins two texts' words into one token)."""
    return tokenize(" ".join(text[:MAX_INDEXED_CHARS] for text in texts))


def param_texts(schema: Mapping[str, Any]) -> list[str]:
    """The input schema's top-level property names and their descriptions, in name order."""
    props = schema.get("properties")
    if not isinstance(props, dict):
        return []
    texts: list[str] = []
    for name in sorted(props):
        texts.append(str(name))
        spec = props[name]
        if isinstance(spec, dict) and isinstance(spec.get("description"), str):
            texts.append(spec["description"])
    return texts
