"""MCP tools of the full-text search index (seed search-mcp-tools.md, DESIGN §2.5).

`search_create_index`, `search_add_document` and `search_index` answer JSON
(structuredContent plus the same JSON as text); a refusal is the seed's
`{"error": "..."}` object with `isError: true`. Index work runs in worker threads
(SQLite I/O, tokenizing up to `max_content_bytes` of text) so the event loop never
blocks; each index serializes its own reads and writes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import anyio.to_thread
import mcp.types as types
import structlog

from aggregator.catalog.caps import DEFAULT_MAX_RESULT_BYTES, cap_list
from aggregator.faults import Fault
from aggregator.textindex.engine import AddOutcome, SearchOutcome, TextIndex
from aggregator.textindex.query_parser import ParsedQuery, parse_query
from aggregator.textindex.registry import BACKENDS, DEFAULT_INDEX, IndexRegistry, TextIndexError
from aggregator.textindex.tokenizer import (
    DEFAULT_LOWERCASE,
    DEFAULT_MIN_LENGTH,
    TokenizerConfig,
    TokenizerConfigError,
)
from aggregator.tools.base import OwnTool, ToolContext, json_result

log = structlog.get_logger(__name__)

DEFAULT_K = 10
DEFAULT_MAX_K = 1000
DEFAULT_MAX_CONTENT_BYTES = 1 << 20
MAX_QUERY_BYTES = 4096  # query parsing, phrase matching and highlights stay cheap below this

Handler = Callable[[Mapping[str, Any]], Awaitable[dict[str, Any]]]

_INDEX_NAME_PROP = {
    "type": "string",
    "pattern": "^[A-Za-z0-9_-]{1,64}$",
    "default": DEFAULT_INDEX,
    "description": 'Index to use (default: "default", an in-memory index that always exists).',
}


# --- argument checks: each raises TextIndexError with the message the caller sees ---


def _check_known(arguments: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(str(key) for key in arguments if key not in allowed)
    if unknown:
        raise TextIndexError(f"Unknown argument: {unknown[0]} (expected: {', '.join(allowed)})")


def _optional_str(arguments: Mapping[str, Any], key: str, default: str) -> str:
    value = arguments.get(key, default)
    if not isinstance(value, str):
        raise TextIndexError(f"{key} must be a string")
    return value


def _utf8_size(value: str, what: str) -> int:
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        message = f"{what} must be valid Unicode text (it contains an unpaired surrogate)"
        raise TextIndexError(message) from None


def _k(arguments: Mapping[str, Any], max_k: int) -> int:
    value = arguments.get("k", DEFAULT_K)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TextIndexError("k must be an integer >= 1")
    if value > max_k:
        raise TextIndexError(f"k must be at most {max_k}")
    return value


def _metadata(arguments: Mapping[str, Any], max_bytes: int) -> dict[str, Any]:
    value = arguments.get("metadata", {})
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise TextIndexError("metadata must be an object")
    try:
        encoded = json.dumps(dict(value), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        raise TextIndexError("metadata must be a JSON object (no NaN or Infinity)") from None
    if _utf8_size(encoded, "metadata") > max_bytes:
        raise TextIndexError(f"metadata is too large: more than {max_bytes} bytes of JSON")
    return dict(value)


def _content(arguments: Mapping[str, Any], max_bytes: int) -> str:
    content = arguments.get("content")
    if not isinstance(content, str) or not content.strip():
        raise TextIndexError("Content must be a non-empty string")
    size = _utf8_size(content, "content")
    if size > max_bytes:
        message = f"Content is too large: {size} bytes of UTF-8 (the maximum is {max_bytes} bytes)"
        raise TextIndexError(message)
    return content


def _doc_id(arguments: Mapping[str, Any]) -> str:
    doc_id = arguments.get("doc_id")
    if not isinstance(doc_id, str) or not doc_id.strip():
        raise TextIndexError("doc_id must be a non-empty string")
    _utf8_size(doc_id, "doc_id")
    return doc_id


# --- payloads ---


def _search_payload(outcome: SearchOutcome, parsed: ParsedQuery, max_bytes: int) -> dict[str, Any]:
    """The seed's payload, its results cut to the largest prefix within `max_bytes` (`truncated: true` then)."""

    def build(hits: list[dict[str, Any]], truncated: bool) -> dict[str, Any]:
        payload = {"results": hits, "total_matches": outcome.total_matches, "query_parsed": parsed.to_dict()}
        return {**payload, "truncated": True} if truncated else payload

    try:
        return cap_list([hit.to_dict() for hit in outcome.hits], build, max_bytes)
    except Fault as fault:
        raise TextIndexError(f"Result too large: {fault.message}") from None


def _add_payload(outcome: AddOutcome) -> dict[str, Any]:
    return {"status": outcome.status, "doc_id": outcome.doc_id, "token_count": outcome.token_count}


class TextSearchTools:
    """The three search-index tools over one `IndexRegistry` rooted at `data_dir`."""

    def __init__(
        self,
        data_dir: Path,
        max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES,
        *,
        max_k: int = DEFAULT_MAX_K,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    ) -> None:
        self.registry = IndexRegistry(data_dir)
        self.max_content_bytes = max_content_bytes
        self.max_k = max_k
        self.max_result_bytes = max_result_bytes

    def close(self) -> None:
        """Close the SQLite connections (indexes reopen lazily if used again)."""
        self.registry.close()

    # --- handlers (blocking work in threads) ---

    async def _index(self, name: str) -> TextIndex:
        """The index `name`; opening a persistent one from disk happens in a worker thread."""
        index = self.registry.opened(name)
        if index is None:
            index = await anyio.to_thread.run_sync(self.registry.get, name)
        return index

    async def _create_index(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        _check_known(arguments, ("index_name", "backend", "tokenizer_config"))
        name = arguments.get("index_name")
        if not isinstance(name, str):
            raise TextIndexError("index_name is required and must be a string")
        backend = _optional_str(arguments, "backend", "memory")
        try:
            config = TokenizerConfig.from_dict(arguments.get("tokenizer_config"))
        except TokenizerConfigError as exc:
            raise TextIndexError(str(exc)) from None
        index = await anyio.to_thread.run_sync(self.registry.create, name, backend, config)
        return {
            "status": "created",
            "index_name": index.name,
            "backend": index.backend,
            "tokenizer_config": index.config.to_dict(),
        }

    async def _add_document(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        _check_known(arguments, ("doc_id", "content", "metadata", "index_name"))
        content = _content(arguments, self.max_content_bytes)  # the seed's one error comes first
        doc_id = _doc_id(arguments)
        metadata = _metadata(arguments, self.max_content_bytes)
        name = _optional_str(arguments, "index_name", DEFAULT_INDEX)
        index = await self._index(name)
        outcome = await anyio.to_thread.run_sync(index.add, doc_id, content, metadata)
        return _add_payload(outcome)

    async def _search(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        _check_known(arguments, ("query", "k", "index_name"))
        query = arguments.get("query")
        if not isinstance(query, str):
            raise TextIndexError("query is required and must be a string")
        size = _utf8_size(query, "query")
        if size > MAX_QUERY_BYTES:
            raise TextIndexError(f"Query is too long: {size} bytes of UTF-8 (the maximum is {MAX_QUERY_BYTES} bytes)")
        k = _k(arguments, self.max_k)
        name = _optional_str(arguments, "index_name", DEFAULT_INDEX)
        index = await self._index(name)
        parsed = parse_query(query, index.config)
        if parsed.is_empty:
            return _search_payload(SearchOutcome([], 0), parsed, self.max_result_bytes)
        outcome = await anyio.to_thread.run_sync(index.search, parsed, k)
        return _search_payload(outcome, parsed, self.max_result_bytes)

    async def _run(
        self, handler: Handler, tool: str, arguments: Mapping[str, Any] | None, ctx: ToolContext
    ) -> types.CallToolResult:
        """Answer JSON; turn every refusal or failure into the seed's `{"error": ...}` object."""
        args: Mapping[str, Any] = arguments if arguments is not None else {}
        try:
            if not isinstance(args, Mapping):
                raise TextIndexError("arguments must be an object")
            return json_result(await handler(args))
        except TextIndexError as exc:
            return json_result({"error": exc.message}, is_error=True)
        except _storage_errors() as exc:
            log.warning("text_index_storage_error", tool=tool, error=str(exc))
            return json_result({"error": f"Storage error: {exc}"}, is_error=True)
        except Exception as exc:  # never let the SDK turn it into a JSON-RPC error
            log.exception("text_index_internal_error", tool=tool)
            return json_result({"error": f"Internal error: {type(exc).__name__}: {exc}"}, is_error=True)

    def tools(self) -> list[OwnTool]:
        return [
            OwnTool(
                name="search_create_index",
                title="Create a search index",
                description=_CREATE_DESCRIPTION,
                input_schema=_CREATE_SCHEMA,
                handler=partial(self._run, self._create_index, "search_create_index"),
                annotations={
                    "readOnlyHint": False,
                    "destructiveHint": False,
                    "idempotentHint": False,
                    "openWorldHint": False,
                },
            ),
            OwnTool(
                name="search_add_document",
                title="Add a document to a search index",
                description=_ADD_DESCRIPTION,
                input_schema=_add_schema(self.max_content_bytes),
                handler=partial(self._run, self._add_document, "search_add_document"),
                annotations={
                    "readOnlyHint": False,
                    "destructiveHint": True,
                    "idempotentHint": True,
                    "openWorldHint": False,
                },
            ),
            OwnTool(
                name="search_index",
                title="Search a search index",
                description=_SEARCH_DESCRIPTION,
                input_schema=_search_schema(self.max_k),
                handler=partial(self._run, self._search, "search_index"),
                annotations={"readOnlyHint": True, "idempotentHint": True, "openWorldHint": False},
            ),
        ]


_CREATE_DESCRIPTION = (
    'Create a named full-text index for notes or documents: backend "memory" (default, gone when the '
    'aggregator stops) or "sqlite" (kept on disk). Optional: the in-memory index "default" always exists.'
)
_ADD_DESCRIPTION = (
    'Add a document to an index (default "default"); a doc_id already there is replaced. '
    'Returns {status: "indexed"|"re-indexed", doc_id, token_count}.'
)
_SEARCH_DESCRIPTION = (
    "Search an index, ranked by TF-IDF: bare words are optional (one must match), +word required, "
    '-word excluded, "a phrase" must appear as consecutive words. Returns results {doc_id, score, '
    "highlights, metadata}, total_matches (before k), query_parsed; truncated when cut to the size limit."
)

_CREATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "index_name": {
            "type": "string",
            "pattern": "^[A-Za-z0-9_-]{1,64}$",
            "description": "Name of the new index: 1-64 letters, digits, '_' or '-'.",
        },
        "backend": {
            "type": "string",
            "enum": list(BACKENDS),
            "default": "memory",
            "description": '"memory" (default, lost when the aggregator stops) or "sqlite" (persistent).',
        },
        "tokenizer_config": {
            "type": "object",
            "description": "Tokenizer settings, fixed for the life of the index.",
            "properties": {
                "lowercase": {
                    "type": "boolean",
                    "default": DEFAULT_LOWERCASE,
                    "description": "Lower-case tokens so that matching ignores case.",
                },
                "min_length": {
                    "type": "integer",
                    "minimum": 1,
                    "default": DEFAULT_MIN_LENGTH,
                    "description": "Drop tokens shorter than this many characters.",
                },
            },
            "additionalProperties": False,
        },
    },
    "required": ["index_name"],
    "additionalProperties": False,
}


def _add_schema(max_content_bytes: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "doc_id": {
                "type": "string",
                "minLength": 1,
                "description": "Unique document identifier; an existing one is replaced.",
            },
            "content": {
                "type": "string",
                "minLength": 1,
                "description": f"Text to index (at most {max_content_bytes} bytes of UTF-8).",
            },
            "metadata": {
                "type": "object",
                "description": "Arbitrary JSON key-value metadata returned with search results.",
            },
            "index_name": _INDEX_NAME_PROP,
        },
        "required": ["doc_id", "content"],
        "additionalProperties": False,
    }


def _search_schema(max_k: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "description": 'Words to find; +word required, -word excluded, "exact phrase" required.',
            },
            "k": {
                "type": "integer",
                "minimum": 1,
                "maximum": max_k,
                "default": DEFAULT_K,
                "description": f"Maximum number of results (default 10, at most {max_k}).",
            },
            "index_name": _INDEX_NAME_PROP,
        },
        "required": ["query"],
        "additionalProperties": False,
    }


def _storage_errors() -> tuple[type[Exception], ...]:
    """OSError, and sqlite3's errors once a sqlite index has imported it (none can occur before: a
    `serve` whose client never opens one does not load sqlite3, 0.9 MB RSS)."""
    sqlite3 = sys.modules.get("sqlite3")
    return (OSError,) if sqlite3 is None else (sqlite3.Error, OSError)
