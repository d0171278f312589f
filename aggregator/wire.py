"""Newline-delimited JSON-RPC, as both stdio transports (to clients, to upstreams) frame it."""

from __future__ import annotations

import mcp.types as types
from mcp.shared.message import SessionMessage

from aggregator.log import get_logger

log = get_logger(__name__)


def parse_line(line: bytes, peer: str) -> SessionMessage | Exception:
    """One line as a message; a line that is not JSON-RPC is passed on as the exception it raised."""
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        log.warning("received a line that is not JSON-RPC", peer=peer, error=str(exc)[:200])
        return exc


def encode(message: SessionMessage) -> bytes:
    return message.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"


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
