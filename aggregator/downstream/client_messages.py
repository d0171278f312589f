"""What a client's line on stdin becomes: a message for the server, or the error that answers it.

JSON-RPC 2.0 says every request gets a response, even a broken one: text that is
not JSON gets -32700 (Parse error), JSON that is not a valid request -32600
(Invalid Request), with the request's `id` when one can be read and `null`
otherwise. MCP allows only string or integer ids and object params, and no
batches; such a message is refused with -32600 and the id it carried, so the
client can match the answer. Notifications and responses get no answer (JSON-RPC
forbids it), only a log line. The session continues in every case.

A line longer than the message cap is skipped as it streams (never buffered)
and answered like an invalid request, with its id if the id appears at the top
level within the line's first bytes.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import mcp.types as types
import pydantic_core
from mcp.shared.message import SessionMessage

from aggregator.log import get_logger
from aggregator.wire import MAX_MESSAGE_BYTES, error_line

log = get_logger(__name__)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
SHUTTING_DOWN = -32000
HEAD_BYTES = 4096  # of an oversized line, kept to find its id


@dataclass(frozen=True, slots=True)
class Refusal:
    """A line the server never sees; `reply` (encoded, newline-terminated) answers it when one is due."""

    reply: bytes | None
    reason: str


@dataclass(frozen=True, slots=True)
class Oversized:
    """A line over the cap, skipped; `head` is its beginning."""

    head: bytes
    size: int


def parse_client_line(line: bytes) -> SessionMessage | Refusal:
    """`line` as a message for the server, or the refusal that answers it."""
    return parse_read_line(line, plain_fields(line))


def parse_read_line(line: bytes, fields: PlainRequest | None) -> SessionMessage | Refusal:
    """`parse_client_line` for a line already read by `plain_fields` (`fields`: None when it is no plain
    request, and the union of the message models decides)."""
    if fields is not None:
        return SessionMessage(fields.model())
    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as exc:
        return _refuse(line, _first_error(exc))
    detail = _misread(message, line)
    if detail is not None:
        refusal = _refuse(line, detail)
        if refusal.reply is not None:
            return refusal
    return SessionMessage(message)


class PlainRequest:
    """A plain request line's fields (`plain_fields`): what the raw lane reads (`id`, `method`, `params`),
    without the request model, which costs ten times as much to build (about 3 µs); `model()` builds it
    for the SDK's runner when the lane leaves the request to it."""

    __slots__ = ("_fields", "id", "method", "params")

    def __init__(self, fields: dict[str, Any]) -> None:
        self.id: str | int = fields["id"]
        self.method: str = fields["method"]
        self.params: dict[str, Any] | None = fields.get("params")
        self._fields = fields

    def model(self) -> types.JSONRPCRequest:
        # Every field is checked as the model checks it (extra keys it ignores): built without
        # validating it again, with the same fields set (an absent `params` stays unset).
        return types.JSONRPCRequest.model_construct(**self._fields)


def plain_request(line: bytes) -> types.JSONRPCRequest | None:
    """`line` as a request when it plainly is one, or None (then the union of the message models decides)."""
    fields = plain_fields(line)
    return fields.model() if fields is not None else None


def plain_fields(line: bytes) -> PlainRequest | None:
    """`line`'s request fields when it plainly is a request, or None (then the union of the message models decides).

    The message union tries every model in turn, which costs about twice the one model a request
    needs; this is what it would give for such a line (`tests/test_client_messages.py` proves it
    over generated lines). Only an object with a string or integer `id`, a string `method`, object
    or no `params`, and neither `result` nor `error` is tried; NaN and Infinity are left to the union.
    """
    try:
        data = pydantic_core.from_json(line, allow_inf_nan=False)
    except ValueError:
        return None
    if not isinstance(data, dict) or "result" in data or "error" in data:
        return None
    request_id, params = data.get("id"), data.get("params")
    if (
        type(request_id) not in (str, int)  # a bool or a float is the union's to judge (JSON mode)
        or not isinstance(data.get("method"), str)
        or not (params is None or isinstance(params, dict))
    ):
        return None
    if data.get("jsonrpc") != "2.0":
        return None
    fields: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": data["method"]}
    if "params" in data:
        fields["params"] = params
    return PlainRequest(fields)


def _misread(message: types.JSONRPCMessage, line: bytes) -> str | None:
    """Why a request may have passed for a message that is never answered (the client would
    wait forever), or None.

    An id of the wrong type (null, 1.5, an object) lets a request pass for a notification;
    params the models refuse plus `result` or `error` let it pass for a response.
    """
    if isinstance(message, types.JSONRPCNotification) and b'"id"' in line:
        return "id: must be a string or an integer"
    if isinstance(message, types.JSONRPCResponse | types.JSONRPCError) and b'"method"' in line:
        return "a request (it has `method`) must not carry `result` or `error`"
    return None


def _refuse(line: bytes, detail: str) -> Refusal:
    """The refusal of a line the message models rejected: -32700, -32600 or no reply at all."""
    try:
        value = json.loads(line)
    except RecursionError:
        return Refusal(error_line(None, PARSE_ERROR, "Parse error: JSON nested too deeply"), "too deep")
    except ValueError:
        return Refusal(error_line(None, PARSE_ERROR, "Parse error: the line is not valid JSON"), "not JSON")
    if isinstance(value, list):
        return _refuse_batch(value)
    if not _expects_reply(value):
        return Refusal(None, f"malformed notification or response: {detail}")
    return Refusal(error_line(reply_id(value), INVALID_REQUEST, f"Invalid Request: {detail}"), detail)


def refuse_oversized(item: Oversized, limit: int = MAX_MESSAGE_BYTES) -> Refusal:
    message = f"Invalid Request: a message of {item.size} bytes exceeds the {limit}-byte limit"
    return Refusal(error_line(top_level_id(item.head), INVALID_REQUEST, message), "too large")


def _refuse_batch(items: list[Any]) -> Refusal:
    message = "Invalid Request: JSON-RPC batches are not supported by MCP; send one message per line"
    if not items:
        return Refusal(error_line(None, INVALID_REQUEST, "Invalid Request: empty batch"), "empty batch")
    replies = [error_line(reply_id(item), INVALID_REQUEST, message) for item in items if _expects_reply(item)]
    if not replies:
        return Refusal(None, "batch of notifications")
    array = b"[" + b",".join(reply.rstrip(b"\n") for reply in replies) + b"]\n"
    return Refusal(array, "batch")


def _expects_reply(value: Any) -> bool:
    """False for what JSON-RPC never answers: a notification (no `id`) and a response."""
    if not isinstance(value, dict):
        return True
    if "id" not in value and isinstance(value.get("method"), str):
        return False
    return not ("method" not in value and ("result" in value or "error" in value))


def reply_id(value: Any) -> Any:
    """The id to answer with: the request's own if it is a JSON string or number, else null."""
    request_id = value.get("id") if isinstance(value, dict) else None
    if isinstance(request_id, bool) or not isinstance(request_id, str | int | float):
        return None
    if isinstance(request_id, float) and not math.isfinite(request_id):
        return None
    return request_id


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors(include_url=False, include_input=False)[0]
            where = ".".join(str(part) for part in first["loc"][1:]) or "message"
            return f"{where}: {first['msg']}"[:200]
        except Exception:  # pragma: no cover - pydantic's shape changed
            pass
    return str(exc).splitlines()[0][:200]


_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]]')


def top_level_id(head: bytes) -> Any:
    """The value of the top-level `"id"` key if it appears, complete, in `head`; else None."""
    depth = 0
    for match in _TOKEN.finditer(head):
        token = match.group()
        if token in (b"{", b"["):
            depth += 1
        elif token in (b"}", b"]"):
            depth -= 1
        elif depth == 1 and token == b'"id"':
            rest = head[match.end() :].lstrip()
            if rest.startswith(b":"):
                try:
                    value, _ = json.JSONDecoder().raw_decode(rest[1:].lstrip().decode("utf-8", "replace"))
                except ValueError:
                    return None
                return reply_id({"id": value})
    return None


class SkippingLineSplitter:
    """Splits a byte stream into lines; a line over `limit` bytes is skipped, not fatal.

    `feed` returns the complete lines, with an `Oversized` in place of each line
    that outgrew the limit; its bytes are dropped as they arrive, so a huge line
    costs no memory beyond its first `HEAD_BYTES`.
    """

    def __init__(self, limit: int = MAX_MESSAGE_BYTES) -> None:
        self._limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self._skipping: Oversized | None = None

    @property
    def between_lines(self) -> bool:
        """Nothing of a line is kept or being skipped: the next byte starts a new line."""
        return not self._parts and self._skipping is None

    def feed(self, chunk: bytes) -> list[bytes | Oversized]:
        out: list[bytes | Oversized] = []
        start = 0
        while start <= len(chunk):
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            self._take(piece)
            if end < 0:
                break
            out.append(self._finish())
            start = end + 1
        return out

    def _take(self, piece: bytes) -> None:
        if not piece:
            return
        if self._skipping is not None:
            head = self._skipping.head
            if len(head) < HEAD_BYTES:
                head += piece[: HEAD_BYTES - len(head)]
            self._skipping = Oversized(head, self._skipping.size + len(piece))
            return
        self._parts.append(piece)
        self._size += len(piece)
        if self._size > self._limit:
            head = b""
            for part in self._parts:
                head += part[: HEAD_BYTES - len(head)]
                if len(head) >= HEAD_BYTES:
                    break
            self._skipping = Oversized(head, self._size)
            self._parts, self._size = [], 0

    def _finish(self) -> bytes | Oversized:
        if self._skipping is not None:
            done, self._skipping = self._skipping, None
            return done
        line = b"".join(self._parts)
        self._parts, self._size = [], 0
        return line
