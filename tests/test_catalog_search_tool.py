"""The catalog_search_tools tool: validation, load semantics, result shape, byte cap (DESIGN §2.2)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import anyio
import mcp.types as types
import pytest

from aggregator.catalog.caps import json_size
from aggregator.catalog.model import Catalog
from aggregator.catalog.search import ToolSearchIndex
from aggregator.catalog.store import CatalogStore
from aggregator.faults import Fault
from aggregator.tools.base import ToolContext
from aggregator.tools.catalog_search import format_results_table, search_tool, search_tools
from tests.conftest import CATALOG_FILES, real_catalog

METADATA = {
    "git": ("Git repository operations", ["git", "commits", "diff", "branches"]),
    "weather": ("Weather forecasts and severe weather alerts", ["forecast"]),
    "time": ("Current time and time-zone conversion", []),
}
MAX_BYTES = 262_144


class MemorySource:
    """An in-memory CatalogSource: real catalogs, put in the store when an upstream is 'started'.

    `weather` always fails to start; names in `backoff` are inside their backoff window.
    `concurrent` makes every start wait until that many starts are in flight at once.
    """

    def __init__(self, *, backoff: Iterable[str] = (), concurrent: int = 0) -> None:
        self.catalogs = {server: real_catalog(server) for server in CATALOG_FILES}
        self.failing = {"weather": "spawn failed: weather-mcp: command not found"}
        self.backoff = set(backoff)
        self.starts: Counter[str] = Counter()
        self._store = CatalogStore()
        self._concurrent = concurrent
        self._in_flight = 0
        self.max_in_flight = 0
        self._all_in = anyio.Event()

    @property
    def store(self) -> CatalogStore:
        return self._store

    def upstream_names(self) -> list[str]:
        return sorted({*self.catalogs, *self.failing})

    def resolve(self, name: str) -> str | None:
        return next((n for n in self.upstream_names() if n.lower() == name.lower()), None)

    def metadata(self, name: str) -> tuple[str, list[str]]:
        description, caps = METADATA.get(name, ("", []))
        return description, list(caps)

    def in_backoff(self, name: str) -> bool:
        return name in self.backoff

    async def ensure_catalog(self, name: str) -> Catalog:
        loaded = self._store.get(name)
        if loaded is not None:
            return loaded
        self.starts[name] += 1
        self._in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            if self._concurrent:
                if self._in_flight >= self._concurrent:
                    self._all_in.set()
                with anyio.fail_after(5):
                    await self._all_in.wait()
            await anyio.sleep(0)
            if name in self.failing:
                raise Fault("upstream_unavailable", self.failing[name])
            self._store.put(self.catalogs[name])
            return self.catalogs[name]
        finally:
            self._in_flight -= 1

    def load(self, *names: str) -> None:
        for name in names:
            self._store.put(self.catalogs[name])


def make(source: MemorySource | None = None) -> tuple[MemorySource, ToolSearchIndex]:
    """A source and an index wired as the server wires them."""
    source = source or MemorySource()
    index = ToolSearchIndex()
    for name in source.upstream_names():
        index.set_server_metadata(name, *source.metadata(name))
    index.attach(source.store)
    return source, index


async def call(
    source: MemorySource, index: ToolSearchIndex, max_bytes: int = MAX_BYTES, **arguments: Any
) -> types.CallToolResult:
    return await search_tools(source, index, arguments, max_bytes)


def payload_of(result: types.CallToolResult) -> dict[str, Any]:
    assert result.structured_content is not None
    text = result.content[0]
    assert isinstance(text, types.TextContent)
    assert json.loads(text.text) == result.structured_content  # the same JSON as one text block
    return result.structured_content


def error_of(result: types.CallToolResult) -> dict[str, Any]:
    """The fault of an error result: a one-line message as text, the taxonomy in structuredContent."""
    assert result.is_error is True
    assert result.structured_content is not None
    error = result.structured_content["error"]
    text = result.content[0]
    assert isinstance(text, types.TextContent)
    assert text.text == f"{error['reason']}: {error['message']}" and "\n" not in text.text
    return error


def pairs(payload: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    return [(r["server"], r["tool"]) for r in payload["results"]]


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"query": ""},
        {"query": "   \t\n"},
        {"query": 42},
        {"query": ["git"]},
        {"query": "git", "limit": 0},
        {"query": "git", "limit": 51},
        {"query": "git", "limit": -3},
        {"query": "git", "limit": "5"},
        {"query": "git", "limit": 2.5},
        {"query": "git", "limit": True},
        {"query": "git", "load": "true"},
        {"query": "git", "load": 1},
        {"query": "git", "load": "yes"},
    ],
)
async def test_invalid_arguments_are_programmer_faults(arguments: dict[str, Any]) -> None:
    source, index = make()
    error = error_of(await search_tools(source, index, arguments, MAX_BYTES))
    assert (error["kind"], error["reason"]) == ("programmer", "invalid_argument")
    assert error["message"]
    assert sum(source.starts.values()) == 0


async def test_limit_bounds_and_defaults_are_accepted() -> None:
    source, index = make()
    source.load(*CATALOG_FILES)
    for limit in (1, 50):
        payload = payload_of(await call(source, index, query="file", limit=limit))
        assert 1 <= len(payload["results"]) <= limit
    default = payload_of(await call(source, index, query="file", limit=None, load=None))
    assert len(default["results"]) == 8


# ---------------------------------------------------------------- ranking through the tool


async def test_deterministic_ordering() -> None:
    first_source, first_index = make()
    first_source.load(*CATALOG_FILES)
    other_source, other_index = make()
    other_source.load(*reversed(list(CATALOG_FILES)))
    results = [
        payload_of(await call(source, index, query="read the contents of a file", limit=20))
        for source, index in [(first_source, first_index), (first_source, first_index), (other_source, other_index)]
    ]
    assert results[0] == results[1] == results[2]


async def test_exact_above_prefix_above_substring() -> None:
    source, index = make()
    source.load(*CATALOG_FILES)
    found = pairs(payload_of(await call(source, index, query="search", limit=10)))
    exact = {("filesystem", "search_files"), ("memory", "search_nodes")}
    assert set(found[:2]) == exact
    assert ("everything", "simulate-research-query") in found[2:]  # "research" contains "search"
    timed = pairs(payload_of(await call(source, index, query="time", limit=10)))
    assert set(timed[:2]) == {("time", "convert_time"), ("time", "get_current_time")}  # exact "time"
    assert ("git", "git_log") in timed[2:]  # only "timestamp" (prefix) in its argument names


async def test_tool_name_match_above_description_only_match() -> None:
    source, index = make()
    source.load(*CATALOG_FILES)
    found = pairs(payload_of(await call(source, index, query="commit")))
    assert found[0] == ("git", "git_commit")
    assert ("git", "git_diff_staged") in found[1:]  # "staged for commit" in its description only


async def test_results_from_several_servers() -> None:
    source, index = make()
    source.load(*CATALOG_FILES)
    payload = payload_of(await call(source, index, query="read", limit=20))
    servers = {r["server"] for r in payload["results"]}
    assert {"filesystem", "memory", "sqlite"} <= servers


async def test_tool_level_result_shape() -> None:
    source, index = make()
    source.load(*CATALOG_FILES)
    payload = payload_of(await call(source, index, query="convert time zones"))
    assert payload["truncated"] is False
    assert "failed" not in payload
    top = payload["results"][0]
    assert set(top) == {"server", "tool", "title", "summary", "arg_keys", "score", "catalog_loaded"}
    assert (top["server"], top["tool"], top["catalog_loaded"]) == ("time", "convert_time", True)
    assert top["summary"] == "Convert time between timezones"
    assert top["arg_keys"] == ["source_timezone", "target_timezone", "time"]
    assert top["score"] == round(top["score"], 4) > 0
    scores = [r["score"] for r in payload["results"]]
    assert scores == sorted(scores, reverse=True)


async def test_no_match_returns_empty_results() -> None:
    source, index = make()
    source.load(*CATALOG_FILES)
    result = await call(source, index, query="qqzzxx")
    assert result.is_error is False
    assert payload_of(result) == {"results": [], "truncated": False}


# ---------------------------------------------------------------- load semantics


async def test_load_false_gives_server_level_results_for_unloaded_upstreams() -> None:
    source, index = make()
    payload = payload_of(await call(source, index, query="git commits"))
    assert sum(source.starts.values()) == 0  # nothing started
    assert payload["results"][0] == {
        "server": "git",
        "tool": None,
        "summary": "Git repository operations",
        "score": payload["results"][0]["score"],
        "catalog_loaded": False,
        "next": 'catalog_list_tools(server="git")',
    }
    forecast = payload_of(await call(source, index, query="weather forecast"))
    assert pairs(forecast) == [("weather", None)]


async def test_load_false_mixes_loaded_tools_and_unloaded_servers() -> None:
    source, index = make()
    source.load("time", "filesystem")
    payload = payload_of(await call(source, index, query="git diff or time", limit=20))
    found = pairs(payload)
    assert ("git", None) in found
    assert ("time", "convert_time") in found
    assert not any(server == "git" and tool is not None for server, tool in found)
    for item in payload["results"]:
        assert item["catalog_loaded"] is (item["tool"] is not None)
    assert sum(source.starts.values()) == 0


async def test_load_true_starts_candidates_concurrently_once_and_reports_failures() -> None:
    unloaded = [name for name in MemorySource().upstream_names() if name not in ("time", "filesystem")]
    source, index = make(MemorySource(concurrent=len(unloaded)))
    source.load("time", "filesystem")
    result = await call(source, index, query="git diff", load=True)
    assert result.is_error is False  # one upstream failing does not fail the search
    payload = payload_of(result)
    assert source.starts == Counter(unloaded)  # each once, loaded ones not restarted
    assert source.max_in_flight == len(unloaded)  # all at the same time
    assert pairs(payload)[0] == ("git", "git_diff")
    assert all(item["catalog_loaded"] is True for item in payload["results"])
    assert payload["failed"] == [
        {
            "server": "weather",
            "reason": "upstream_unavailable",
            "message": "spawn failed: weather-mcp: command not found",
        }
    ]
    again = payload_of(await call(source, index, query="git diff", load=True))
    assert source.starts["git"] == 1  # loaded: not started again
    assert source.starts["weather"] == 2  # still unloaded: tried again on the next call
    assert again["results"] == payload["results"]


async def test_load_true_skips_upstreams_in_backoff() -> None:
    source, index = make(MemorySource(backoff=["git"]))
    payload = payload_of(await call(source, index, query="git commit", load=True))
    assert "git" not in source.starts
    assert [f["server"] for f in payload["failed"]] == ["git", "weather"]
    assert payload["failed"][0]["reason"] == "upstream_unavailable"
    assert "backoff" in payload["failed"][0]["message"]
    assert not any(server == "git" for server, _ in pairs(payload))


async def test_load_true_returns_tools_of_newly_loaded_catalogs() -> None:
    source, index = make()
    before = payload_of(await call(source, index, query="knowledge graph entities"))
    assert all(item["tool"] is None for item in before["results"])
    after = payload_of(await call(source, index, query="knowledge graph entities", load=True))
    assert after["results"][0]["server"] == "memory"
    assert after["results"][0]["tool"] is not None


# ---------------------------------------------------------------- byte cap


async def test_truncation_keeps_the_largest_prefix_that_fits() -> None:
    source, index = make()
    source.load(*CATALOG_FILES)
    full = payload_of(await call(source, index, query="file directory", limit=30))
    assert full["truncated"] is False
    cap = json_size(full) // 2
    capped = payload_of(await call(source, index, max_bytes=cap, query="file directory", limit=30))
    assert capped["truncated"] is True
    kept = capped["results"]
    assert 0 < len(kept) < len(full["results"])
    assert kept == full["results"][: len(kept)]
    assert json_size(capped) <= cap
    one_more = {"results": full["results"][: len(kept) + 1], "truncated": True}
    assert json_size(one_more) > cap


async def test_a_single_result_that_cannot_fit_is_result_too_large() -> None:
    source, index = make()
    source.load(*CATALOG_FILES)
    error = error_of(await call(source, index, max_bytes=60, query="file"))
    assert (error["kind"], error["reason"]) == ("world", "result_too_large")


# ---------------------------------------------------------------- the OwnTool and the CLI table


async def test_search_tool_record() -> None:
    source, index = make()
    source.load("git")
    tool = search_tool(source, index, MAX_BYTES)
    assert tool.name == "catalog_search_tools"
    schema = tool.input_schema
    assert schema["required"] == ["query"]
    assert schema["properties"]["limit"]["maximum"] == 50
    assert schema["properties"]["load"]["type"] == "boolean"
    assert "catalog_call_tool" in tool.description
    result = await tool.handler({"query": "commit"}, ToolContext())
    assert isinstance(result, types.CallToolResult)
    assert pairs(payload_of(result))[0] == ("git", "git_commit")


async def test_format_results_table() -> None:
    source, index = make()
    source.load("time")
    payload = payload_of(await call(source, index, query="time git", load=False))
    table = format_results_table(payload)
    lines = table.splitlines()
    assert lines[0].split() == ["#", "score", "server", "tool", "summary"]
    assert any("convert_time" in line and "Convert time between timezones" in line for line in lines)
    assert any("(not loaded)" in line and 'catalog_list_tools(server="git")' in line for line in lines)
    failed = {"results": [], "truncated": True, "failed": [{"server": "w", "reason": "timeout", "message": "slow"}]}
    assert format_results_table(failed).splitlines() == [
        "no matching tools",
        "(truncated: more results did not fit max_result_bytes)",
        "failed to load w: timeout: slow",
    ]
