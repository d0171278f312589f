"""Fast checks of `aggregator.downstream.client_messages`: what a client's line becomes (the real-process ones are in
test_downstream_faults.py and test_fuzz_downstream.py)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from mcp.shared.message import SessionMessage

from aggregator.downstream.client_messages import (
    Oversized,
    Refusal,
    SkippingLineSplitter,
    parse_client_line,
    top_level_id,
)


@given(st.binary(max_size=300))
def test_any_bytes_become_a_message_or_a_refusal_whose_reply_is_json_rpc(line: bytes) -> None:
    parsed = parse_client_line(line.replace(b"\n", b" "))
    assert isinstance(parsed, SessionMessage | Refusal)
    if isinstance(parsed, Refusal) and parsed.reply is not None:
        reply = json.loads(parsed.reply)
        for item in reply if isinstance(reply, list) else [reply]:
            assert item["jsonrpc"] == "2.0" and item["error"]["code"] in (-32700, -32600) and "id" in item


LINES = st.lists(st.binary(max_size=30).filter(lambda b: b"\n" not in b), max_size=12)


@given(LINES, st.data())
def test_any_chunking_gives_the_same_lines_and_oversized_ones_are_marked(
    lines: list[bytes], data: st.DataObject
) -> None:
    stream = b"".join(line + b"\n" for line in lines)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    splitter = SkippingLineSplitter(limit=16)
    seen: list[bytes | Oversized] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        seen += splitter.feed(stream[start:end])
    expected = [line if len(line) <= 16 else Oversized(line[:4096], len(line)) for line in lines]
    assert seen == expected


def test_the_id_of_an_oversized_line_is_found_only_at_the_top_level() -> None:
    assert top_level_id(b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"s": "aaa') == 7
    assert top_level_id(b'{"params": {"id": 1, "x": "') is None
    assert top_level_id(b'{"method": "x", "params": {"a": [1, {"id": 2}]}, "id": "top", "z": "') == "top"
    assert top_level_id(b'{"note": "\\"id\\": 3", "id": 4.5, "p": "') == 4.5
    assert top_level_id(b'{"id": {"nested": 1}, "p": "') is None
    assert top_level_id(b'{"jsonrpc": "2.0", "method": "x", "params": "aaaa') is None


def test_a_request_that_also_carries_a_result_is_refused_not_taken_for_a_response() -> None:
    """params the models refuse plus `result` would otherwise pass as a response, never answered."""
    refused = parse_client_line(b'{"jsonrpc": "2.0", "id": 7, "method": "ping", "params": [], "result": {}}')
    assert isinstance(refused, Refusal) and refused.reply is not None
    reply = json.loads(refused.reply)
    assert reply["id"] == 7 and reply["error"]["code"] == -32600 and "method" in reply["error"]["message"]
    response = parse_client_line(b'{"jsonrpc": "2.0", "id": 7, "result": {"method": "ping"}}')
    assert not isinstance(response, Refusal)  # a real response, whatever its result holds
