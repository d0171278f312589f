"""The symbol table of the aggregated catalog (DESIGN §2.4). Pure functions, no I/O.

The introspection seeds look at a Lisp image; here the image is the set of
loaded catalogs plus the aggregator's own tools:

- a *package* is an upstream (its catalog's key in the mapping) or `aggregator`;
- a *symbol* is one entry `(package, NAME, TYPE, hidden)`, NAME being the entry's
  `name` field, TYPE one of TOOL, GENERIC-FUNCTION, PROMPT, RESOURCE,
  RESOURCE-TEMPLATE;
- a *parameter* (the seed's special variable) is a property name anywhere in a
  tool's input schema, a prompt argument, or a resource template's `{var}`.

Classification (the seed's precedence, "generic function" over "function"): a
tool NAME offered by two or more packages is a GENERIC-FUNCTION in every package
offering it, any other tool a TOOL. "Packages" means exactly the catalogs given
(the loaded upstreams) plus `aggregator`, and a hidden tool counts: hiding is an
export decision of the aggregator, the upstream still offers the tool (as an
internal Lisp symbol can still name a generic function). This makes the TYPE of
an entry independent of the search scope, so a scoped and an unscoped search,
and `catalog_describe_tool`, always agree.

"Ignoring case" is `str.casefold()` on both sides, for apropos patterns
(substring) and who-references names (equality): the seed's lower-case compare,
correct for non-ASCII names too.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from aggregator.catalog.model import (
    Catalog,
    PromptEntry,
    ResourceEntry,
    ResourceTemplateEntry,
    ToolEntry,
)

AGGREGATOR_PACKAGE = "aggregator"

SymbolType = Literal["TOOL", "GENERIC-FUNCTION", "PROMPT", "RESOURCE", "RESOURCE-TEMPLATE"]
ToolKind = Literal["tool", "generic-function"]
Entry = ToolEntry | PromptEntry | ResourceEntry | ResourceTemplateEntry

TYPE_FILTERS: Mapping[str, SymbolType] = {
    "tool": "TOOL",
    "prompt": "PROMPT",
    "resource": "RESOURCE",
    "resource-template": "RESOURCE-TEMPLATE",
    "generic-function": "GENERIC-FUNCTION",
    # the seed's names, accepted as aliases
    "function": "TOOL",
    "macro": "PROMPT",
    "variable": "RESOURCE",
    "class": "RESOURCE-TEMPLATE",
}
"""Accepted `type` filter values, in the order the `Invalid type` message lists them."""

MAX_SCHEMA_DEPTH = 64
"""Schema levels the reference walk descends before it stops (guards hand-built schemas)."""
MAX_SCHEMA_NODES = 10_000
"""Subschemas the reference walk visits per schema before it stops."""


def parse_type_filter(value: str) -> SymbolType | None:
    """The TYPE a `type` argument selects (case-insensitive), None if it is not a valid type."""
    return TYPE_FILTERS.get(value.casefold())


# ---------------------------------------------------------------- classification


def tool_package_counts(catalogs: Mapping[str, Catalog], own_tool_names: Iterable[str] = ()) -> Counter[str]:
    """For each tool NAME (exact, case-sensitive), how many packages offer it, hidden tools included."""
    counts: Counter[str] = Counter()
    for catalog in catalogs.values():
        counts.update({tool.name for tool in catalog.tools})
    counts.update(set(own_tool_names))
    return counts


def classify_tool(name: str, catalogs: Mapping[str, Catalog], own_tool_names: Iterable[str] = ()) -> ToolKind:
    """`"generic-function"` if two or more packages offer a tool named `name`, else `"tool"`.

    Pass what apropos-search sees: `catalogs` = `source.store.loaded()` (every loaded
    upstream, keyed by name) and `own_tool_names` = the names of every tool the
    aggregator serves itself (package `aggregator`). Hidden tools count. The
    describe label is `classify_tool(...).upper()` ("TOOL" / "GENERIC-FUNCTION").
    """
    offered = sum(1 for catalog in catalogs.values() if any(t.name == name for t in catalog.tools))
    if name in set(own_tool_names):
        offered += 1
    return "generic-function" if offered >= 2 else "tool"


# ---------------------------------------------------------------- symbols


@dataclass(frozen=True, slots=True)
class Symbol:
    """One catalog entry seen as a symbol. `line` is its output line, precomputed."""

    package: str
    name: str
    type: SymbolType
    hidden: bool
    entry: Entry
    folded: str
    line: str

    @classmethod
    def of(cls, package: str, entry: Entry, type_: SymbolType) -> Symbol:
        line = f"  {package}::{entry.name} [{type_}]" + (" (hidden)" if entry.hidden else "")
        return cls(package, entry.name, type_, entry.hidden, entry, entry.name.casefold(), line)

    @property
    def sort_key(self) -> tuple[str, str, str, str, str]:
        """DESIGN §2.4 order: NAME case-folded, package, TYPE; exact spellings break ties."""
        return (self.folded, self.package.casefold(), self.package, self.type, self.name)


def _package_symbols(package: str, catalog: Catalog, counts: Counter[str]) -> Iterator[Symbol]:
    for tool in catalog.tools:
        yield Symbol.of(package, tool, "GENERIC-FUNCTION" if counts[tool.name] >= 2 else "TOOL")
    for prompt in catalog.prompts:
        yield Symbol.of(package, prompt, "PROMPT")
    for resource in catalog.resources:
        yield Symbol.of(package, resource, "RESOURCE")
    for template in catalog.resource_templates:
        yield Symbol.of(package, template, "RESOURCE-TEMPLATE")


def enumerate_symbols(catalogs: Mapping[str, Catalog], own_tools: Sequence[ToolEntry]) -> list[Symbol]:
    """Every entry of every catalog, hidden ones included, plus `own_tools` as package `aggregator`.

    Sorted by `Symbol.sort_key`; one symbol per (package, NAME, TYPE), the first
    occurrence in catalog order winning (cleaned catalogs never repeat a name).
    """
    counts = tool_package_counts(catalogs, (t.name for t in own_tools))
    own = Catalog(server=AGGREGATOR_PACKAGE, tools=tuple(own_tools), loaded_at=0.0)
    packages = [*catalogs.items(), (AGGREGATOR_PACKAGE, own)]
    seen: set[tuple[str, str, str]] = set()
    symbols: list[Symbol] = []
    for package, catalog in packages:
        for symbol in _package_symbols(package, catalog, counts):
            key = (symbol.package, symbol.name, symbol.type)
            if key not in seen:
                seen.add(key)
                symbols.append(symbol)
    symbols.sort(key=lambda s: s.sort_key)
    return symbols


# ---------------------------------------------------------------- parameters (references)

_BARE_SEGMENT = re.compile(r"[A-Za-z0-9_$@-]+")
_SCHEMA_KEYWORDS: tuple[tuple[str, bool], ...] = (
    # (keyword, whether its value maps names to subschemas), in walk order;
    # the others hold one subschema or a list of them (`items` may be either)
    ("properties", True),
    ("patternProperties", True),
    ("additionalProperties", False),
    ("unevaluatedProperties", False),
    ("propertyNames", False),
    ("dependentSchemas", True),
    ("prefixItems", False),
    ("items", False),
    ("additionalItems", False),
    ("unevaluatedItems", False),
    ("contains", False),
    ("anyOf", False),
    ("oneOf", False),
    ("allOf", False),
    ("not", False),
    ("if", False),
    ("then", False),
    ("else", False),
    ("$defs", True),
    ("definitions", True),
)
_KEYWORD_SET = frozenset(k for k, _ in _SCHEMA_KEYWORDS)


def _is_map(value: Any) -> bool:
    return type(value) is dict or isinstance(value, Mapping)  # the exact check first: ABC checks are slow


@lru_cache(maxsize=8192)
def path_segment(key: str) -> str:
    """`.key` for a plain key, `["key"]` (JSON-quoted) for one with dots, spaces or other characters."""
    return f".{key}" if _BARE_SEGMENT.fullmatch(key) else f"[{json.dumps(key, ensure_ascii=False)}]"


class _Walk:
    """One depth-first walk of a schema, collecting (property name, path) pairs.

    Path syntax: keywords joined by dots, array positions in brackets, keys that
    are not plain (`[A-Za-z0-9_$@-]+`) JSON-quoted in brackets:
    `properties.repo`, `properties.a.items.properties.b`, `$defs.X.properties.y`,
    `anyOf[0].properties.z`, `properties["a.b"]`. Keywords are walked in the
    order of `_SCHEMA_KEYWORDS`, the keys of a mapping sorted, so the order does
    not depend on how the upstream ordered its JSON. `$ref` is not followed (the
    `$defs` it points into are walked where they are). A mapping already on the
    current path (a cycle), depth beyond MAX_SCHEMA_DEPTH and visits beyond
    MAX_SCHEMA_NODES end the walk of that branch; JSON from the wire never has
    cycles, and real schemas stay far below both limits.
    """

    def __init__(self) -> None:
        self.found: list[tuple[str, str]] = []
        self._on_path: set[int] = set()
        self._budget = MAX_SCHEMA_NODES

    def schema(self, node: Any, path: str, depth: int) -> None:
        if not _is_map(node) or depth > MAX_SCHEMA_DEPTH or id(node) in self._on_path or self._budget <= 0:
            return
        self._budget -= 1
        present = _KEYWORD_SET.intersection(node)
        if not present:
            return
        self._on_path.add(id(node))
        try:
            for keyword, is_map in _SCHEMA_KEYWORDS:
                if keyword in present:
                    where = f"{path}.{keyword}" if path else keyword
                    self._keyword(keyword, is_map, node[keyword], where, depth + 1)
        finally:
            self._on_path.discard(id(node))

    def _keyword(self, keyword: str, is_map: bool, value: Any, where: str, depth: int) -> None:
        if is_map:
            if _is_map(value):
                for key in sorted(k for k in value if isinstance(k, str)):
                    at = where + path_segment(key)
                    if keyword == "properties":
                        self.found.append((key, at))
                    self.schema(value[key], at, depth)
        elif isinstance(value, list):
            for index, member in enumerate(value):
                self.schema(member, f"{where}[{index}]", depth)
        else:
            self.schema(value, where, depth)


def schema_parameters(schema: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every property name declared anywhere in a JSON schema, with where (see `_Walk`), in walk order."""
    walk = _Walk()
    walk.schema(schema, "", 0)
    return walk.found


def entry_parameters(entry: Entry) -> list[tuple[str, str]]:
    """(parameter name, `at` location) pairs of one entry; resources have none."""
    if isinstance(entry, ToolEntry):
        return schema_parameters(entry.input_schema)
    if isinstance(entry, PromptEntry):
        return [(arg.name, "arguments" + path_segment(arg.name)) for arg in entry.arguments]
    if isinstance(entry, ResourceTemplateEntry):
        return [(var, f"uriTemplate {{{var}}}") for var in entry.variables]
    return []


# ---------------------------------------------------------------- the table


@dataclass(frozen=True, slots=True)
class Reference:
    """A symbol using a parameter, and where (in walk order, unique); `text` is its output block."""

    symbol: Symbol
    where: tuple[str, ...]
    text: str

    @classmethod
    def of(cls, symbol: Symbol, where: tuple[str, ...]) -> Reference:
        return cls(symbol, where, symbol.line + "".join(f"\n    at {w}" for w in where))


class SymbolTable:
    """All symbols of one catalog state, sorted, with per-scope views and a parameter index.

    Immutable once built; the parameter index is built on first use. Build one per
    catalog state and reuse it: a query then only scans (apropos) or looks up
    (who-references) precomputed data.
    """

    def __init__(self, catalogs: Mapping[str, Catalog], own_tools: Sequence[ToolEntry]) -> None:
        self.symbols: tuple[Symbol, ...] = tuple(enumerate_symbols(catalogs, own_tools))
        self.exposed: tuple[Symbol, ...] = tuple(s for s in self.symbols if not s.hidden)
        by_package: dict[str, list[Symbol]] = {}
        for symbol in self.symbols:
            by_package.setdefault(symbol.package, []).append(symbol)
        self.by_package: dict[str, tuple[Symbol, ...]] = {p: tuple(s) for p, s in by_package.items()}
        self._params: dict[str, list[Reference]] | None = None

    def scope(self, package: str | None) -> tuple[Symbol, ...]:
        """Exposed symbols of every package (None), or every symbol of one package."""
        return self.exposed if package is None else self.by_package.get(package, ())

    def apropos(self, pattern: str, package: str | None = None, type_: SymbolType | None = None) -> list[Symbol]:
        """Symbols in scope whose NAME contains `pattern` ignoring case (casefold), of TYPE `type_`."""
        needle = pattern.casefold()
        return [s for s in self.scope(package) if needle in s.folded and (type_ is None or s.type == type_)]

    def who_references(self, name: str, package: str | None = None) -> list[Reference]:
        """Symbols in scope with a parameter equal to `name` ignoring case (casefold), in symbol order."""
        refs = self._parameter_index().get(name.casefold(), ())
        if package is None:
            return [r for r in refs if not r.symbol.hidden]
        return [r for r in refs if r.symbol.package == package]

    def _parameter_index(self) -> dict[str, list[Reference]]:
        """Case-folded parameter name → its references, in symbol order."""
        if self._params is None:
            index: dict[str, list[Reference]] = {}
            for symbol in self.symbols:
                grouped: dict[str, list[str]] = {}
                for param, where in entry_parameters(symbol.entry):
                    grouped.setdefault(param.casefold(), []).append(where)
                for folded, places in grouped.items():
                    unique = tuple(dict.fromkeys(places)) if len(places) > 1 else (places[0],)
                    index.setdefault(folded, []).append(Reference.of(symbol, unique))
            self._params = index
        return self._params
