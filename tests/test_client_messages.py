"""Fast checks of `aggregator.downstream.client_messages`: what a client's line becomes (the real-process ones are in
test_downstream_faults.py and test_fuzz_downstream.py)."""

from __future__ import annotations

import json
from typing import Any

import mcp.types as types
from hypothesis import given
from hypothesis import strategies as st
from mcp.shared.message import SessionMessage

from aggregator.downstream.client_messages import (
    Oversized,
    Refusal,
    SkippingLineSplitter,
    parse_client_line,
    plain_fields,
    plain_request,
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


_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)
_ids = st.integers(-(2**70), 2**70) | st.text(max_size=5)
_params = st.dictionaries(st.text(max_size=5), _values, max_size=3)
_requests = st.fixed_dictionaries(  # mostly plain requests ...
    {"jsonrpc": st.just("2.0"), "id": _ids, "method": st.text(max_size=12)},
    optional={"params": _params | st.none(), "extra": _values},
)
_odd = st.fixed_dictionaries(  # ... and anything near one
    {},
    optional={
        "jsonrpc": st.sampled_from(["2.0", "1.0", 2.0]) | _values,
        "id": _ids | _values,
        "method": st.sampled_from(["tools/call", "ping"]) | _values,
        "params": _params | _values,
        "result": _values,
        "error": _values,
        "extra": _values,
    },
)
_envelopes = st.one_of(_requests, _odd)


@given(_envelopes, st.sampled_from([None, 2]), st.booleans())
def test_aplain_request_is_read_as_the_message_union_reads_it(
    envelope: dict[str, Any], indent: int | None, ascii_only: bool
) -> None:
    """The fast reading of a request (`plain_request`) gives what the union of the message models gives."""
    line = json.dumps(envelope, indent=indent, ensure_ascii=ascii_only).replace("\n", " ").encode()
    fast = plain_request(line)
    if fast is None:
        return
    assert envelope.get("jsonrpc") == "2.0" and "method" in envelope
    union = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    assert type(union) is type(fast) and union == fast
    assert fast.model_fields_set == union.model_fields_set and fast.model_extra == union.model_extra
    assert union.model_dump(by_alias=True, exclude_unset=True) == fast.model_dump(by_alias=True, exclude_unset=True)
    parsed = parse_client_line(line)
    assert isinstance(parsed, SessionMessage) and parsed.message == union
    fields = plain_fields(line)  # what the raw lane reads of it, no model built
    assert fields is not None and (fields.id, fields.method, fields.params) == (union.id, union.method, union.params)


def test_what_the_union_must_judge_is_not_read_as_aplain_request() -> None:
    for line in (
        b'{"jsonrpc": "2.0", "id": true, "method": "ping"}',
        b'{"jsonrpc": "2.0", "id": 1.0, "method": "ping"}',
        b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "result": {}}',
        b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": [1]}',
        b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": NaN}}',
        b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": "\\ud800"}}',
        b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]',
        b'{"jsonrpc": "1.0", "id": 1, "method": "ping"}',
        b'{"jsonrpc": 2.0, "id": 1, "method": "ping"}',
        b'{"id": 1, "method": "ping"}',
    ):
        assert plain_request(line) is None, line
    request = plain_request(b'{"jsonrpc": "2.0", "id": "a", "method": "tools/call", "params": {"name": "x"}}')
    assert isinstance(request, types.JSONRPCRequest) and request.params == {"name": "x"}
