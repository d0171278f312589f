"""Every input has a size and time bound (issue 20, items 12-15): linear text helpers on 1 MB
inputs, capped queries, bounded highlights off the index lock, non-regular snapshot files refused."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.catalog.model import SUMMARY_CHARS, clean_tool, summarize
from aggregator.catalog.search import MAX_INDEXED_CHARS
from aggregator.catalog.search.documents import tool_fields
from aggregator.catalog.search.tokens import identifiers, tokenize
from aggregator.config.config_file import read_text
from aggregator.config.errors import ConfigError
from aggregator.textindex.highlight import RADIUS, make_highlights
from aggregator.textindex.memory import MemoryIndex
from aggregator.textindex.query_parser import parse_query
from aggregator.textindex.sqlite import SqliteIndex
from aggregator.textindex.tokenizer import TokenizerConfig
from aggregator.tools.catalog_search import MAX_QUERY_CHARS
from aggregator.tools.text_search import MAX_QUERY_BYTES
from tests.conftest import aggregator_client, kit_upstream, structured, write_config
from tests.test_text_search_e2e import call

MEGABYTE = 1 << 20
PATTERNS = st.text(st.sampled_from("aA0 .!?_-\te.g.é。"), min_size=1, max_size=12)


@settings(max_examples=8, deadline=None)
@given(PATTERNS)
def test_text_helpers_are_linear_on_a_megabyte(pattern: str) -> None:
    text = (pattern * (MEGABYTE // len(pattern) + 1))[:MEGABYTE]
    summary = summarize(text)
    assert len(summary) <= SUMMARY_CHARS
    assert " ".join(text.split()).startswith(summary.removesuffix("…").rstrip())
    tokenize(text)
    identifiers(text)
    config = TokenizerConfig()
    words = [word for word in text.split() if word.strip(".!?_-") and word.isalnum()][:200]
    query = parse_query(f'"{" ".join(words)}" {" ".join(words[:5])}', config) if words else None
    if query is not None:
        snippets = make_highlights(text, config, query)
        assert len(snippets) <= 3 and sum(map(len, snippets)) <= 3 * (len(" ".join(words)) + 2 * RADIUS + 6)


def test_a_megabyte_description_is_indexed_by_its_head() -> None:
    """Tokenizing two 1 MB descriptions held the event loop ~0.5 s at load; only the head counts."""
    description = "Lists the files. " + "e.g. " * (MEGABYTE // 5) + "zebrafinch"
    tool = clean_tool("kit", {"name": "big", "description": description, "inputSchema": {"type": "object"}})
    tokens = tool_fields(tool)["description"]
    assert tokens[:3] == tokenize("Lists the files") and "zebrafinch" not in tokens
    assert len(tokens) <= MAX_INDEXED_CHARS


def test_a_long_phrase_over_a_dense_megabyte_note_is_bounded_and_off_the_lock() -> None:
    config = TokenizerConfig()
    index = MemoryIndex("notes", config)
    index.add("dense", "ab " * (MEGABYTE // 3 - 1) + "cd", {})
    phrase = " ".join(["ab"] * 300 + ["cd"])
    outcome = index.search(parse_query(f'"{phrase}"', config), 5)
    assert [hit.doc_id for hit in outcome.hits] == ["dense"]
    assert all(len(snippet) <= len(phrase) + 2 * RADIUS + 6 for snippet in outcome.hits[0].highlights)
    dense = index.search(parse_query("ab", config), 5)
    assert len(dense.hits[0].highlights) <= 3 and sum(map(len, dense.hits[0].highlights)) < 1000


def test_a_long_phrase_over_a_dense_note_in_sqlite_is_linear_and_equals_memory(tmp_path: Path) -> None:
    config = TokenizerConfig()
    memory, sqlite = MemoryIndex("notes", config), SqliteIndex.create("notes", tmp_path / "notes.sqlite", config)
    dense = "ab " * (MEGABYTE // 6) + "cd"
    for index in (memory, sqlite):
        index.add("dense", dense, {})
        index.add("gap", "ab " * 200 + "zz ab " + "ab " * 200 + "cd", {})
    for phrase in (["ab"] * 300 + ["cd"], ["ab"] * 150 + ["x", "ab"] + ["ab"] * 150, ["ab", "zz", "ab", "ab"]):
        query = parse_query('"' + " ".join(phrase) + '"', config)  # before: ~10 s per 256 KiB in sqlite
        found = sqlite.search(query, 5)
        assert found == memory.search(query, 5) and found.hits, phrase
    sqlite.close()


async def test_serve_caps_queries_and_answers_big_notes(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream(description="scriptable test server")})
    async with aggregator_client(config, "--data-dir", str(tmp_path / "data")) as session:
        with anyio.fail_after(120):  # a hang guard, not a speed target
            huge = await session.call_tool("catalog_search_tools", {"query": "find " * 520_000})
            assert huge.is_error and "most is" in huge.content[0].text and "\n" not in huge.content[0].text
            fine = await session.call_tool("catalog_search_tools", {"query": "x" * MAX_QUERY_CHARS})
            assert not fine.is_error
            payload, is_error = await call(session, "search_index", query="a" * (MAX_QUERY_BYTES + 1))
            assert is_error and "too long" in payload["error"]
            note = ("lorem " * 60 + "\n") * (339_000 // 361)
            added, is_error = await call(session, "search_add_document", doc_id="dense", content=note)
            assert not is_error, added
            found, is_error = await call(session, "search_index", query="lorem")
            assert not is_error and found["results"][0]["doc_id"] == "dense", found
            assert len(found["results"][0]["highlights"]) <= 3
            phrase = " ".join(["lorem"] * 150)
            found, is_error = await call(session, "search_index", query=f'"{phrase}"')
            assert not is_error and found["total_matches"] == 1
            servers = structured(await session.call_tool("catalog_list_servers", {}))
            assert servers["servers"][0]["name"] == "kit"


async def test_a_fifo_where_a_snapshot_should_be_never_blocks_initialize(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream()})
    catalogs = tmp_path / "data" / "catalogs"
    catalogs.mkdir(parents=True)
    os.mkfifo(catalogs / "kit.json")
    with anyio.fail_after(60):  # a hang guard: before the fix, initialize was never answered
        async with aggregator_client(config, "--data-dir", str(tmp_path / "data")) as session:
            servers = structured(await session.call_tool("catalog_list_servers", {}))["servers"]
            assert servers[0]["name"] == "kit" and servers[0]["tool_count"] is None  # not read from the FIFO
            tools = structured(await session.call_tool("catalog_list_tools", {"server": "kit"}))
            assert "echo" in [item["tool"] for item in tools["items"]]


def test_a_fifo_where_a_config_or_client_file_should_be_is_one_clear_error(tmp_path: Path) -> None:
    fifo = tmp_path / "mcp.json"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        read_text(fifo)  # at once: opening a FIFO for reading used to wait for a writer forever
    crlf = tmp_path / "crlf.yaml"
    crlf.write_bytes(b"\xef\xbb\xbfupstreams: {}\r\n# x\r\n")
    assert read_text(crlf) == "upstreams: {}\n# x\n"  # BOM dropped, newlines as text mode reads them
