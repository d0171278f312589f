"""The raw path (proxy/raw.py, upstream/raw_calls.py): really taken, and answering as the full path does.

Two copies of the testkit upstream run side by side: `rawkit` (the default `call_path: raw`) and
`twin` (`call_path: full`, the SDK on both legs). Every call is made to both and the answers,
with the upstream's name swapped, must be the same JSON; the raw path's counters prove which
path each took. The client is a line client on a socket pair, served as `aggregator serve`
serves a line-based client (tests/raw_harness.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from mcp_types.jsonrpc import CONNECTION_CLOSED

from aggregator.downstream import stdio
from aggregator.proxy.raw import RawLane
from aggregator.proxy.server import AggregatorServer
from tests.conftest import kit_upstream
from tests.raw_harness import LineClient, raw_bench, raw_clients

CALL_TIMEOUT = 1.0
ARG = {"name": "name", "value": "A"}
TEMPLATE = "testkit://items/{item_id}"
ROGUE = Path(__file__).with_name("rogue_upstream.py")
Bench = tuple[BlockingPortal, AggregatorServer, LineClient, Path]


def twin_config(directory: Path, names: tuple[str, str] = ("rawkit", "twin"), **extra: Any) -> Path:
    """Two testkit upstreams, exposed directly; the second on the full path. Each logs its events.

    Both list the same resources: reads go to the first by name, rawkit."""
    upstreams = {}
    for name, path in zip(names, ("raw", "full"), strict=True):
        entry = kit_upstream("--event-log", str(directory / f"{name}.events"), expose="direct", **extra)
        entry["timeouts"] = {"call": CALL_TIMEOUT}
        if path == "full":
            entry["call_path"] = "full"
        upstreams[name] = entry
    config = directory / "aggregator.yaml"
    config.write_text(json.dumps({"upstreams": upstreams}))
    return config


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    directory = tmp_path_factory.mktemp("raw")
    config = twin_config(directory)
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(raw_bench(config)) as (server, client):
        yield portal, server, client, directory


@pytest.fixture(scope="module")
def full_bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    """One testkit upstream named rawkit too, on the full path: for requests routed by URI or prompt name."""
    directory = tmp_path_factory.mktemp("full")
    entry = kit_upstream(expose="direct", call_path="full", timeouts={"call": CALL_TIMEOUT})
    config = directory / "aggregator.yaml"
    config.write_text(json.dumps({"upstreams": {"rawkit": entry}}))
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(raw_bench(config)) as (server, client):
        yield portal, server, client, directory


_TOKEN = re.compile(r'"progressToken": ?("agg-\d+"|\d+)')


def normal(answer: dict[str, Any]) -> str:
    """The answer's outcome with the upstream's name and our progress token (an id of either leg) masked."""
    outcome = {key: answer[key] for key in ("result", "error") if key in answer}
    text = json.dumps(outcome, sort_keys=True)
    for upstream in ("rawkit", "twin"):  # both appear in a list of the known names
        text = text.replace(upstream, "KIT").replace(upstream.upper(), "KIT")
    text = re.sub(r"testkit\[\d+\]", "testkit[PID]", text)  # a dead upstream's stderr names its pid
    return _TOKEN.sub('"progressToken": "T"', text.replace('\\"', '"'))


def swapped(value: Any, old: str, new: str) -> Any:
    """`value` with every string naming `old` naming `new` instead (keys too)."""
    return json.loads(json.dumps(value).replace(old, new).replace(old.upper(), new.upper()))


def both(bench: Bench, name: str, arguments: Any = None, **params: Any) -> tuple[str, str]:
    """Call on rawkit and on twin (`name` and the arguments written for rawkit); both answers, normalised."""
    portal, _server, client, _ = bench
    message = {"name": name, "arguments": arguments, **params}

    async def call(upstream: str) -> dict[str, Any]:
        return await client.request("tools/call", swapped(message, "rawkit", upstream))

    return normal(portal.call(call, "rawkit")), normal(portal.call(call, "twin"))


CASES: list[tuple[str, dict[str, Any]]] = [
    ("echo", {"message": "hi ünïcode \u2028"}),
    ("big", {"n": 300_000}),  # a large answer, under the limit
    ("add", {"a": 2, "b": 3.5}),
    ("image", {}),
    ("structured", {}),
    ("fail", {"message": "boom"}),
    ("meta", {}),
    ("reply", {"result": {"content": "not a list"}}),  # a result the client's protocol forbids
    ("reply", {"result": {"content": [], "extra": 1, "_meta": {"k": "v"}}}),  # unknown keys: sieved
    ("reply", {"error": {"code": -32000, "message": "upstream refused", "data": {"x": 1}}}),
    ("reply", {"error": "not an error object"}),
    ("reply", {"line": '{"jsonrpc": "2.0", "id": ID, "result": {"content": [{"type": "text", "text": "\\ud800"}]}}'}),
    ("reply", {"line": '{"jsonrpc": "2.0", "id": ID, "result": '}),  # cut short: not JSON
    ("reply", {"nest": 150}),  # deeper than a client can read
    ("nope", {}),  # not a tool of the upstream
]


@pytest.mark.parametrize(("tool", "arguments"), CASES, ids=[f"{t}-{i}" for i, (t, _) in enumerate(CASES)])
def test_calls_take_the_raw_path_and_answer_as_the_full_path(bench: Bench, tool: str, arguments: Any) -> None:
    _portal, server, _client, _ = bench
    taken, sent = server.raw.taken, server.pool.connection("rawkit").raw_requests
    meta = {"_meta": {"custom/key": "kept", "progressToken": "client-token"}}
    catalog_raw, catalog_full = both(
        bench, "catalog_call_tool", {"server": "rawkit", "tool": tool, "arguments": arguments}, **meta
    )
    assert catalog_raw == catalog_full
    if tool != "nope":
        direct_raw, direct_full = both(bench, f"rawkit__{tool}", arguments, **meta)
        assert direct_raw == direct_full
        assert direct_raw == catalog_raw  # the same result whichever way the tool is named
    calls = 1 if tool == "nope" else 2
    assert server.raw.taken == taken + calls  # the rawkit calls went raw ...
    upstream_calls = 0 if tool == "nope" else calls
    assert server.pool.connection("rawkit").raw_requests == sent + upstream_calls  # ... on both legs
    assert server.raw.fallbacks.get("call_path", 0) >= calls  # the twin ones did not


PASSTHROUGH_CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("prompts/get", {"name": "rawkit__greet", "arguments": {"name": "Ada"}}, True),
    ("prompts/get", {"name": "rawkit__review_code", "arguments": {}, "_meta": {"progressToken": 3}}, True),
    ("prompts/get", {"name": "rawkit__nope"}, False),  # not known without starting anything: full path
    ("resources/read", {"uri": "testkit://readme"}, True),
    ("resources/read", {"uri": "testkit://items/7"}, True),  # by template
    ("resources/read", {"uri": "elsewhere://x"}, False),
    ("completion/complete", {"ref": {"type": "ref/prompt", "name": "rawkit__greet"}, "argument": ARG}, True),
    (
        "completion/complete",
        {"ref": {"type": "ref/resource", "uri": "testkit://items/{item_id}"}, "argument": ARG},
        True,
    ),
]


@pytest.mark.parametrize(("method", "params", "raw"), PASSTHROUGH_CASES)
def test_prompts_resources_and_completions_take_the_raw_path_too(
    bench: Bench, full_bench: Bench, method: str, params: dict[str, Any], raw: bool
) -> None:
    answers = []
    for portal, _server, client, _ in (bench, full_bench):
        portal.call(client.request, "tools/list")  # the direct upstreams start: their prompts are known
        answers.append(normal(portal.call(client.request, method, params)))
    server = bench[1]
    taken = server.raw.taken
    assert answers[0] == answers[1]
    assert normal(bench[0].call(bench[2].request, method, params)) == answers[0]  # again, counted this time
    assert server.raw.taken == taken + raw


def test_custom_meta_reaches_the_upstream_beside_our_token(bench: Bench) -> None:
    portal, _server, client, _ = bench
    answer = portal.call(partial(client.call, "rawkit__meta", {}, _meta={"custom/key": 1, "progressToken": 7}))
    meta = answer["result"]["structuredContent"]["meta"]
    assert meta["custom/key"] == 1
    assert str(meta["progressToken"]).startswith("agg-")  # ours, never the client's (or an SDK integer)


def test_progress_is_relayed_and_restarts_the_deadline(bench: Bench) -> None:
    portal, _server, client, _ = bench
    seconds, steps = CALL_TIMEOUT * 1.6, 8  # longer than the call timeout, progress every 0.2 s
    before = len(client.notifications)
    arguments = {"seconds": seconds, "steps": steps}
    answer = portal.call(partial(client.call, "rawkit__slow", arguments, _meta={"progressToken": "p-raw"}))
    assert answer["result"]["isError"] is False, answer
    progress = [n["params"] for n in client.notifications[before:] if n["method"] == "notifications/progress"]
    assert [p["progressToken"] for p in progress] == ["p-raw"] * steps  # all of them, before the answer
    assert progress[-1] == {
        "progressToken": "p-raw",
        "progress": steps,
        "total": steps,
        "message": f"step {steps}/{steps}",
    }


def test_a_silent_upstream_times_out_as_on_the_full_path_and_is_told(bench: Bench) -> None:
    _portal, _server, _client, directory = bench
    raw, full = both(bench, "rawkit__slow", {"seconds": CALL_TIMEOUT * 3, "steps": 0})
    assert raw == full
    assert "timeout" in raw
    events = (directory / "rawkit.events").read_text()
    assert re.search(r"cancelled agg-\d+", events), events  # notifications/cancelled with our id


def test_a_wrong_id_or_garbage_is_a_timeout_as_on_the_full_path(bench: Bench) -> None:
    for line in ('{"jsonrpc": "2.0", "id": "agg-999999", "result": {"content": []}}', "garbage, not JSON"):
        raw, full = both(bench, "rawkit__reply", {"line": line})
        assert raw == full
        assert "timeout" in raw


def test_sampling_during_a_raw_call_reaches_the_caller(bench: Bench) -> None:
    portal, server, client, _ = bench
    taken = server.raw.taken
    params = {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 5}
    answer = portal.call(client.call, "rawkit__ask", {"method": "sampling/createMessage", "params": params})
    assert answer["result"]["structuredContent"]["result"]["content"]["text"] == "sampled", answer
    assert server.raw.taken == taken + 1
    assert client.server_requests[-1]["method"] == "sampling/createMessage"


def test_what_must_keep_the_full_path_falls_back_and_is_still_answered(bench: Bench) -> None:
    portal, server, client, _ = bench
    before = dict(server.raw.fallbacks)
    own = portal.call(client.call, "catalog_list_servers", {})
    assert "result" in own
    not_an_object = portal.call(client.request, "tools/call", {"name": "rawkit__echo", "arguments": 5})
    assert not_an_object["error"]["code"] == -32602  # the SDK's own answer to params it refuses
    unknown = portal.call(client.call, "no_such_tool")
    assert unknown["result"]["isError"] is True
    slow = {"name": "rawkit__slow", "arguments": {"seconds": 0.3, "steps": 0}}
    first = portal.call(client.expect, "dup")
    for _ in range(2):  # the same id twice while the first is in flight
        portal.call(client.send, {"jsonrpc": "2.0", "id": "dup", "method": "tools/call", "params": slow})
    assert "result" in portal.call(first.receive)
    after = server.raw.fallbacks
    assert after.get("duplicate_id", 0) == before.get("duplicate_id", 0) + 1
    assert after.get("target", 0) >= before.get("target", 0) + 2
    assert after.get("params", 0) == before.get("params", 0) + 1


async def slow_call(server: AggregatorServer, client: LineClient, request_id: str) -> Any:
    """A 30-second `rawkit__slow` call, running at the upstream on return; where its answer arrives."""
    answer = client.expect(request_id)
    call = {"name": "rawkit__slow", "arguments": {"seconds": 30, "steps": 0}}
    await client.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": call})
    with anyio.fail_after(5):
        while not server.pool.connection("rawkit").busy:
            await anyio.sleep(0.01)
    return answer


def test_a_cancelled_raw_call_frees_its_slot(tmp_path: Path) -> None:
    config = twin_config(tmp_path)

    async def scenario() -> None:
        async with raw_bench(config, max_in_flight=1) as (server, client):
            answer = await slow_call(server, client, "slow-1")
            await client.send(
                {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "slow-1"}}
            )
            echoed = await client.call("rawkit__echo", {"message": "next"}, timeout=5)  # the only slot is free again
            assert echoed["result"]["content"][0]["text"] == "next"
            with anyio.move_on_after(0.3):
                await answer.receive()
                pytest.fail("a cancelled request was answered")
        events = (tmp_path / "rawkit.events").read_text()
        assert re.search(r"cancelled agg-\d+", events), events

    anyio.run(scenario)


def test_a_raw_call_cancelled_in_the_same_write_as_its_request_frees_its_slot(tmp_path: Path) -> None:
    """The request and its cancel arrive together: the call is cancelled before its task ever ran."""
    config = twin_config(tmp_path)

    async def scenario() -> None:
        async with raw_bench(config, max_in_flight=1) as (server, client):
            await client.request("tools/list")  # the direct tools known: the call below takes the raw path
            taken = server.raw.taken
            answer = client.expect("quick-1")
            call = {"name": "rawkit__slow", "arguments": {"seconds": 30, "steps": 0}}
            request = {"jsonrpc": "2.0", "id": "quick-1", "method": "tools/call", "params": call}
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "quick-1"}}
            await client.send(json.dumps(request).encode() + b"\n" + json.dumps(cancel).encode() + b"\n")
            echoed = await client.call("rawkit__echo", {"message": "next"}, timeout=5)  # the only slot is free
            assert echoed["result"]["content"][0]["text"] == "next"
            assert server.raw.taken == taken + 1  # the echo; the cancelled call never ran
            with anyio.move_on_after(0.3):
                await answer.receive()
                pytest.fail("a cancelled request was answered")

    anyio.run(scenario)


def test_a_raw_call_running_when_the_client_leaves_is_answered_and_cancelled_upstream(tmp_path: Path) -> None:
    """EOF on the client's stdin: after the drain time a raw call still running gets the SDK's
    `Connection closed` answer (as a full-path request does) and its upstream a cancel."""
    config = twin_config(tmp_path)

    async def scenario() -> None:
        async with raw_bench(config, drain_seconds=0.2) as (server, client):
            await client.request("tools/list")  # the direct tools known: the call below takes the raw path
            taken = server.raw.taken
            answer = await slow_call(server, client, "slow-1")
            assert server.raw.taken == taken + 1
            client.sock.shutdown(socket.SHUT_WR)
            with anyio.fail_after(5):
                closed = await answer.receive()
            assert closed["error"]["code"] == CONNECTION_CLOSED, closed
            with anyio.fail_after(5):
                while not re.search(r"cancelled agg-\d+", (tmp_path / "rawkit.events").read_text()):
                    await anyio.sleep(0.05)

    anyio.run(scenario)


def test_a_dead_or_oversized_upstream_fails_the_call_as_on_the_full_path(tmp_path: Path) -> None:
    config = twin_config(tmp_path, max_message_bytes=4096)

    async def scenario() -> None:
        async with raw_bench(config) as (server, client):
            for tool, arguments in (("crash", {}), ("big", {"n": 10000})):
                answers = {}
                for name in ("rawkit", "twin"):
                    await anyio.sleep(0.3)  # past the backoff of the previous failure
                    answers[name] = normal(await client.call(f"{name}__{tool}", arguments))
                assert answers["rawkit"] == answers["twin"]
                assert "upstream_error" in answers["rawkit"] or "response_too_large" in answers["rawkit"]
            # No tools/list came first: the first direct call starts the direct upstreams on the full path
            # (lazy start), the next rawkit call goes raw, and twin's never do.
            assert (server.raw.taken, server.raw.fallbacks) == (1, {"target": 1, "call_path": 2})

    anyio.run(scenario)


def test_an_upstream_killed_with_raw_calls_in_flight_fails_each_of_them_at_once(tmp_path: Path) -> None:
    """SIGKILL to the upstream while three raw calls wait on it: each gets the lost-upstream fault
    (no hang until the call timeout), nothing is left in flight, and the next call starts it again."""
    config = twin_config(tmp_path)

    async def scenario() -> None:
        async with raw_bench(config) as (server, client):
            pid = int((await client.call("rawkit__pid"))["result"]["content"][0]["text"])
            taken = server.raw.taken
            answers = [client.expect(f"slow-{i}") for i in range(3)]
            call = {"name": "rawkit__slow", "arguments": {"seconds": 30, "steps": 0}}
            for i in range(3):
                await client.send({"jsonrpc": "2.0", "id": f"slow-{i}", "method": "tools/call", "params": call})
            with anyio.fail_after(5):
                while server.pool.connection("rawkit").busy < 3:
                    await anyio.sleep(0.01)
            os.kill(pid, signal.SIGKILL)
            with anyio.fail_after(CALL_TIMEOUT * 0.9):  # sooner than the call timeout: not a timeout
                faults = [await answer.receive() for answer in answers]
            for fault in faults:
                assert fault["result"]["isError"] is True, fault
                text = fault["result"]["content"][0]["text"]
                assert "upstream_error" in text and "exited" in text, text
            assert server.raw.taken == taken + 3
            with anyio.fail_after(5):
                while server.pool.connection("rawkit").busy:
                    await anyio.sleep(0.01)
            await anyio.sleep(0.3)  # past the backoff of the failure
            again = await client.call("rawkit__echo", {"message": "again"})
            assert again["result"]["content"][0]["text"] == "again", again

    anyio.run(scenario)


def test_an_upstream_that_dies_after_half_an_answer_fails_every_call_in_flight(tmp_path: Path) -> None:
    """A raw call waiting (a log call that sleeps), then another whose answer the upstream cuts in the
    middle before it exits: both get the lost-upstream fault at once, nothing hangs."""
    rogue = {"command": sys.executable, "args": [str(ROGUE)], "expose": "direct", "timeouts": {"call": 20}}
    config = tmp_path / "aggregator.yaml"
    config.write_text(json.dumps({"upstreams": {"rogue": rogue}}))

    async def scenario() -> None:
        async with raw_bench(config) as (server, client):
            await client.request("tools/list")  # the direct tools known: the calls below take the raw path
            taken = server.raw.taken
            waiting = client.expect("waiting")
            call = {"name": "rogue__log", "arguments": {"text": "hi", "seconds": 30}}
            await client.send({"jsonrpc": "2.0", "id": "waiting", "method": "tools/call", "params": call})
            with anyio.fail_after(5):
                cut = await client.call("rogue__cut")
                left = await waiting.receive()
            for answer in (cut, left):
                text = answer["result"]["content"][0]["text"]
                assert answer["result"]["isError"] is True and "upstream_error" in text and "exited" in text, text
            assert server.raw.taken == taken + 2

    anyio.run(scenario)


def test_requests_started_from_the_read_callback_keep_every_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Most raw calls start in the client's read callback (`_Inbound.start_now`); what it must not take
    (a reused id in flight, a request for the SDK) still goes through `route` and its rules."""
    started: list[Any] = []
    start_now = stdio._Inbound.start_now

    def counted(self: Any, line: bytes) -> bool:
        taken = start_now(self, line)
        started.append(taken)
        return bool(taken)

    monkeypatch.setattr(stdio._Inbound, "start_now", counted)
    config = twin_config(tmp_path)

    async def scenario() -> None:
        async with raw_bench(config) as (server, client):
            await client.request("tools/list")  # the direct tools known: the calls below take the raw path
            for i in range(5):
                answer = await client.call("rawkit__echo", {"message": f"m{i}"})
                assert answer["result"]["content"][0]["text"] == f"m{i}"
            assert started.count(True) == 4  # the first raw call starts the lane's supervisor, from a task
            answer = await slow_call(server, client, "same")
            duplicates = server.raw.fallbacks.get("duplicate_id", 0)
            reused = await client.request("tools/call", echo("again"), request_id="same")  # the id is in flight
            assert server.raw.fallbacks["duplicate_id"] == duplicates + 1
            assert reused["result"]["content"][0]["text"] == "again"
            await client.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "same"}})
            assert (await client.request("tools/list"))["result"]["tools"]  # the SDK's, from the read callback too
            with anyio.move_on_after(0.2):
                await answer.receive()
                pytest.fail("a cancelled request was answered")

    anyio.run(scenario)


def test_a_line_the_read_callback_leaves_is_read_once_and_judged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `start_now` read and refused goes to `route` with its reading and its rule: one `plain_fields`
    per line (not one more `plain_request` in `parse_client_line`), one `_rule` per refused request (not
    `takes` then `accepts`), and the refusal still counted and answered by the full path."""
    reads: list[bytes] = []
    rules: list[Any] = []
    plain_fields, rule = stdio.plain_fields, RawLane._rule

    def read(line: bytes) -> Any:
        reads.append(line)
        return plain_fields(line)

    def judged(self: RawLane, message: Any) -> Any:
        rules.append(message.id)
        return rule(self, message)

    monkeypatch.setattr(stdio, "plain_fields", read)
    monkeypatch.setattr(stdio, "parse_client_line", lambda line: pytest.fail(f"read twice: {line!r}"))
    monkeypatch.setattr(RawLane, "_rule", judged)
    config = twin_config(tmp_path)

    async def scenario() -> None:
        async with raw_bench(config) as (server, client):
            await client.request("tools/list")  # the direct tools known
            await client.call("rawkit__echo", {"message": "first"})  # the lane's supervisor runs from here on
            reads.clear(), rules.clear()
            targets = server.raw.fallbacks.get("target", 0)
            listing = {"name": "catalog_list_servers", "arguments": {}}
            own = await client.request("tools/call", listing, request_id="own")
            assert "result" in own
            assert (rules, server.raw.fallbacks["target"]) == (["own"], targets + 1)
            assert "result" in await client.request("tools/list", request_id="list")
            await client.send({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"})
            assert "result" in await client.request("ping", request_id="ping")
            assert len(reads) == 4  # each line once

    anyio.run(scenario)


def test_several_clients_at_once_each_get_their_own_answers_and_requests(tmp_path: Path) -> None:
    config = twin_config(tmp_path)
    ask = {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 1}}

    async def scenario() -> None:
        async with raw_clients(config, 2) as (server, (a, b)):
            await a.call("rawkit__echo", {"message": "start"})  # the upstream runs: the next calls go raw
            taken = server.raw.taken
            answers: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}

            async def calls(client: LineClient, tag: str) -> None:
                for i in range(20):  # the same ids on both clients, interleaved
                    answer = await client.request("tools/call", echo(f"{tag}{i}"), request_id=i)
                    answers[tag].append(answer)

            async with anyio.create_task_group() as tg:
                tg.start_soon(calls, a, "a")
                tg.start_soon(calls, b, "b")
            for tag in ("a", "b"):
                assert [x["result"]["content"][0]["text"] for x in answers[tag]] == [f"{tag}{i}" for i in range(20)]
            sampled = await a.call("rawkit__ask", ask)  # asked while a's raw call is in flight: a is asked
            assert "sampled" in json.dumps(sampled)
            assert [r["method"] for r in a.server_requests] == ["sampling/createMessage"]
            assert b.server_requests == []
            assert server.raw.taken == taken + 41

    anyio.run(scenario)


def echo(message: str) -> dict[str, Any]:
    return {"name": "rawkit__echo", "arguments": {"message": message}}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
metas = st.none() | st.fixed_dictionaries(
    {}, optional={"progressToken": json_values, "custom/x": json_values, "io.modelcontextprotocol/y": json_values}
)
calls = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["rawkit__echo", "rawkit__meta", "catalog_call_tool"]),
        "arguments": st.none() | st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    },
    optional={"_meta": metas, "other": json_values},
)
catalog_arguments = st.fixed_dictionaries(
    {"server": st.sampled_from(["rawkit", "RAWKIT", "elsewhere"]), "tool": st.sampled_from(["echo", "meta", "x"])},
    optional={"arguments": json_values},
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(call=calls, catalog=catalog_arguments)
@example(  # the SDK runner's params model refuses a null token that its surface check lets by
    call={"name": "rawkit__echo", "arguments": None, "_meta": {"progressToken": None}},
    catalog={"server": "rawkit", "tool": "echo"},
)
@example(  # Infinity (Python's json writes it) reaches the upstream as null on both paths, as JSON has no such value
    call={"name": "rawkit__meta", "arguments": None, "_meta": {"custom/x": float("inf")}},
    catalog={"server": "rawkit", "tool": "echo"},
)
def test_fuzzed_calls_answer_the_same_on_both_paths(
    bench: Bench, call: dict[str, Any], catalog: dict[str, Any]
) -> None:
    if call["name"] == "catalog_call_tool":
        call["arguments"] = catalog
    name, arguments = call.pop("name"), call.pop("arguments")
    raw, full = both(bench, name, arguments, **call)
    assert raw == full


if sys.platform == "win32":  # pragma: no cover
    pytestmark = pytest.mark.skip("stdio upstreams under the guard: POSIX only")
