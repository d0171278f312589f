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
