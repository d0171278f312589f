"""Cleaned catalog entries of one upstream.

Upstream servers send whatever they send. Every entry is cleaned on its own
(`clean_tool`, `clean_prompt`, ...): a malformed one is dropped with a reason,
never the whole list, and what survives is safe to republish to a client.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

SUMMARY_CHARS = 200
MAX_NESTING = 64  # deeper schemas are dropped: clients' JSON parsers stop at about 128 levels
DROPPED_MARK = "x-aggregator-dropped"  # set by the transport on an entry it could not read
_HEAD_CHARS = 4096  # raw characters read for a summary, unless whitespace leaves too few
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)|[。！？]")
_ABBREVIATIONS = ("e.g", "i.e", "etc", "vs", "cf", "approx", "incl", "no")


class MalformedEntry(ValueError):
    """An upstream entry that cannot be republished; the message says why."""


def age_text(seconds: float) -> str:
    """A rough age for people: 40s, 12m, 5h, 3d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def nesting_exceeds(value: Any, limit: int) -> bool:
    """True if `value` has objects or arrays nested more than `limit` levels (no recursion).

    A container already walked is not walked again, so a cyclic structure built in
    memory (JSON from the wire never is) ends the walk instead of counting forever.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    seen: set[int] = set()
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        if id(item) in seen:
            continue
        seen.add(id(item))
        stack.extend((child, depth + 1) for child in children)
    return False


def summarize(description: str | None) -> str:
    """First sentence of a description, at most 200 characters.

    Only the head can be the summary (a sentence end past it is cut anyway), so only the head is
    read: a 1 MB description costs what a short one does, and the abbreviation check (which looks
    back at the words before each sentence end) stays linear.
    """
    raw = description or ""
    head = " ".join(raw[:_HEAD_CHARS].split())
    text = head if len(head) > SUMMARY_CHARS or len(raw) <= _HEAD_CHARS else " ".join(raw.split())
    if not text:
        return ""
    first = _first_sentence(text[: SUMMARY_CHARS + 1])
    if len(first) > SUMMARY_CHARS:
        first = first[: SUMMARY_CHARS - 1].rstrip() + "…"
    return first


def _first_sentence(text: str) -> str:
    """Up to the first sentence end that is not an abbreviation such as "e.g."."""
    for match in _SENTENCE_END.finditer(text):
        words = text[: match.start()].rsplit(None, 1)
        if words and words[-1].lower().rstrip(".") in _ABBREVIATIONS:
            continue
        return text[: match.end()]
    return text


@dataclass(frozen=True, slots=True)
class ToolEntry:
    """One upstream tool, cleaned. `wire` is the camelCase dict to republish."""

    server: str
    name: str
    title: str | None
    description: str
    input_schema: Mapping[str, Any]
    output_schema: Mapping[str, Any] | None
    annotations: Mapping[str, Any] | None
    wire: Mapping[str, Any]
    hidden: bool = False

    @property
    def arg_keys(self) -> list[str]:
        props = self.input_schema.get("properties")
        return sorted(props) if isinstance(props, dict) else []

    @property
    def required(self) -> list[str]:
        req = self.input_schema.get("required")
        return [r for r in req if isinstance(r, str)] if isinstance(req, list) else []

    @property
    def summary(self) -> str:
        return summarize(self.description)

    @property
    def read_only(self) -> bool | None:
        if self.annotations is None:
            return None
        value = self.annotations.get("readOnlyHint")
        return value if isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class PromptArgument:
    name: str
    description: str
    required: bool


@dataclass(frozen=True, slots=True)
class PromptEntry:
    server: str
    name: str
    title: str | None
    description: str
    arguments: tuple[PromptArgument, ...]
    hidden: bool = False


@dataclass(frozen=True, slots=True)
class ResourceEntry:
    server: str
    name: str
    uri: str
    title: str | None
    description: str
    mime_type: str | None
    hidden: bool = False


@dataclass(frozen=True, slots=True)
class ResourceTemplateEntry:
    server: str
    name: str
    uri_template: str
    title: str | None
    description: str
    mime_type: str | None
    hidden: bool = False

    @property
    def variables(self) -> list[str]:
        """The `{var}` names of the URI template (RFC 6570 operators and modifiers stripped)."""
        names: list[str] = []
        for expr in re.findall(r"\{([^}]*)\}", self.uri_template):
            for part in expr.lstrip("+#./;?&=,!@|").split(","):
                name = part.strip().rstrip("*").split(":", 1)[0]
                if name and name not in names:
                    names.append(name)
        return names


@dataclass(frozen=True, slots=True)
class Catalog:
    """Everything one upstream offers, as last listed. Entries are sorted by name.

    `tools` holds every tool the upstream reported, those hidden by the
    allow/deny filters included (`hidden=True`); `exposed_tools` is what clients see.
    `origin` says whether it was listed by the running upstream (`live`) or read
    from an on-disk snapshot of an earlier listing (`snapshot`; `loaded_at` is
    then when that listing happened).
    """

    server: str
    tools: tuple[ToolEntry, ...] = ()
    prompts: tuple[PromptEntry, ...] = ()
    resources: tuple[ResourceEntry, ...] = ()
    resource_templates: tuple[ResourceTemplateEntry, ...] = ()
    loaded_at: float = field(default_factory=time.time)
    dropped: tuple[str, ...] = ()  # one line per malformed entry that was dropped
    server_info: Mapping[str, Any] | None = None  # the upstream's serverInfo (camelCase wire dict)
    instructions: str | None = None  # the upstream's `instructions` from its handshake
    # The client capabilities (roots, sampling, elicitation) declared to the upstream when it listed:
    # some upstreams list more tools to a client that can answer more. None: not recorded.
    offered: tuple[str, ...] | None = None
    origin: Literal["live", "snapshot"] = "live"
    # Derived once (a catalog never changes): every call looks its tool up by name.
    _by_name: dict[str, ToolEntry] = field(init=False, repr=False, compare=False)
    _exposed: tuple[ToolEntry, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {t.name: t for t in self.tools})
        object.__setattr__(self, "_exposed", tuple(t for t in self.tools if not t.hidden))

    @property
    def exposed_tools(self) -> tuple[ToolEntry, ...]:
        return self._exposed

    def tool(self, name: str) -> ToolEntry | None:
        return self._by_name.get(name)

    @property
    def is_snapshot(self) -> bool:
        return self.origin == "snapshot"

    def age(self, now: float | None = None) -> float:
        """Seconds since this catalog was listed (by the upstream, for a snapshot too)."""
        return max(0.0, (time.time() if now is None else now) - self.loaded_at)

    def as_snapshot(self) -> Catalog:
        """The same listing, marked as coming from a snapshot."""
        return self if self.is_snapshot else dataclasses.replace(self, origin="snapshot")


# ---------------------------------------------------------------- cleaning


def _opt_str(raw: Mapping[str, Any], key: str) -> str | None:
    value = raw.get(key)
    return value if isinstance(value, str) else None


def _name(raw: Any, what: str) -> str:
    if not isinstance(raw, Mapping):
        raise MalformedEntry(f"{what} is not an object")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise MalformedEntry(f"{what} has no name")
    if DROPPED_MARK in raw:
        raise MalformedEntry(f"{what} {name!r}: {raw[DROPPED_MARK]}")
    return name


def clean_tool(server: str, raw: Any, *, hidden: bool = False) -> ToolEntry:
    """Validate one wire tool; a schema without `type` is given `type: object`."""
    name = _name(raw, "tool")
    schema = raw.get("inputSchema", {"type": "object"})
    if not isinstance(schema, Mapping):
        raise MalformedEntry(f"tool {name!r}: inputSchema is not an object")
    schema = dict(schema)
    if schema.get("type") is None:
        schema["type"] = "object"
    elif schema.get("type") != "object":
        raise MalformedEntry(f"tool {name!r}: inputSchema type is {schema.get('type')!r}, not 'object'")
    _check_schema(name, schema)
    output = raw.get("outputSchema")
    if output is not None and not (isinstance(output, Mapping) and output.get("type") == "object"):
        output = None  # unusable output schema: drop it, keep the tool
    if output is not None and nesting_exceeds(output, MAX_NESTING):
        output = None
    annotations = raw.get("annotations")
    if not isinstance(annotations, Mapping):
        annotations = None
    description = _opt_str(raw, "description") or ""
    wire: dict[str, Any] = {k: v for k, v in raw.items() if k not in ("inputSchema", "outputSchema", "annotations")}
    wire["inputSchema"] = schema
    if output is not None:
        wire["outputSchema"] = dict(output)
    if annotations is not None:
        wire["annotations"] = dict(annotations)
    if "description" in wire and not isinstance(wire["description"], str):
        del wire["description"]
    if "title" in wire and not isinstance(wire["title"], str):
        del wire["title"]
    return ToolEntry(
        server=server,
        name=name,
        title=_opt_str(raw, "title") or (_opt_str(annotations, "title") if annotations else None),
        description=description,
        input_schema=schema,
        output_schema=dict(output) if output is not None else None,
        annotations=dict(annotations) if annotations is not None else None,
        wire=wire,
        hidden=hidden,
    )


def _check_schema(name: str, schema: Mapping[str, Any]) -> None:
    """What every protocol version requires of an inputSchema, and a sane depth."""
    properties = schema.get("properties")
    if properties is not None and not (
        isinstance(properties, Mapping) and all(isinstance(p, Mapping | bool) for p in properties.values())
    ):
        raise MalformedEntry(f"tool {name!r}: inputSchema.properties is not an object of schemas")
    required = schema.get("required")
    if required is not None and not (isinstance(required, list) and all(isinstance(r, str) for r in required)):
        raise MalformedEntry(f"tool {name!r}: inputSchema.required is not a list of names")
    if nesting_exceeds(schema, MAX_NESTING):
        raise MalformedEntry(f"tool {name!r}: inputSchema is nested deeper than {MAX_NESTING} levels")


def clean_prompt(server: str, raw: Any, *, hidden: bool = False) -> PromptEntry:
    name = _name(raw, "prompt")
    raw_args = raw.get("arguments") or []
    if not isinstance(raw_args, list):
        raise MalformedEntry(f"prompt {name!r}: arguments is not a list")
    args: list[PromptArgument] = []
    for arg in raw_args:
        if isinstance(arg, Mapping) and isinstance(arg.get("name"), str):
            args.append(PromptArgument(arg["name"], _opt_str(arg, "description") or "", arg.get("required") is True))
    return PromptEntry(server, name, _opt_str(raw, "title"), _opt_str(raw, "description") or "", tuple(args), hidden)


def clean_resource(server: str, raw: Any, *, hidden: bool = False) -> ResourceEntry:
    name = _name(raw, "resource")
    uri = raw.get("uri")
    if not isinstance(uri, str):
        raise MalformedEntry(f"resource {name!r} has no uri")
    return ResourceEntry(
        server, name, uri, _opt_str(raw, "title"), _opt_str(raw, "description") or "", _opt_str(raw, "mimeType"), hidden
    )


def clean_resource_template(server: str, raw: Any, *, hidden: bool = False) -> ResourceTemplateEntry:
    name = _name(raw, "resource template")
    template = raw.get("uriTemplate")
    if not isinstance(template, str):
        raise MalformedEntry(f"resource template {name!r} has no uriTemplate")
    return ResourceTemplateEntry(
        server,
        name,
        template,
        _opt_str(raw, "title"),
        _opt_str(raw, "description") or "",
        _opt_str(raw, "mimeType"),
        hidden,
    )


def catalog_of_wire_tools(server: str, raw_tools: Iterable[Any]) -> Catalog:
    """A catalog of `server` from wire tool definitions; a malformed one is dropped, as in a live listing."""
    tools = []
    for raw in raw_tools:
        try:
            tools.append(clean_tool(server, raw))
        except MalformedEntry:
            continue
    return Catalog(server, sorted_unique(tools))


def sorted_unique(entries: Iterable[Any]) -> tuple[Any, ...]:
    """Sort entries by name; keep the first of duplicate names (upstream bugs happen)."""
    seen: dict[str, Any] = {}
    for entry in entries:
        seen.setdefault(entry.name, entry)
    return tuple(seen[name] for name in sorted(seen))
