"""Newline-delimited JSON-RPC, as both stdio transports (to clients, to upstreams) frame it."""

from __future__ import annotations

from typing import Any

import mcp.types as types
import pydantic_core
from mcp.shared.message import SessionMessage

from aggregator.log import get_logger

log = get_logger(__name__)


def json_line(message: Any) -> bytes:
    """A message of plain JSON values as one line (the raw path's framing: no model in between).
    Raises ValueError/TypeError for what JSON cannot hold, as `pydantic_core.to_json` does.

    NaN and ±Infinity, which a client's line may hold (Python's `json` writes them) and the message
    union reads, become null, as the SDK's models write them on the full path: JSON has no such
    value, and an upstream must not receive a line it may refuse that the other path would mend."""
    return pydantic_core.to_json(message, inf_nan_mode="null") + b"\n"


def error_line(request_id: Any, code: int, message: str) -> bytes:
    """One JSON-RPC error response as a wire line."""
    return json_line({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})


def parse_line(line: bytes, peer: str) -> SessionMessage | Exception:
    """One line as a message; a line that is not JSON-RPC is passed on as the exception it raised."""
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        log.warning("received a line that is not JSON-RPC", peer=peer, error=str(exc)[:200])
        return exc


def encode(message: SessionMessage) -> bytes:
    """The message as one line; one that cannot be serialised never ends the session.

    An answer that cannot be serialised (a lone surrogate that got past `safetext.scrub`, a value
    JSON has no form for) is replaced by an error answer for the same id; any other message is
    dropped with a warning (empty bytes: nothing to write; a writer may then answer a request itself).
    """
    try:
        return message.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
    except (ValueError, TypeError, UnicodeError) as exc:
        return _unsendable(message.message, exc)


def _unsendable(message: types.JSONRPCMessage, exc: Exception) -> bytes:
    log.warning("a message could not be serialised", kind=type(message).__name__, error=str(exc).splitlines()[0][:200])
    if not isinstance(message, types.JSONRPCResponse | types.JSONRPCError) or message.id is None:
        return b""
    error = error_answer(message.id, "the answer could not be serialised as JSON")
    return error.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"


def error_answer(request_id: types.RequestId, text: str) -> types.JSONRPCError:
    """An internal-error answer to `request_id`."""
    return types.JSONRPCError(
        jsonrpc="2.0", id=request_id, error=types.ErrorData(code=types.INTERNAL_ERROR, message=text)
    )


MAX_MESSAGE_BYTES = 32 * 1024 * 1024


class MessageTooLarge(ValueError):
    """A peer wrote more than MAX_MESSAGE_BYTES without a newline."""


class LineSplitter:
    """Splits a byte stream into lines in linear time, refusing lines over a size limit.

    Only each new chunk is searched for newlines; a partial line is kept as a list
    of pieces and joined once, when its newline arrives.
    """

    def __init__(self, limit: int = MAX_MESSAGE_BYTES) -> None:
        self._limit = limit
        self._parts: list[bytes] = []
        self._size = 0

    @property
    def between_lines(self) -> bool:
        """No partial line is kept: the next byte starts a new line."""
        return not self._parts

    def feed(self, chunk: bytes) -> list[bytes]:
        lines: list[bytes] = []
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if self._size + end - start > self._limit:
                raise MessageTooLarge(f"a message exceeded {self._limit} bytes")
            self._parts.append(chunk[start:end])
            lines.append(b"".join(self._parts))
            self._parts, self._size = [], 0
            start = end + 1
        if start < len(chunk):
            self._parts.append(chunk[start:])
            self._size += len(chunk) - start
            if self._size > self._limit:
                raise MessageTooLarge(f"a message exceeded {self._limit} bytes")
        return lines
