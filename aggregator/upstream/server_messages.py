"""Reading what an upstream sends: a message that cannot be read still answers its request.

The SDK's parser (pydantic-core) refuses JSON nested deeper than about 128 levels, a lone
surrogate (``"\\ud800"``) and invalid UTF-8; and a response whose `result` is not an object or
whose `error` is not `{code, message}` is not JSON-RPC. Dropping such a line silently leaves the
request waiting for its full timeout (and a too-deep `tools/list` answer loses the whole catalog).
So a line that fails is read again with the standard library, with invalid Unicode replaced
(`safetext.scrub`); if that is a valid message it goes on, else

- in a listing's answer (`tools`, `prompts`, ...) only the entries nested too deep are replaced
  by a marker that the catalog cleaner drops with a reason, keeping the rest;
- any other unreadable answer whose id can be found becomes a JSON-RPC error for that id,
  so the waiting call fails at once with a clear message.
"""

from __future__ import annotations

import json
import re
from typing import Any

import mcp.types as types
from mcp.shared.message import SessionMessage
from mcp_types.jsonrpc import INTERNAL_ERROR

from aggregator.catalog.model import DROPPED_MARK, MAX_NESTING, nesting_exceeds
from aggregator.log import get_logger
from aggregator.safetext import scrub

log = get_logger(__name__)

LISTING_KEYS = ("tools", "prompts", "resources", "resourceTemplates")
MAX_RESULT_NESTING = 100  # deeper results cannot reach a client: its parser stops at about 128 levels
INVALID_ANSWER = "the upstream's answer is invalid"
_ID_PATTERN = re.compile(rb'"id"\s*:\s*(-?\d{1,18}|"(?:[^"\\]|\\.){0,200}")')


def parse_upstream_line(line: bytes) -> SessionMessage | Exception:
    """One line from an upstream as a message; an unreadable answer becomes an error for its id."""
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        first = exc
    try:
        data: Any = scrub(json.loads(line.decode("utf-8", "replace")))  # invalid Unicode replaced, never fatal
    except (ValueError, RecursionError):
        data = None
    if data is not None and not nesting_exceeds(data, MAX_RESULT_NESTING + 1):  # +1: the envelope
        try:
            return SessionMessage(types.jsonrpc_message_adapter.validate_python(data, by_name=False))
        except (ValueError, RecursionError):
            pass
    salvaged = _salvage(data) if data is not None else _error_for_id(line, "it is not JSON")
    if salvaged is not None:
        try:
            return SessionMessage(types.jsonrpc_message_adapter.validate_python(salvaged, by_name=False))
        except ValueError:
            pass
    log.warning("upstream sent a line that is not JSON-RPC", error=str(first).splitlines()[0][:200])
    return first


def _salvage(data: Any) -> dict[str, Any] | None:
    """A readable replacement for a parsed-but-invalid message, or None if there is none."""
    if not isinstance(data, dict) or "method" in data or not _is_id(data.get("id")):
        return None  # a request or notification we cannot read, or no id to answer: nothing waits on it
    request_id = data["id"]
    if "error" in data:
        return _error(request_id, "its error is not an object with an integer code and a string message")
    result = data.get("result")
    if not isinstance(result, dict):
        return _error(request_id, f"its result is {type(result).__name__}, not an object")
    for key in LISTING_KEYS:
        if isinstance(result.get(key), list):
            result[key] = [_mark_if_too_deep(item) for item in result[key]]
    if nesting_exceeds(result, MAX_RESULT_NESTING):
        return _error(request_id, f"its result is nested deeper than {MAX_RESULT_NESTING} levels")
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def _mark_if_too_deep(item: Any) -> Any:
    if not nesting_exceeds(item, MAX_NESTING):
        return item
    name = item.get("name") if isinstance(item, dict) else None
    return {"name": name if isinstance(name, str) else "?", DROPPED_MARK: f"nested deeper than {MAX_NESTING} levels"}


def _error_for_id(line: bytes, why: str) -> dict[str, Any] | None:
    """An error for the one request id a broken line names, if it names exactly one."""
    if b'"method"' in line:
        return None  # perhaps the upstream's own request: its id is not one of ours
    found = {match.group(1) for match in _ID_PATTERN.finditer(line[:1_000_000])}
    if len(found) != 1:
        return None
    try:
        request_id = json.loads(found.pop())
    except ValueError:
        return None
    return _error(request_id, why)


def _error(request_id: Any, why: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": {"code": INTERNAL_ERROR, "message": f"{INVALID_ANSWER}: {why}"},
    }


def _is_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))
