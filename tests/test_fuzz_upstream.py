"""Hypothesis fuzzing of what an upstream can send, through a real subprocess upstream (testkit).

Random, garbage and deeply nested tool lists and call answers must never raise anything
but a `Fault`, never hang, and always end in something a client can be sent: a valid tool
listing, and for every call either a valid result or a fault result.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp_types.methods import validate_server_result

from aggregator.faults import Fault
from aggregator.proxy.exposure import build_direct_tools
from aggregator.proxy.server import _call_result
from aggregator.upstream.pool import UpstreamPool
from tests.conftest import kit_upstream
from tests.test_pool import config_of

CALL_TIMEOUT = 5  # an answer with no readable id can only end by timing out
PROMPT = CALL_TIMEOUT + 25  # every call settles well within this, even on a loaded machine
VERSIONS = ("2024-11-05", "2025-06-18", "2025-11-25", "2026-07-28")

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@st.composite
def deep(draw: st.DrawFn) -> Any:
    """A value nested 50 to 400 levels, alternating objects and arrays."""
    value: Any = draw(scalars)
    for level in range(draw(st.integers(50, 400))):
        value = {"a": value} if level % 2 else [value]
    return value


schemas = st.fixed_dictionaries(
    {"type": st.sampled_from(["object", "string", None])},
    optional={"properties": json_values | deep(), "required": json_values, "additionalProperties": json_values},
)
tool_like = st.fixed_dictionaries(
    {"name": st.text(min_size=1, max_size=30) | scalars},
    optional={
        "description": json_values,
        "title": json_values,
        "inputSchema": schemas | json_values,
        "outputSchema": schemas | json_values,
        "annotations": json_values,
    },
)
tool_lists = st.lists(tool_like | json_values | deep(), max_size=8)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tools=tool_lists)
def test_any_tool_list_leaves_a_clean_catalog(tmp_path: Path, tools: list[Any]) -> None:
    extra = tmp_path / "tools.json"
    extra.write_text(json.dumps(tools))
    config = config_of({"kit": kit_upstream("--extra-tools", str(extra), timeouts={"connect": 60})})

    async def load() -> None:
        async with UpstreamPool.running(config) as pool:
            with anyio.fail_after(PROMPT):
                catalog = await pool.ensure_catalog("kit")
        assert catalog.tool("echo") is not None  # the good tools always survive
        direct = build_direct_tools({"kit": catalog}, {"kit": lambda _name: True}, [])
        listing = {"tools": [d.wire.model_dump(by_alias=True, mode="json", exclude_none=True) for d in direct.values()]}
        for version in VERSIONS:
            envelope = {"resultType": "complete", "ttlMs": 0, "cacheScope": "private"} if version >= "2026" else {}
            validate_server_result("tools/list", version, {**envelope, **listing})

    anyio.run(load)


@pytest.fixture(scope="module")
def kit_pool() -> Iterator[tuple[BlockingPortal, UpstreamPool]]:
    """One testkit upstream for every example, run by an event loop in a thread."""
    config = config_of({"kit": kit_upstream(timeouts={"call": CALL_TIMEOUT})})
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(UpstreamPool.running(config)) as pool:
        yield portal, pool


garbage_lines = st.text(max_size=200).map(lambda t: t.replace("\n", " ")) | st.builds(
    lambda t: '{"jsonrpc": "2.0", "id": ID, ' + t.replace("\n", " "), st.text(max_size=100)
)
answers = (
    st.fixed_dictionaries({"result": json_values | deep()})
    | st.fixed_dictionaries({"result": st.fixed_dictionaries({"content": json_values}, optional={"isError": scalars})})
    | st.fixed_dictionaries({"error": json_values})
    | st.fixed_dictionaries({"nest": st.integers(0, 300)})
    | st.fixed_dictionaries({"line": garbage_lines})
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=answers, version=st.sampled_from(VERSIONS))
def test_any_answer_to_a_call_is_a_result_or_a_fault(
    kit_pool: tuple[BlockingPortal, UpstreamPool],
    caplog: pytest.LogCaptureFixture,
    answer: dict[str, Any],
    version: str,
) -> None:
    portal, pool = kit_pool
    caplog.clear()

    async def call() -> Any:
        with anyio.fail_after(PROMPT):
            try:
                return _call_result(await pool.call_tool("kit", "reply", answer), version)
            except Fault as fault:
                return fault

    outcome = portal.call(call)
    if isinstance(outcome, dict):
        envelope = {"resultType": "complete"} if version >= "2026" else {}
        validate_server_result("tools/call", version, {**envelope, **outcome})
    else:
        assert isinstance(outcome, Fault) or outcome.is_error, outcome
        if isinstance(outcome, Fault) and "line" not in answer:  # an answer naming its id settles at once
            assert outcome.reason != "timeout", outcome

    async def still_serving() -> Any:
        with anyio.fail_after(PROMPT):
            while pool.in_backoff("kit"):
                await anyio.sleep(0.05)
            return await pool.call_tool("kit", "echo", {"message": "alive"})

    assert portal.call(still_serving)["content"][0]["text"] == "alive"
    assert not [record for record in caplog.records if record.exc_info], "a traceback was logged"
