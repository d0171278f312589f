"""The raw path's cheap checks (proxy/raw_checks.py) agree with pydantic, for every era the raw path serves.

A fast "yes" must be pydantic's "yes": params the structural check accepts pass both checks
of the SDK's runner (the version's surface and the handler's params model), and a result the
plain-text check accepts is exactly what the SDK runner's sieve writes. Generated inputs lean
on the accepted shapes and their near misses (a bool for a str, an extra key, a null token).
"""

from __future__ import annotations

from typing import Any

import mcp.types as types
import pydantic_core
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from mcp_types.methods import serialize_server_result, validate_client_request
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from aggregator.proxy.raw_checks import plain_text_result, tools_call_params_ok

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ERAS = sorted(HANDSHAKE_PROTOCOL_VERSIONS)

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8), st.binary(max_size=4)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
keys = st.sampled_from(["name", "arguments", "_meta", "task", "progressToken", "type", "text", "isError", "x"])
tokens = st.one_of(st.text(max_size=6), st.integers(), st.booleans(), st.floats(allow_nan=False), st.none())
metas = st.one_of(st.dictionaries(st.sampled_from(["progressToken", "a/b", "x"]), tokens, max_size=2), json_values)
params = st.one_of(
    st.fixed_dictionaries(
        {"name": st.one_of(st.text(max_size=8), json_values)},
        optional={
            "arguments": st.one_of(st.dictionaries(st.text(max_size=6), json_values), json_values),
            "_meta": metas,
        },
    ),
    st.dictionaries(keys, json_values, max_size=4),
    json_values,
)
items = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=10)}),
    st.fixed_dictionaries({"type": st.sampled_from(["text", "image", 1]), "text": st.one_of(st.text(), json_values)}),
    st.dictionaries(keys, json_values, max_size=3),
)
results = st.one_of(
    st.fixed_dictionaries(
        {"content": st.lists(items, max_size=3)}, optional={"isError": st.one_of(st.booleans(), json_values)}
    ),
    st.dictionaries(keys, json_values, max_size=3),
    json_values,
)


@pytest.mark.parametrize("era", ERAS)
@FUZZ
@given(params=params)
@example(params={"name": "t"})
@example(params={"name": "t", "arguments": None, "_meta": {"progressToken": 7, "claudecode/toolUseId": "x"}})
@example(params={"name": "t", "_meta": {"progressToken": None}})  # found by test_raw_path's fuzzing
def test_params_the_check_accepts_the_sdk_accepts(era: str, params: Any) -> None:
    if tools_call_params_ok(params):  # the SDK runner's two checks pass (each raises if the check was wrong)
        validate_client_request("tools/call", era, params)
        types.CallToolRequestParams.model_validate(params, by_name=False)


@pytest.mark.parametrize("era", ERAS)
@FUZZ
@given(result=results)
@example(result={"content": [{"type": "text", "text": "p"}], "isError": False})
@example(result={"content": []})
def test_a_plain_result_is_what_the_sieve_writes(era: str, result: Any) -> None:
    plain = plain_text_result(result)
    if plain is not None:
        sieved = serialize_server_result("tools/call", era, result)
        assert plain == sieved
        assert pydantic_core.from_json(pydantic_core.to_json(plain)) == sieved  # the same JSON on the wire


def test_the_checks_take_the_common_shapes_and_refuse_near_misses() -> None:
    assert tools_call_params_ok({"name": "t", "arguments": {"a": 1}, "_meta": {"progressToken": "p"}})
    assert not tools_call_params_ok({"name": True})
    assert not tools_call_params_ok({"name": "t", "task": {}})  # task-augmented: the full path's
    assert not tools_call_params_ok({"name": "t", "_meta": {"progressToken": 1.5}})
    assert not tools_call_params_ok({"name": "t", "_meta": {"progressToken": None}})
    assert plain_text_result({"content": [{"type": "text", "text": "p"}], "isError": True}) is not None
    assert plain_text_result({"content": [{"type": "text", "text": "p"}], "isError": "yes"}) is None
    assert plain_text_result({"content": [{"type": "text", "text": "p", "annotations": {}}]}) is None
    assert plain_text_result({"content": [], "structuredContent": {}}) is None
