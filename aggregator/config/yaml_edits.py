"""Editing aggregator.yaml from the command line (`init`, `add`, `remove`), comments and order kept.

Each function takes the file's text and returns the new text; the caller checks that the result
still loads before it replaces the file (nothing here touches the disk).
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aggregator.config.errors import ConfigError
from aggregator.config.models import NAME_PATTERN, RESERVED_NAME
from aggregator.config.roundtrip import _yaml, merge_servers_yaml

__all__ = ["STARTER", "add_server", "entry_from_words", "remove_server", "server_key"]

STARTER = """\
# aggregator.yaml: the MCP servers ("upstreams") the aggregator fronts. Clients (Claude Desktop,
# Claude Code, Cursor, VS Code) start `aggregator serve`; it starts these only when first needed.
#
#   aggregator add git -- uvx mcp-server-git --repository ~/src/project   a local command
#   aggregator add docs https://example.com/mcp                           a remote server
#   aggregator remove git                     aggregator import --write   (servers your clients have)
#   aggregator tools git                      aggregator doctor           (checks everything)
#
# An entry by hand (${VAR} and ${VAR:-default} expand in args, env, url and headers):
#   git:
#     command: uvx
#     args: [mcp-server-git, --repository, /home/me/src/project]
#     description: Git operations on my project   # searchable before the server starts
#   docs:
#     url: https://example.com/mcp
#     headers: {Authorization: "Bearer ${DOCS_TOKEN}"}
#
# Which of the aggregator's own tools a client sees (the catalog tools are always there):
# own_tools: {introspection: false, text_index: false}
upstreams:
"""
"""What `init` writes: comments only, then the (empty) section that `add` appends to."""


def entry_from_words(words: Sequence[str], cwd: Path, *, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`add`'s entry: one http(s) URL → `{url}`, else `{command, args}`; `env` added when given.

    A relative path argument (`.`, `./x`, `../x`) is made absolute against `cwd`: the aggregator runs
    from wherever a client starts it, not from the shell where the server was added.
    """
    if not words:
        raise ValueError("give the server's command (after --) or its URL")
    entry: dict[str, Any]
    if len(words) == 1 and urlsplit(words[0]).scheme in ("http", "https") and urlsplit(words[0]).netloc:
        entry = {"url": words[0]}
    else:
        entry = {"command": words[0]}
        if len(words) > 1:
            entry["args"] = [_absolute_if_relative(word, cwd) for word in words[1:]]
    if env:
        entry["env"] = dict(env)
    return entry


def _absolute_if_relative(word: str, cwd: Path) -> str:
    if word in (".", "..") or word.startswith(("./", "../")):
        return os.path.normpath(cwd / word)
    return word


def server_key(name: str, existing: Mapping[str, Any]) -> str | None:
    """The key in `existing` naming the same upstream as `name` (names are unique ignoring case)."""
    return next((key for key in existing if str(key).casefold() == name.casefold()), None)


def check_name(name: str) -> None:
    """Raise ValueError (with the fix) for a name the config would refuse."""
    if not NAME_PATTERN.fullmatch(name):
        raise ValueError(f"{name!r} is not a valid upstream name: use letters, digits, '-' and '_'")
    if name.casefold() == RESERVED_NAME:
        raise ValueError(f"{name!r} is reserved for the aggregator's own tools: choose another name")


def add_server(text: str, source: str, section: str, name: str, entry: Mapping[str, Any]) -> str:
    """`text` with `entry` added as `name` at the end of `section` (a new file starts from STARTER)."""
    return merge_servers_yaml(text if text.strip() else STARTER, source, section, {name: entry})


def remove_server(text: str, source: str, section: str, name: str) -> str:
    """`text` without the entry `name` of `section`; every other line as the user wrote it."""
    from ruamel.yaml.error import YAMLError  # on first use: `serve` never edits a file (issue 24, start-up)

    yaml = _yaml()
    try:
        data = yaml.load(text)
    except YAMLError as exc:
        raise ConfigError(source, None, f"cannot edit the YAML ({type(exc).__name__})", "fix the file first") from None
    servers = data.get(section) if isinstance(data, dict) else None
    if not isinstance(servers, dict) or name not in servers:
        raise ConfigError(source, section, f"no upstream named {name!r} here", "see: aggregator list-upstreams")
    del servers[name]
    if not servers:
        data[section] = None  # `upstreams:` again, not `{}`: the next `add` then writes block style
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()
