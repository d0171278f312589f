"""A sqlite search index survives a restart of a real `aggregator serve` process (stdio)."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp.types as types
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

SEARCH_TOOLS = {"search_create_index", "search_add_document", "search_index"}


@asynccontextmanager
async def serve(config: Path, cwd: Path, *args: str, env: dict[str, str] | None = None) -> AsyncIterator[ClientSession]:
    """An initialized session to `python -m aggregator serve`; the process ends when the block does."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "aggregator", "serve", "--config", str(config), *args],
        env=env,
        cwd=str(cwd),
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> tuple[dict[str, Any], bool]:
    result = await session.call_tool(tool, arguments)
    assert result.structured_content is not None, result
    (block,) = result.content
    assert isinstance(block, types.TextContent)
    assert json.loads(block.text) == result.structured_content
    return result.structured_content, bool(result.is_error)


async def search(session: ClientSession, query: str, index_name: str = "notes") -> dict[str, Any]:
    payload, is_error = await call(session, "search_index", query=query, index_name=index_name)
    assert not is_error, payload
    return payload


PHRASE_QUERY = '+rate "token buckets" -circuit'
RANKED_QUERY = "rate limiting service"


async def test_sqlite_index_survives_restart(tmp_path: Path) -> None:
    config = tmp_path / "aggregator.yaml"
    config.write_text("upstreams: {}\n")
    data = tmp_path / "data"
    docs = {
        "rl": "Rate limiting protects APIs from abuse by throttling request frequency.",
        "tb": "Python rate limiting with token buckets",
        "cb": "Circuit breakers stop calls to a failing service",
    }

    async with serve(config, tmp_path, "--data-dir", str(data)) as session:
        names = {tool.name for tool in (await session.list_tools()).tools}
        assert names >= SEARCH_TOOLS
        tokenizer = {"lowercase": True, "min_length": 3}
        created, is_error = await call(
            session, "search_create_index", index_name="notes", backend="sqlite", tokenizer_config=tokenizer
        )
        assert not is_error and created["backend"] == "sqlite"
        await call(session, "search_create_index", index_name="scratch")
        for doc_id, content in docs.items():
            added, is_error = await call(
                session,
                "search_add_document",
                doc_id=doc_id,
                content=content,
                metadata={"id": doc_id},
                index_name="notes",
            )
            assert (added["status"], is_error) == ("indexed", False)
        before = await search(session, PHRASE_QUERY)
        ranked = await search(session, RANKED_QUERY)
    assert [r["doc_id"] for r in before["results"]] == ["tb"]
    assert [r["doc_id"] for r in ranked["results"]] == ["rl", "tb", "cb"]
    assert (data / "indexes" / "notes.sqlite3").is_file()
    assert not (data / "indexes" / "scratch.sqlite3").exists()

    # a new process, finding the data dir through the environment this time
    async with serve(config, tmp_path, env={"AGGREGATOR_DATA_DIR": str(data)}) as session:
        assert await search(session, PHRASE_QUERY) == before
        assert await search(session, RANKED_QUERY) == ranked
        same = {"doc_id": "tb", "content": docs["tb"], "metadata": {"id": "tb"}, "index_name": "notes"}
        again, _ = await call(session, "search_add_document", **same)
        assert again["status"] == "re-indexed"
        assert await search(session, RANKED_QUERY) == ranked  # re-indexing the same document changes nothing
        exists, is_error = await call(session, "search_create_index", index_name="notes", backend="sqlite")
        assert is_error and exists == {"error": "Index already exists: notes"}
        gone, is_error = await call(session, "search_index", query="anything", index_name="scratch")
        assert is_error and gone == {"error": "Index not found: scratch"}
