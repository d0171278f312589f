"""The search-index MCP tools through their OwnTool handlers: results, every error string."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest

from aggregator.tools.base import OwnTool, ToolContext
from aggregator.tools.text_search import TextSearchTools

CTX = ToolContext()


@pytest.fixture
def family(tmp_path: Path) -> Iterator[TextSearchTools]:
    made = TextSearchTools(tmp_path / "data", max_content_bytes=1000)
    yield made
    made.close()


async def call(family: TextSearchTools, tool: str, arguments: Any) -> tuple[dict[str, Any], bool]:
    """The structured result and isError; checks the text block carries the same JSON."""
    by_name = {t.name: t for t in family.tools()}
    result = await by_name[tool].handler(arguments, CTX)
    assert isinstance(result, types.CallToolResult)
    assert result.structured_content is not None
    (block,) = result.content
    assert isinstance(block, types.TextContent)
    assert json.loads(block.text) == result.structured_content
    return result.structured_content, bool(result.is_error)


async def ok(family: TextSearchTools, tool: str, arguments: Any) -> dict[str, Any]:
    payload, is_error = await call(family, tool, arguments)
    assert not is_error, payload
    return payload


async def error(family: TextSearchTools, tool: str, arguments: Any) -> str:
    payload, is_error = await call(family, tool, arguments)
    assert is_error
    assert list(payload) == ["error"]
    message: str = payload["error"]
    return message


def test_tool_definitions(family: TextSearchTools) -> None:
    tools: list[OwnTool] = family.tools()
    assert [t.name for t in tools] == ["search_create_index", "search_add_document", "search_index"]
    for tool in tools:
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", tool.name)
        wire = types.Tool.model_validate(tool.to_wire())
        assert wire.input_schema["type"] == "object"
        assert wire.input_schema["additionalProperties"] is False
        for prop in wire.input_schema["properties"].values():
            assert prop["description"]
    schemas = {t.name: t.input_schema for t in tools}
    assert schemas["search_index"]["properties"]["k"]["default"] == 10
    assert schemas["search_index"]["required"] == ["query"]
    assert schemas["search_add_document"]["properties"]["index_name"]["default"] == "default"
    assert "1000 bytes" in schemas["search_add_document"]["properties"]["content"]["description"]
    assert tools[2].annotations == {"readOnlyHint": True, "idempotentHint": True, "openWorldHint": False}


async def test_seed_examples(family: TextSearchTools) -> None:
    created = await ok(
        family,
        "search_create_index",
        {"index_name": "documentation", "tokenizer_config": {"lowercase": True, "min_length": 2}},
    )
    assert created == {
        "status": "created",
        "index_name": "documentation",
        "backend": "memory",
        "tokenizer_config": {"lowercase": True, "min_length": 2},
    }
    add = {
        "doc_id": "doc-001",
        "content": "Python rate limiting with token buckets",
        "index_name": "documentation",
    }
    assert await ok(family, "search_add_document", add) == {
        "status": "indexed",
        "doc_id": "doc-001",
        "token_count": 6,
    }
    readme = {
        "doc_id": "readme-rate-limiting",
        "content": "Rate limiting protects APIs from abuse by throttling request frequency.",
        "metadata": {"module": "rate_limiting", "type": "readme"},
        "index_name": "documentation",
    }
    assert (await ok(family, "search_add_document", readme))["token_count"] == 10
    found = await ok(family, "search_index", {"query": "rate limiting API", "k": 3, "index_name": "documentation"})
    assert found["total_matches"] == 2
    assert found["query_parsed"] == {
        "terms": ["rate", "limiting", "api"],
        "must": [],
        "must_not": [],
        "phrases": [],
    }
    assert [r["doc_id"] for r in found["results"]] == ["doc-001", "readme-rate-limiting"]  # tie: doc_id
    assert found["results"][1] == {
        "doc_id": "readme-rate-limiting",
        "score": 1.18907,  # 2 docs, df 2 each: 2 · (ln(2/3) + 1)
        "highlights": ["Rate limiting protects APIs from..."],  # "APIs" is not the token "api"
        "metadata": {"module": "rate_limiting", "type": "readme"},
    }


async def test_reindex_and_default_index(family: TextSearchTools) -> None:
    first = await ok(family, "search_add_document", {"doc_id": "n1", "content": "first draft"})
    again = await ok(family, "search_add_document", {"doc_id": "n1", "content": "final text", "metadata": {"v": 2}})
    assert (first["status"], again["status"]) == ("indexed", "re-indexed")
    assert (await ok(family, "search_index", {"query": "draft"}))["total_matches"] == 0
    found = await ok(family, "search_index", {"query": "final", "k": 1.0})
    assert [(r["doc_id"], r["metadata"]) for r in found["results"]] == [("n1", {"v": 2})]


@pytest.mark.parametrize("query", ["", "   ", "a", "!!! ?"])
async def test_empty_query_is_not_an_error(family: TextSearchTools, query: str) -> None:
    await ok(family, "search_add_document", {"doc_id": "x", "content": "something"})
    assert await ok(family, "search_index", {"query": query}) == {
        "results": [],
        "total_matches": 0,
        "query_parsed": {"terms": [], "must": [], "must_not": [], "phrases": []},
    }


async def test_operators_through_the_tool(family: TextSearchTools) -> None:
    for doc_id, content in [("a", "python machine learning"), ("b", "machine python"), ("c", "rust")]:
        await ok(family, "search_add_document", {"doc_id": doc_id, "content": content})
    found = await ok(family, "search_index", {"query": '+python "machine learning" -rust'})
    assert found["query_parsed"] == {
        "terms": [],
        "must": ["python"],
        "must_not": ["rust"],
        "phrases": ["machine learning"],
    }
    assert [r["doc_id"] for r in found["results"]] == ["a"]
    assert (await ok(family, "search_index", {"query": "-rust"}))["total_matches"] == 0


CREATE_ERRORS = [
    ({"index_name": "default"}, "Index already exists: default"),
    ({"index_name": "x", "backend": "elastic"}, "Unknown backend: elastic (use one of: memory, sqlite)"),
    ({"index_name": "x", "backend": 3}, "backend must be a string"),
    ({}, "index_name is required and must be a string"),
    ({"index_name": 7}, "index_name is required and must be a string"),
    (
        {"index_name": "a/b"},
        "Invalid index name: 'a/b' (use 1 to 64 letters, digits, '_' or '-': ^[A-Za-z0-9_-]{1,64}$)",
    ),
    ({"index_name": "x" * 65}, None),
    ({"index_name": "x", "tokenizer_config": []}, "tokenizer_config must be an object"),
    (
        {"index_name": "x", "tokenizer_config": {"lowercase": 1}},
        "tokenizer_config.lowercase must be a boolean",
    ),
    (
        {"index_name": "x", "tokenizer_config": {"min_length": "2"}},
        "tokenizer_config.min_length must be an integer",
    ),
    (
        {"index_name": "x", "tokenizer_config": {"min_length": 0}},
        "tokenizer_config.min_length must be between 1 and 1000",
    ),
    (
        {"index_name": "x", "tokenizer": {}},
        "Unknown argument: tokenizer (expected: index_name, backend, tokenizer_config)",
    ),
    ("not an object", "arguments must be an object"),
]


@pytest.mark.parametrize(("arguments", "message"), CREATE_ERRORS)
async def test_create_errors(family: TextSearchTools, arguments: Any, message: str | None) -> None:
    got = await error(family, "search_create_index", arguments)
    if message is None:
        assert got.startswith("Invalid index name: ")
    else:
        assert got == message


async def test_create_existing_names(family: TextSearchTools, tmp_path: Path) -> None:
    await ok(family, "search_create_index", {"index_name": "mem"})
    await ok(family, "search_create_index", {"index_name": "disk", "backend": "sqlite"})
    for name in ("mem", "disk"):
        for backend in ("memory", "sqlite"):
            assert await error(family, "search_create_index", {"index_name": name, "backend": backend}) == (
                f"Index already exists: {name}"
            )
    other = TextSearchTools(tmp_path / "data")  # another process on the same data dir
    assert await error(other, "search_create_index", {"index_name": "disk"}) == "Index already exists: disk"
    other.close()


ADD_ERRORS = [
    ({"doc_id": "d"}, "Content must be a non-empty string"),
    ({}, "Content must be a non-empty string"),
    ({"doc_id": "d", "content": ""}, "Content must be a non-empty string"),
    ({"doc_id": "d", "content": " \n\t"}, "Content must be a non-empty string"),
    ({"doc_id": "d", "content": 42}, "Content must be a non-empty string"),
    ({"content": "text"}, "doc_id must be a non-empty string"),
    ({"doc_id": "", "content": "text"}, "doc_id must be a non-empty string"),
    ({"doc_id": 5, "content": "text"}, "doc_id must be a non-empty string"),
    ({"doc_id": "d", "content": "text", "metadata": ["a"]}, "metadata must be an object"),
    ({"doc_id": "d", "content": "text", "metadata": "x"}, "metadata must be an object"),
    (
        {"doc_id": "d", "content": "text", "metadata": {"x": float("nan")}},
        "metadata must be a JSON object (no NaN or Infinity)",
    ),
    (
        {"doc_id": "d", "content": "text", "metadata": {"x": "y" * 1000}},
        "metadata is too large: more than 1000 bytes of JSON",
    ),
    (
        {"doc_id": "d", "content": "é" * 501},
        "Content is too large: 1002 bytes of UTF-8 (the maximum is 1000 bytes)",
    ),
    (
        {"doc_id": "d", "content": "a\ud800b"},
        "content must be valid Unicode text (it contains an unpaired surrogate)",
    ),
    (
        {"doc_id": "\udfff", "content": "x"},
        "doc_id must be valid Unicode text (it contains an unpaired surrogate)",
    ),
    (
        {"doc_id": "d", "content": "x", "metadata": {"k": "\ud800"}},
        "metadata must be valid Unicode text (it contains an unpaired surrogate)",
    ),
    ({"doc_id": "d", "content": "text", "index_name": "nope"}, "Index not found: nope"),
    ({"doc_id": "d", "content": "text", "index_name": 1}, "index_name must be a string"),
    (
        {"doc_id": "d", "content": "text", "index": "x"},
        "Unknown argument: index (expected: doc_id, content, metadata, index_name)",
    ),
]


@pytest.mark.parametrize(("arguments", "message"), ADD_ERRORS)
async def test_add_errors(family: TextSearchTools, arguments: Any, message: str) -> None:
    assert await error(family, "search_add_document", arguments) == message


async def test_content_limit_is_inclusive(family: TextSearchTools) -> None:
    added = await ok(family, "search_add_document", {"doc_id": "d", "content": "é" * 500, "metadata": None})
    assert added["token_count"] == 1


SEARCH_ERRORS = [
    ({"query": "x", "index_name": "nope"}, "Index not found: nope"),
    ({"query": "", "index_name": "nope"}, "Index not found: nope"),
    ({"query": "x", "index_name": "no such"}, None),
    ({}, "query is required and must be a string"),
    ({"query": ["x"]}, "query is required and must be a string"),
    ({"query": "x\ud800"}, "query must be valid Unicode text (it contains an unpaired surrogate)"),
    ({"query": "x", "k": 0}, "k must be an integer >= 1"),
    ({"query": "x", "k": -3}, "k must be an integer >= 1"),
    ({"query": "x", "k": "5"}, "k must be an integer >= 1"),
    ({"query": "x", "k": True}, "k must be an integer >= 1"),
    ({"query": "x", "k": 2.5}, "k must be an integer >= 1"),
    ({"query": "x", "limit": 3}, "Unknown argument: limit (expected: query, k, index_name)"),
]


@pytest.mark.parametrize(("arguments", "message"), SEARCH_ERRORS)
async def test_search_errors(family: TextSearchTools, arguments: Any, message: str | None) -> None:
    got = await error(family, "search_index", arguments)
    assert got == message if message is not None else got.startswith("Invalid index name: 'no such'")


async def test_sqlite_index_is_lazy_and_persistent(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = TextSearchTools(data)
    await ok(first, "search_create_index", {"index_name": "notes", "tokenizer_config": {"min_length": 3}})
    assert not data.exists()  # memory indexes never touch the disk
    await ok(first, "search_create_index", {"index_name": "kept", "backend": "sqlite"})
    assert (data / "indexes" / "kept.sqlite3").is_file()
    await ok(first, "search_add_document", {"doc_id": "a", "content": "durable words", "index_name": "kept"})
    before = await ok(first, "search_index", {"query": "durable", "index_name": "kept"})
    first.close()

    second = TextSearchTools(data)
    assert second.registry.open_names() == ["default"]
    assert await ok(second, "search_index", {"query": "durable", "index_name": "kept"}) == before
    assert await error(second, "search_index", {"query": "x", "index_name": "notes"}) == "Index not found: notes"
    second.close()


async def test_storage_failure_is_an_error_result(family: TextSearchTools) -> None:
    await ok(family, "search_create_index", {"index_name": "disk", "backend": "sqlite"})
    index = family.registry.get("disk")
    index._conn.close()  # type: ignore[attr-defined]
    message = await error(family, "search_add_document", {"doc_id": "a", "content": "x y", "index_name": "disk"})
    assert message.startswith("Storage error: ")


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_concurrent_calls(family: TextSearchTools, backend: str) -> None:
    await ok(family, "search_create_index", {"index_name": "c", "backend": backend})
    statuses: list[str] = []

    async def add(i: int) -> None:
        payload = await ok(
            family,
            "search_add_document",
            {"doc_id": f"d{i % 20}", "content": f"shared term{i}", "index_name": "c"},
        )
        statuses.append(payload["status"])

    async with anyio.create_task_group() as group:
        for i in range(40):
            group.start_soon(add, i)
    assert sorted(statuses) == ["indexed"] * 20 + ["re-indexed"] * 20
    found = await ok(family, "search_index", {"query": "shared", "k": 100, "index_name": "c"})
    assert found["total_matches"] == 20
    assert sorted(r["doc_id"] for r in found["results"]) == sorted(f"d{i}" for i in range(20))
