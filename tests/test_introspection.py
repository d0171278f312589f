"""apropos-search and who-references (DESIGN §2.4), over in-memory catalogs.

The seed property document (symbol-discovery-completeness) is translated test by
test; a hypothesis property compares both tools with brute-force enumeration of
random catalogs.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import mcp.types as types
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.catalog.model import (
    Catalog,
    clean_prompt,
    clean_resource,
    clean_resource_template,
    clean_tool,
    sorted_unique,
)
from aggregator.catalog.store import CatalogStore
from aggregator.catalog.symbols import (
    MAX_SCHEMA_DEPTH,
    TYPE_FILTERS,
    SymbolTable,
    classify_tool,
    schema_parameters,
)
from aggregator.faults import Fault
from aggregator.tools.base import OwnTool, ToolContext, text_result
from aggregator.tools.introspection import introspection_tools

# ---------------------------------------------------------------- fakes


class FakeSource:
    """An in-memory CatalogSource that records every call made to it.

    It also offers what a real upstream pool offers (call a tool, read a
    resource, get a prompt), so a test can prove introspection never uses them.
    """

    def __init__(
        self,
        upstreams: Mapping[str, Catalog],
        loaded: Iterable[str] = (),
        failing: Mapping[str, Fault] | None = None,
    ) -> None:
        self._store = CatalogStore()
        self.upstreams = dict(upstreams)
        self._failing = dict(failing or {})
        self.calls: list[tuple[str, str]] = []
        for name in loaded:
            self._store.put(self.upstreams[name])

    @property
    def store(self) -> CatalogStore:
        return self._store

    def upstream_names(self) -> list[str]:
        return sorted({*self.upstreams, *self._failing})

    def resolve(self, name: str) -> str | None:
        self.calls.append(("resolve", name))
        return next((n for n in self.upstream_names() if n.casefold() == name.casefold()), None)

    def metadata(self, name: str) -> tuple[str, list[str]]:
        return ("", [])

    def in_backoff(self, name: str) -> bool:
        return False

    async def ensure_catalog(self, name: str) -> Catalog:
        self.calls.append(("ensure_catalog", name))
        if name in self._failing:
            raise self._failing[name]
        catalog = self._store.get(name)
        if catalog is None:
            catalog = self.upstreams[name]
            self._store.put(catalog)
        return catalog

    async def call_tool(self, server: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("call_tool", f"{server}/{tool}"))
        return {"content": []}

    async def read_resource(self, server: str, uri: str) -> dict[str, Any]:
        self.calls.append(("read_resource", f"{server}/{uri}"))
        return {"contents": []}

    async def get_prompt(self, server: str, name: str, arguments: dict[str, str]) -> dict[str, Any]:
        self.calls.append(("get_prompt", f"{server}/{name}"))
        return {"messages": []}


async def _own_handler(arguments: Mapping[str, Any], ctx: ToolContext) -> types.CallToolResult:
    return text_result("own")


EXTRA_OWN = OwnTool(
    "map",
    "An own tool whose name collides with upstream tools in some tests.",
    {"type": "object", "properties": {"query": {"type": "string"}, "Limit": {"type": "integer"}}},
    _own_handler,
)


class Harness:
    """The two tools wired to a FakeSource, with `own_tools()` returning them plus EXTRA_OWN."""

    def __init__(self, source: FakeSource, extra: Sequence[OwnTool] = (EXTRA_OWN,)) -> None:
        self.source = source
        self.own: list[OwnTool] = []
        self.own.extend(introspection_tools(source, lambda: self.own))
        self.own.extend(extra)
        self.tools = {t.name: t for t in self.own}

    async def call(self, tool: str, **arguments: Any) -> types.CallToolResult:
        result = await self.tools[tool].handler(arguments, ToolContext())
        assert isinstance(result, types.CallToolResult)
        return result

    async def text(self, tool: str, **arguments: Any) -> str:
        result = await self.call(tool, **arguments)
        assert result.is_error is False
        block = result.content[0]
        assert isinstance(block, types.TextContent)
        return block.text

    def own_names(self) -> list[str]:
        return [t.name for t in self.own]


# ---------------------------------------------------------------- builders and parsers


def tool(server: str, name: str, props: Mapping[str, Any] | None = None, *, hidden: bool = False) -> Any:
    schema: dict[str, Any] = {"type": "object", "properties": dict(props or {})}
    return clean_tool(server, {"name": name, "description": f"{name} tool", "inputSchema": schema}, hidden=hidden)


def prompt(server: str, name: str, args: Sequence[str] = (), *, hidden: bool = False) -> Any:
    return clean_prompt(server, {"name": name, "arguments": [{"name": a} for a in args]}, hidden=hidden)


def resource(server: str, name: str, *, hidden: bool = False) -> Any:
    return clean_resource(server, {"name": name, "uri": f"res://{server}/{name}"}, hidden=hidden)


def template(server: str, name: str, variables: Sequence[str] = (), *, hidden: bool = False) -> Any:
    uri = f"res://{server}/" + "/".join(f"{{{v}}}" for v in variables)
    return clean_resource_template(server, {"name": name, "uriTemplate": uri}, hidden=hidden)


def catalog(server: str, tools: Sequence[Any] = (), prompts: Sequence[Any] = (), **kw: Sequence[Any]) -> Catalog:
    return Catalog(
        server=server,
        tools=sorted_unique(tools),
        prompts=sorted_unique(prompts),
        resources=sorted_unique(kw.get("resources", ())),
        resource_templates=sorted_unique(kw.get("templates", ())),
    )


LINE = re.compile(r"^  (?P<package>[^:]+)::(?P<name>.+) \[(?P<type>[A-Z-]+)\](?P<hidden> \(hidden\))?$")
Row = tuple[str, str, str, bool]


def parse_apropos(text: str) -> list[Row]:
    rows = []
    for line in text.split("\n"):
        match = LINE.match(line)
        if match:
            rows.append((match["package"], match["name"], match["type"], match["hidden"] is not None))
    header = re.match(r"Found (\d+) symbols? matching '", text)
    assert header is not None, text
    assert int(header[1]) == len(rows), text
    return rows


def parse_references(text: str) -> list[tuple[Row, list[str]]]:
    found: list[tuple[Row, list[str]]] = []
    for line in text.split("\n"):
        match = LINE.match(line)
        if match:
            row = (match["package"], match["name"], match["type"], match["hidden"] is not None)
            found.append((row, []))
        elif line.startswith("    at "):
            found[-1][1].append(line[len("    at ") :])
    return found


def order_key(row: Row) -> tuple[str, str, str, str, str]:
    package, name, type_, _ = row
    return (name.casefold(), package.casefold(), package, type_, name)


# ---------------------------------------------------------------- a small world

CL = catalog(
    "cl",
    tools=[
        tool("cl", "mapcar", {"function": {}, "list": {}}),
        tool("cl", "MapHash", {"function": {}, "table": {}}),
        tool("cl", "car", {"list": {}}),
        tool("cl", "discard", {"item": {}}),
        tool("cl", "carry-on", {}),
        tool("cl", "*print-base*", {}),
        tool("cl", "*standard-output*", {}),
        tool("cl", "1+", {"number": {}}),
        tool("cl", "+", {"numbers": {}}),
        tool("cl", "write_string", {"string": {}}),
        tool("cl", "internal-mapper", {}, hidden=True),
        tool("cl", "map", {"sequence": {}}),
    ],
    prompts=[prompt("cl", "defun", ["name", "Body"]), prompt("cl", "defmacro", ["name"])],
    resources=[resource("cl", "default-pathname"), resource("cl", "mapping-table", hidden=True)],
    templates=[template("cl", "defclass", ["name", "slot"])],
)
DISCOVERY = catalog(
    "test-discovery",
    tools=[
        tool("test-discovery", "foo-bar"),
        tool("test-discovery", "foo-baz"),
        tool("test-discovery", "quux"),
    ],
)
GIT = catalog(
    "git",
    tools=[
        tool("git", "git_log", {"repo": {"type": "string"}, "max_count": {"type": "integer"}}),
        tool("git", "git_status", {"repo_path": {"type": "string"}}),
        tool("git", "map", {"repository": {"type": "string"}}),
        tool("git", "git_reset", {"Repo": {"type": "string"}}, hidden=True),
    ],
    templates=[template("git", "commit", ["repo", "sha"])],
    prompts=[prompt("git", "review", ["REPO"])],
)
NOTES = catalog("notes", tools=[tool("notes", "mapcar")])


def world(loaded: Iterable[str] = ("cl", "test-discovery", "git")) -> Harness:
    upstreams = {c.server: c for c in (CL, DISCOVERY, GIT, NOTES)}
    failing = {"broken": Fault("upstream_unavailable", "spawn failed: no such command 'nope'")}
    return Harness(FakeSource(upstreams, loaded, failing))


async def apropos_rows(h: Harness, **arguments: Any) -> list[Row]:
    return parse_apropos(await h.text("apropos-search", **arguments))


def names(rows: Iterable[Row]) -> set[str]:
    return {row[1] for row in rows}


# ---------------------------------------------------------------- the seed's property tests, translated


async def test_small_package_completeness() -> None:
    rows = await apropos_rows(world(), pattern="foo", package="test-discovery")
    assert rows == [
        ("test-discovery", "foo-bar", "TOOL", False),
        ("test-discovery", "foo-baz", "TOOL", False),
    ]


@pytest.mark.parametrize("pattern", ["map", "MAP", "Map", "MaP"])
async def test_case_insensitivity(pattern: str) -> None:
    found = names(await apropos_rows(world(), pattern=pattern, package="CL"))
    assert {"mapcar", "MapHash", "map", "internal-mapper", "mapping-table"} <= found


async def test_type_filter_is_a_subset_of_the_unfiltered_result() -> None:
    h = world()
    everything = await apropos_rows(h, pattern="def", package="cl")
    macros = await apropos_rows(h, pattern="def", package="cl", type="macro")
    functions = await apropos_rows(h, pattern="def", package="cl", type="function")
    assert names(macros) == {"defun", "defmacro"}
    assert "defun" not in names(functions)
    assert set(macros) <= set(everything)
    assert set(functions) <= set(everything)
    whole = await apropos_rows(h, pattern="", package="cl")
    for type_name, label in TYPE_FILTERS.items():
        filtered = await apropos_rows(h, pattern="", package="cl", type=type_name)
        assert filtered == [r for r in whole if r[2] == label]


async def test_aliases_equal_the_new_type_names() -> None:
    h = world()
    for alias, name in [
        ("function", "tool"),
        ("macro", "prompt"),
        ("variable", "resource"),
        ("class", "resource-template"),
    ]:
        assert await h.text("apropos-search", pattern="", type=alias) == await h.text(
            "apropos-search", pattern="", type=name
        )
    assert await h.text("apropos-search", pattern="", type="PROMPT") == await h.text(
        "apropos-search", pattern="", type="prompt"
    )


async def test_package_scoping_shows_hidden_entries_only_when_scoped() -> None:
    h = world()
    unscoped = await apropos_rows(h, pattern="map")
    scoped = await apropos_rows(h, pattern="map", package="cl")
    assert "internal-mapper" not in names(unscoped)
    assert ("cl", "internal-mapper", "TOOL", True) in scoped
    assert ("cl", "mapping-table", "RESOURCE", True) in scoped
    assert all(not hidden for *_, hidden in unscoped)
    text = await h.text("apropos-search", pattern="internal", package="cl")
    assert text == "Found 1 symbol matching 'internal':\n\n  cl::internal-mapper [TOOL] (hidden)"


async def test_empty_pattern_matches_every_entry_of_the_package() -> None:
    rows = await apropos_rows(world(), pattern="", package="cl")
    expected = {t.name for t in CL.tools} | {p.name for p in CL.prompts}
    expected |= {r.name for r in CL.resources} | {t.name for t in CL.resource_templates}
    assert names(rows) == expected
    assert len(rows) == len(expected)


@pytest.mark.parametrize(
    ("pattern", "must", "must_not"),
    [
        ("*", {"*print-base*", "*standard-output*"}, {"mapcar"}),
        ("+", {"+", "1+"}, {"car"}),
        ("-", {"carry-on", "*print-base*", "internal-mapper", "default-pathname"}, {"write_string"}),
        ("_", {"write_string"}, {"carry-on"}),
    ],
)
async def test_special_character_patterns(pattern: str, must: set[str], must_not: set[str]) -> None:
    found = names(await apropos_rows(world(), pattern=pattern, package="cl"))
    assert must <= found
    assert not (must_not & found)


async def test_substring_anywhere_in_the_name() -> None:
    found = names(await apropos_rows(world(), pattern="car", package="cl"))
    assert {"car", "mapcar", "carry-on", "discard"} <= found  # whole, end, start, middle


async def test_no_duplicates_even_with_repeated_entries() -> None:
    dup = Catalog(server="dup", tools=(tool("dup", "twice"), tool("dup", "twice"), tool("dup", "Twice")))
    h = Harness(FakeSource({"dup": dup, "git": GIT}, loaded=["dup", "git"]))
    rows = await apropos_rows(h, pattern="", package="dup")
    assert rows == [("dup", "Twice", "TOOL", False), ("dup", "twice", "TOOL", False)]
    unscoped = await apropos_rows(h, pattern="")
    assert len(unscoped) == len(set(unscoped))


async def test_classification_equals_what_describe_reports() -> None:
    """A tool offered by two packages is GENERIC-FUNCTION everywhere; classify_tool agrees.

    catalog_describe_tool reports `classify_tool(name, store.loaded(), own names).upper()`.
    """
    h = world(loaded=("cl", "git", "notes"))
    rows = await apropos_rows(h, pattern="")
    rows += await apropos_rows(h, pattern="", package="git")
    loaded = h.source.store.loaded()
    for package, name, type_, _ in rows:
        if type_ in ("TOOL", "GENERIC-FUNCTION"):
            assert classify_tool(name, loaded, h.own_names()).upper() == type_, (package, name)
    # map: cl, git and the aggregator's own tool; mapcar: cl and notes; git_reset is hidden yet counts once
    generic = {(p, n) for p, n, t, _ in rows if t == "GENERIC-FUNCTION"}
    assert generic == {
        ("aggregator", "map"),
        ("cl", "map"),
        ("git", "map"),
        ("cl", "mapcar"),
        ("notes", "mapcar"),
    }
    assert ("git", "git_reset", "TOOL", True) in rows
    functions = await apropos_rows(h, pattern="map", type="tool")
    assert "map" not in names(functions) and "mapcar" not in names(functions)


def test_classify_tool_counts_hidden_tools_and_the_aggregator() -> None:
    a = catalog("a", tools=[tool("a", "x"), tool("a", "y", hidden=True)])
    b = catalog("b", tools=[tool("b", "y"), tool("b", "X")])
    assert classify_tool("x", {"a": a, "b": b}) == "tool"  # names are case-sensitive
    assert classify_tool("y", {"a": a, "b": b}) == "generic-function"
    assert classify_tool("x", {"a": a}, ["x"]) == "generic-function"
    assert classify_tool("y", {"a": a}, []) == "tool"


# ---------------------------------------------------------------- apropos output, scope, messages


async def test_exact_output_order_and_unloaded_footer() -> None:
    h = world(loaded=("git", "notes"))
    text = await h.text("apropos-search", pattern="MAP")
    assert text == (
        "Found 3 symbols matching 'MAP':\n"
        "\n"
        "  aggregator::map [GENERIC-FUNCTION]\n"
        "  git::map [GENERIC-FUNCTION]\n"
        "  notes::mapcar [TOOL]\n"
        "\n"
        "Not searched (catalog not loaded): broken, cl, test-discovery. "
        "Pass package=NAME to load and search one."
    )


async def test_order_is_case_folded_name_then_package_then_type() -> None:
    a = catalog("a", tools=[tool("a", "Beta"), tool("a", "alpha")], prompts=[prompt("a", "alpha")])
    b = catalog("B", tools=[tool("B", "ALPHA"), tool("B", "beta")])
    h = Harness(FakeSource({"a": a, "B": b}, loaded=["a", "B"]), extra=())
    rows = await apropos_rows(h, pattern="")
    assert [(p, n, t) for p, n, t, _ in rows] == [
        ("a", "alpha", "PROMPT"),
        ("a", "alpha", "TOOL"),
        ("B", "ALPHA", "TOOL"),
        ("aggregator", "apropos-search", "TOOL"),
        ("a", "Beta", "TOOL"),
        ("B", "beta", "TOOL"),
        ("aggregator", "who-references", "TOOL"),
    ]


async def test_no_results_and_singular() -> None:
    h = world(loaded=("cl", "test-discovery", "git", "notes"))
    assert await h.text("apropos-search", pattern="xyznonexistent") == (
        "Found 0 symbols matching 'xyznonexistent':\n\nNot searched (catalog not loaded): broken. "
        "Pass package=NAME to load and search one."
    )
    assert await h.text("apropos-search", pattern="quux") == (
        "Found 1 symbol matching 'quux':\n\n  test-discovery::quux [TOOL]\n\n"
        "Not searched (catalog not loaded): broken. Pass package=NAME to load and search one."
    )
    full = Harness(FakeSource({"git": GIT}, loaded=["git"]))
    assert await full.text("apropos-search", pattern="zzz") == "Found 0 symbols matching 'zzz':\n"


async def test_package_not_found_and_invalid_type_are_informational() -> None:
    h = world()
    for tool_name, args in [("apropos-search", {"pattern": "foo"}), ("who-references", {"name": "repo"})]:
        result = await h.call(tool_name, package="NONEXISTENT", **args)
        assert result.is_error is False
        assert result.content[0].text == "Package NONEXISTENT not found"  # type: ignore[union-attr]
    assert await h.text("apropos-search", pattern="x", type="symbol") == (
        "Invalid type: symbol. Valid types: tool, prompt, resource, resource-template, generic-function, "
        "function, macro, variable, class"
    )


async def test_scoped_search_loads_the_package_once_and_then_sees_it_unscoped() -> None:
    h = world(loaded=())
    assert "notes::mapcar" not in await h.text("apropos-search", pattern="mapcar")
    rows = await apropos_rows(h, pattern="mapcar", package="NOTES")
    assert rows == [("notes", "mapcar", "TOOL", False)]
    await h.text("apropos-search", pattern="mapcar", package="notes")
    assert [c for c in h.source.calls if c[0] == "ensure_catalog"] == [("ensure_catalog", "notes")]
    assert "notes::mapcar [TOOL]" in await h.text("apropos-search", pattern="mapcar")


async def test_a_package_that_cannot_load_says_why() -> None:
    h = world()
    for tool_name, args in [("apropos-search", {"pattern": "x"}), ("who-references", {"name": "x"})]:
        assert await h.text(tool_name, package="Broken", **args) == (
            "Package Broken could not be loaded: spawn failed: no such command 'nope' (upstream_unavailable)"
        )


async def test_aggregator_is_a_package_in_any_case() -> None:
    h = world()
    rows = await apropos_rows(h, pattern="", package="AGGREGATOR")
    assert rows == [
        ("aggregator", "apropos-search", "TOOL", False),
        ("aggregator", "map", "GENERIC-FUNCTION", False),
        ("aggregator", "who-references", "TOOL", False),
    ]
    assert ("aggregator", "apropos-search", "TOOL", False) in await apropos_rows(h, pattern="apropos")


async def test_empty_optional_arguments_mean_absent() -> None:
    h = world()
    assert await h.text("apropos-search", pattern="foo", package="", type="") == await h.text(
        "apropos-search", pattern="foo"
    )


@pytest.mark.parametrize(
    ("tool_name", "arguments", "message"),
    [
        ("apropos-search", {}, "Invalid arguments: 'pattern' is required"),
        ("apropos-search", {"pattern": 3}, "Invalid arguments: 'pattern' must be a string, not int"),
        (
            "apropos-search",
            {"pattern": "a", "package": ["x"]},
            "Invalid arguments: 'package' must be a string",
        ),
        ("apropos-search", {"pattern": "a", "type": 1}, "Invalid arguments: 'type' must be a string"),
        ("who-references", {"name": None}, "Invalid arguments: 'name' is required"),
        ("who-references", {"name": {"a": 1}}, "Invalid arguments: 'name' must be a string, not dict"),
    ],
)
async def test_malformed_calls_are_errors(tool_name: str, arguments: dict[str, Any], message: str) -> None:
    h = world()
    result = await h.call(tool_name, **arguments)
    assert result.is_error is True
    assert result.content[0].text.startswith(message)  # type: ignore[union-attr]


async def test_a_changed_catalog_is_seen_at_once() -> None:
    h = world(loaded=("git",))
    assert "git::git_fetch" not in await h.text("apropos-search", pattern="git_")
    h.source.store.put(catalog("git", tools=[*GIT.tools, tool("git", "git_fetch", {"remote": {}})]))
    assert "  git::git_fetch [TOOL]" in (await h.text("apropos-search", pattern="git_")).split("\n")
    assert "  git::git_fetch [TOOL]" in (await h.text("who-references", name="remote")).split("\n")
    h.source.store.drop("git")
    assert (await h.text("who-references", name="remote")).startswith(
        "No references found for remote\n\nNot searched (catalog not loaded): broken, cl, git, notes,"
    )


async def test_tool_definitions_follow_the_seeds() -> None:
    h = world()
    apropos, who = h.tools["apropos-search"], h.tools["who-references"]
    assert apropos.input_schema["required"] == ["pattern"]
    assert apropos.input_schema["properties"]["type"]["enum"] == list(TYPE_FILTERS)
    assert set(apropos.input_schema["properties"]) == {"pattern", "package", "type"}
    assert who.input_schema["required"] == ["name"]
    assert set(who.input_schema["properties"]) == {"name", "package"}
    for t in (apropos, who):
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", t.name)
        assert t.annotations == {"readOnlyHint": True, "openWorldHint": False}
        clean_tool("aggregator", t.to_wire())


async def test_read_only_nothing_is_called_read_or_got() -> None:
    h = world(loaded=("cl",))
    await h.text("apropos-search", pattern="")
    await h.text("apropos-search", pattern="map", package="git", type="tool")
    await h.text("apropos-search", pattern="", package="notes")
    await h.text("who-references", name="repo")
    await h.text("who-references", name="repo", package="test-discovery")
    await h.call("apropos-search", pattern="x", package="broken")
    used = {kind for kind, _ in h.source.calls}
    assert used == {"resolve", "ensure_catalog"}
    assert {c for c in h.source.calls if c[0] == "ensure_catalog"} == {
        ("ensure_catalog", n) for n in ("git", "notes", "test-discovery", "broken")
    }


# ---------------------------------------------------------------- who-references


async def test_who_references_exact_output() -> None:
    h = world(loaded=("git",))
    assert await h.text("who-references", name="REPO") == (
        "Code that references REPO:\n"
        "\n"
        "  git::commit [RESOURCE-TEMPLATE]\n"
        "    at uriTemplate {repo}\n"
        "  git::git_log [TOOL]\n"
        "    at properties.repo\n"
        "  git::review [PROMPT]\n"
        "    at arguments.REPO\n"
        "\n"
        "Not searched (catalog not loaded): broken, cl, notes, test-discovery. "
        "Pass package=NAME to load and search one."
    )
    scoped = await h.text("who-references", name="repo", package="git")
    assert "  git::git_reset [TOOL] (hidden)\n    at properties.Repo" in scoped
    assert "repo_path" not in scoped and "repository" not in scoped  # exact, not substring
    assert await h.text("who-references", name="rep", package="git") == "No references found for rep"


def test_schema_walk_paths() -> None:
    schema = {
        "type": "object",
        "properties": {
            "repo": {"type": "string"},
            "a": {"type": "array", "items": {"type": "object", "properties": {"b": {}}}},
            "t": {
                "type": "array",
                "items": [{"properties": {"first": {}}}],
                "prefixItems": [{"properties": {"p": {}}}],
            },
            "a.b": {"type": "object", "additionalProperties": {"properties": {"deep": {}}}},
        },
        "$defs": {"X": {"properties": {"y": {}}}},
        "definitions": {"Old": {"properties": {"legacy": {}}}},
        "anyOf": [{"properties": {"z": {}}}],
        "oneOf": [{}, {"properties": {"o": {}}}],
        "allOf": [{"not": {"properties": {"n": {}}}}],
        "if": {"properties": {"cond": {}}},
        "patternProperties": {"^x-": {"properties": {"px": {}}}},
    }
    assert schema_parameters(schema) == [
        ("a", "properties.a"),
        ("b", "properties.a.items.properties.b"),
        ("a.b", 'properties["a.b"]'),
        ("deep", 'properties["a.b"].additionalProperties.properties.deep'),
        ("repo", "properties.repo"),
        ("t", "properties.t"),
        ("p", "properties.t.prefixItems[0].properties.p"),
        ("first", "properties.t.items[0].properties.first"),
        ("px", 'patternProperties["^x-"].properties.px'),
        ("z", "anyOf[0].properties.z"),
        ("o", "oneOf[1].properties.o"),
        ("n", "allOf[0].not.properties.n"),
        ("cond", "if.properties.cond"),
        ("y", "$defs.X.properties.y"),
        ("legacy", "definitions.Old.properties.legacy"),
    ]


def test_schema_walk_survives_cycles_and_depth() -> None:
    cyclic: dict[str, Any] = {"type": "object", "properties": {"self": {}}}
    cyclic["properties"]["self"] = cyclic
    assert schema_parameters(cyclic) == [("self", "properties.self")]
    deep: dict[str, Any] = {"properties": {"leaf": {}}}
    for _ in range(5 * MAX_SCHEMA_DEPTH):
        deep = {"items": deep}
    assert schema_parameters(deep) == []  # beyond the depth limit: stopped, not crashed
    shallow: dict[str, Any] = {"properties": {"leaf": {}}}
    for _ in range(MAX_SCHEMA_DEPTH - 1):
        shallow = {"items": shallow}
    assert [name for name, _ in schema_parameters(shallow)] == ["leaf"]


async def test_who_references_through_a_cyclic_schema_tool() -> None:
    cyclic: dict[str, Any] = {"type": "object", "properties": {"node": {}}}
    cyclic["properties"]["node"] = {"type": "object", "properties": {"next": cyclic}}
    looped = Catalog(server="loop", tools=(clean_tool("loop", {"name": "walk", "inputSchema": cyclic}),))
    h = Harness(FakeSource({"loop": looped}, loaded=["loop"]))
    text = await h.text("who-references", name="next")
    assert text == "Code that references next:\n\n  loop::walk [TOOL]\n    at properties.node.properties.next"


async def test_who_references_own_tools() -> None:
    h = world(loaded=())
    text = await h.text("who-references", name="limit", package="aggregator")
    assert text == "Code that references limit:\n\n  aggregator::map [TOOL]\n    at properties.Limit"
    text = await h.text("who-references", name="pattern", package="aggregator")
    assert "  aggregator::apropos-search [TOOL]\n    at properties.pattern" in text


def test_symbol_table_scopes() -> None:
    table = SymbolTable({"git": GIT}, [])
    assert all(not s.hidden for s in table.scope(None))
    assert {s.name for s in table.scope("git")} == {
        "git_log",
        "git_status",
        "map",
        "git_reset",
        "commit",
        "review",
    }
    assert table.scope("nope") == ()


# ---------------------------------------------------------------- completeness: brute force, random catalogs

FRAGMENTS = ["a", "A", "b", "map", "Map", "*", "+", "-", "_", "x"]
NAMES = ["map", "Map", "mapcar", "*print*", "1+", "+", "a-b", "a_b", "x", "MAP-x"]  # collide across packages
PARAMS = ["repo", "Repo", "REPO", "a", "id", "a.b"]
VARS = ["repo", "Repo", "id", "sha"]
PACKAGES = ["alpha", "Beta", "gamma"]

entry_names = st.one_of(
    st.sampled_from(NAMES), st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=3).map("".join)
)


def _schemas() -> st.SearchStrategy[dict[str, Any]]:
    """Input schemas nesting objects through properties, items, anyOf/oneOf/allOf and $defs."""
    leaf = st.sampled_from([{"type": "string"}, {}])

    def extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        obj = st.dictionaries(st.sampled_from(PARAMS), children, min_size=1, max_size=3).map(
            lambda d: {"type": "object", "properties": d}
        )
        members = st.lists(obj, min_size=1, max_size=2)
        combos = st.tuples(st.sampled_from(["anyOf", "oneOf", "allOf"]), members)
        defs = st.dictionaries(st.sampled_from(["X", "Y"]), obj, min_size=1, max_size=2)
        return st.one_of(
            obj,
            obj.map(lambda o: {"type": "array", "items": o}),
            combos.map(lambda kv: {kv[0]: kv[1]}),
            defs.map(lambda d: {"$defs": d}),
        )

    nested = st.recursive(leaf, extend, max_leaves=6)
    return st.dictionaries(st.sampled_from(PARAMS), nested, max_size=3).map(
        lambda d: {"type": "object", "properties": d}
    )


@st.composite
def catalogs(draw: st.DrawFn, server: str) -> Catalog:
    hidden = st.booleans()
    tools = [
        clean_tool(server, {"name": n, "inputSchema": s}, hidden=draw(hidden))
        for n, s in draw(st.lists(st.tuples(entry_names, _schemas()), min_size=1, max_size=4))
    ]
    prompts = [
        clean_prompt(server, {"name": n, "arguments": [{"name": a} for a in args]}, hidden=draw(hidden))
        for n, args in draw(st.lists(st.tuples(entry_names, st.lists(st.sampled_from(PARAMS), max_size=3)), max_size=3))
    ]
    resources = [resource(server, n, hidden=draw(hidden)) for n in draw(st.lists(entry_names, max_size=3))]
    templates = [
        template(server, n, list(dict.fromkeys(vs)), hidden=draw(hidden))
        for n, vs in draw(st.lists(st.tuples(entry_names, st.lists(st.sampled_from(VARS), max_size=3)), max_size=3))
    ]
    return catalog(server, tools, prompts, resources=resources, templates=templates)


@st.composite
def worlds(draw: st.DrawFn) -> tuple[Harness, list[str]]:
    servers = draw(st.lists(st.sampled_from(PACKAGES), min_size=2, max_size=3, unique=True))
    upstreams = {s: draw(catalogs(s)) for s in servers}
    loaded = [s for s in servers if draw(st.sampled_from([True, True, True, False]))]
    own_extra = draw(st.sampled_from([(), (EXTRA_OWN,)]))
    return Harness(FakeSource(upstreams, loaded), extra=own_extra), servers


def brute_packages(h: Harness, *, everything: bool = False) -> dict[str, list[tuple[str, str, bool, Any]]]:
    """Every package's entries as (name, kind, hidden, entry), straight from the loaded catalogs (or all)."""
    packages: dict[str, list[tuple[str, str, bool, Any]]] = {}
    catalogs = h.source.upstreams if everything else h.source.store.loaded()
    for server, cat in catalogs.items():
        rows: list[tuple[str, str, bool, Any]] = [(t.name, "tool", t.hidden, t) for t in cat.tools]
        rows += [(p.name, "PROMPT", p.hidden, p) for p in cat.prompts]
        rows += [(r.name, "RESOURCE", r.hidden, r) for r in cat.resources]
        rows += [(t.name, "RESOURCE-TEMPLATE", t.hidden, t) for t in cat.resource_templates]
        packages[server] = rows
    own = [clean_tool("aggregator", t.to_wire()) for t in h.own]
    packages["aggregator"] = [(t.name, "tool", False, t) for t in own]
    return packages


def brute_type(name: str, kind: str, packages: Mapping[str, list[tuple[str, str, bool, Any]]]) -> str:
    if kind != "tool":
        return kind
    offering = [p for p, rows in packages.items() if any(n == name and k == "tool" for n, k, _, _ in rows)]
    return "GENERIC-FUNCTION" if len(offering) >= 2 else "TOOL"


def in_scope(package: str | None, pkg: str, hidden: bool) -> bool:
    return (package is None and not hidden) or (package is not None and pkg.casefold() == package.casefold())


def brute_apropos(h: Harness, pattern: str, package: str | None, type_: str | None) -> set[Row]:
    packages = brute_packages(h)
    expected = set()
    for pkg, rows in packages.items():
        for name, kind, hidden, _ in rows:
            label = brute_type(name, kind, packages)
            if not in_scope(package, pkg, hidden) or pattern.casefold() not in name.casefold():
                continue
            if type_ is None or TYPE_FILTERS[type_] == label:
                expected.add((pkg, name, label, hidden))
    return expected


def brute_schema(node: Any, path: str) -> Iterable[tuple[str, str]]:
    if not isinstance(node, dict):
        return
    for key, child in node.get("properties", {}).items():
        where = f"{path}properties" + (f".{key}" if re.fullmatch(r"[A-Za-z0-9_$@-]+", key) else f'["{key}"]')
        yield key, where
        yield from brute_schema(child, where + ".")
    yield from brute_schema(node.get("items"), f"{path}items.")
    for key, child in node.get("$defs", {}).items():
        yield from brute_schema(child, f"{path}$defs.{key}.")
    for keyword in ("anyOf", "oneOf", "allOf"):
        for i, child in enumerate(node.get(keyword, [])):
            yield from brute_schema(child, f"{path}{keyword}[{i}].")


def brute_params(entry: Any) -> Iterable[tuple[str, str]]:
    if hasattr(entry, "input_schema"):
        return brute_schema(entry.input_schema, "")
    if hasattr(entry, "arguments"):
        return [
            (a.name, "arguments" + (f".{a.name}" if "." not in a.name else f'["{a.name}"]')) for a in entry.arguments
        ]
    if hasattr(entry, "uri_template"):
        return [(v, f"uriTemplate {{{v}}}") for v in re.findall(r"\{(\w+)\}", entry.uri_template)]
    return []


def brute_references(h: Harness, name: str, package: str | None) -> dict[Row, set[str]]:
    packages = brute_packages(h)
    expected: dict[Row, set[str]] = {}
    for pkg, rows in packages.items():
        for entry_name, kind, hidden, entry in rows:
            where = {w for p, w in brute_params(entry) if p.casefold() == name.casefold()}
            if where and in_scope(package, pkg, hidden):
                expected[(pkg, entry_name, brute_type(entry_name, kind, packages), hidden)] = where
    return expected


def scopes(servers: list[str]) -> st.SearchStrategy[str | None]:
    names_ = [*servers, "aggregator", "AGGREGATOR", *(s.upper() for s in servers)]
    return st.one_of(st.none(), st.sampled_from(names_))


def patterns(h: Harness) -> st.SearchStrategy[str]:
    """A piece of some entry's name, in a random case: patterns that hit, with case differences."""
    names_ = sorted(row[0] for rows in brute_packages(h, everything=True).values() for row in rows)

    def piece(name: str) -> st.SearchStrategy[str]:
        bounds = st.tuples(st.integers(0, len(name)), st.integers(0, len(name))).map(sorted)
        return bounds.map(lambda ij: name[ij[0] : ij[1]])

    def cased(p: str) -> st.SearchStrategy[str]:
        return st.sampled_from([p, p.upper(), p.lower(), p.swapcase()])

    return st.sampled_from(names_).flatmap(piece).flatmap(cased)


PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(data=st.data(), setup=worlds())
def test_apropos_equals_brute_force(data: st.DataObject, setup: tuple[Harness, list[str]]) -> None:
    h, servers = setup
    pattern = data.draw(st.one_of(patterns(h), st.sampled_from(["", *FRAGMENTS]), st.text(max_size=2)))
    package = data.draw(scopes(servers))
    type_ = data.draw(st.one_of(st.none(), st.sampled_from(list(TYPE_FILTERS))))
    arguments: dict[str, Any] = {"pattern": pattern}
    if package is not None:
        arguments["package"] = package
    if type_ is not None:
        arguments["type"] = type_
    rows = parse_apropos(asyncio.run(h.text("apropos-search", **arguments)))
    expected = brute_apropos(h, pattern, package, type_)
    assert set(rows) == expected  # no false negatives, no false positives
    assert len(rows) == len(expected)  # no duplicates
    assert rows == sorted(rows, key=order_key)
    loaded = h.source.store.loaded()
    for _, name, label, _ in rows:
        if label in ("TOOL", "GENERIC-FUNCTION"):
            assert classify_tool(name, loaded, h.own_names()).upper() == label
    assert {kind for kind, _ in h.source.calls} <= {"resolve", "ensure_catalog"}


@PROPERTY
@given(data=st.data(), setup=worlds())
def test_who_references_equals_brute_force(data: st.DataObject, setup: tuple[Harness, list[str]]) -> None:
    h, servers = setup
    name = data.draw(st.sampled_from([*PARAMS, *VARS, "REPO", "Id", "nothing", "re"]))
    package = data.draw(scopes(servers))
    arguments: dict[str, Any] = {"name": name} if package is None else {"name": name, "package": package}
    text = asyncio.run(h.text("who-references", **arguments))
    found = parse_references(text)
    expected = brute_references(h, name, package)
    assert {row: set(where) for row, where in found} == expected
    assert len(found) == len(expected)
    assert all(len(where) == len(set(where)) for _, where in found)
    assert [row for row, _ in found] == sorted((row for row, _ in found), key=order_key)
    if not expected:
        assert text.startswith(f"No references found for {name}")
    assert {kind for kind, _ in h.source.calls} <= {"resolve", "ensure_catalog"}
