"""The raw lane's route straight to a running upstream's raw leg (`RawRouter.route_of`, `pool.ToolRoute`).

A `tools/call` to `catalog_call_tool` or a direct tool whose upstream runs and lists the tool skips the
handler layers (`call_tool_for` → `CatalogTools.call_tool` → pool → connection). These tests attack what
the route keeps from them: the connection, catalog and exposure it was made for changing under it (a
config reload, a tool that vanished, a kill between the lookup and the write), and two clients at once.
`tests/test_raw_path.py` compares its answers with the full path's.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from aggregator.config import load_config
from aggregator.faults import Fault
from aggregator.proxy.raw import RawRouter
from aggregator.proxy.server import AggregatorServer
from tests.conftest import kit_upstream
from tests.raw_harness import LineClient, raw_bench, raw_clients

CALL_TIMEOUT = 2.0


def kit_config(directory: Path, **extra: Any) -> Path:
    """One testkit upstream `kit`, exposed directly, logging its events."""
    entry = kit_upstream("--event-log", str(directory / "kit.events"), expose="direct", **extra)
    entry["timeouts"] = {"call": CALL_TIMEOUT}
    config = directory / "aggregator.yaml"
    config.write_text(json.dumps({"upstreams": {"kit": entry}}))
    return config


def text(answer: dict[str, Any]) -> str:
    return str(answer["result"]["content"][0]["text"])


def via_catalog(tool: str, arguments: Any, server: str = "kit") -> dict[str, Any]:
    return {"server": server, "tool": tool, "arguments": arguments}


async def until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    with anyio.fail_after(seconds):
        while not condition():
            await anyio.sleep(0.02)


def lists(server: AggregatorServer, tool: str, listed: bool = True) -> Callable[[], bool]:
    """Whether the running kit's catalog lists `tool` (`listed`) or not."""

    def check() -> bool:
        live = server.pool.store.live("kit")
        return live is not None and (live.tool(tool) is not None) == listed

    return check


async def started(server: AggregatorServer, client: LineClient) -> int:
    """The upstream started (a first call, by the layers: nothing runs yet) and its pid."""
    return int(text(await client.call("kit__pid")))


def test_calls_to_a_running_upstream_go_by_the_route_with_the_layers_bookkeeping(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with raw_bench(kit_config(tmp_path)) as (server, client):
            await started(server, client)
            results: list[str] = []
            noted = server.pool.on_call_result
            server.pool.on_call_result = lambda name, result: (results.append(name), noted(name, result))
            routed, sent = server.raw.routed, server.pool.connection("kit").raw_requests
            assert text(await client.call("kit__echo", {"message": "direct"})) == "direct"
            assert text(await client.call("catalog_call_tool", via_catalog("echo", {"message": "c"}))) == "c"
            upper = await client.call("catalog_call_tool", via_catalog("echo", {"message": "u"}, server="KIT"))
            assert text(upper) == "u"  # the server's name matched ignoring case, as the layers match it
            no_arguments = await client.call("catalog_call_tool", {"server": "kit", "tool": "pid", "arguments": None})
            assert int(text(no_arguments)) > 0
            assert server.raw.routed == routed + 4
            assert results == ["kit"] * 4  # on_call_result saw each (resource links become readable)
            kept = len(server.raw._routes)
            for spelling in ("kIt", "KiT", "kIT", "Kit"):  # routes are kept per upstream, not per spelling
                await client.call("catalog_call_tool", via_catalog("echo", {"message": "m"}, server=spelling))
            assert len(server.raw._routes) == kept
            routed, sent = routed + 4, sent + 4
            assert server.pool.connection("kit").raw_requests == sent + 4
            assert not server.pool._busy and not server.pool.connection("kit").busy

            # what the route cannot answer goes to the layers, which answer as before
            for arguments, reason in (
                (via_catalog("nope", {}), "unknown_tool"),
                (via_catalog("echo", 5), "invalid_argument"),
                ({"server": "kit"}, "invalid_argument"),
                (via_catalog("echo", {}, server="elsewhere"), "unknown_server"),
            ):
                answer = await client.call("catalog_call_tool", arguments)
                assert answer["result"]["structuredContent"]["error"]["reason"] == reason, answer
            assert "no tool named" in text(await client.call("kit__nope"))
            assert server.raw.routed == routed + 4
            assert server.pool.connection("kit").raw_requests == sent + 4  # none of them reached the upstream

    anyio.run(scenario)


def test_a_fault_on_the_route_is_the_layers_fault(tmp_path: Path) -> None:
    """A silent upstream: the same `timeout` fault, and the upstream told; an error answer: `upstream_error`."""

    async def scenario() -> None:
        async with raw_bench(kit_config(tmp_path)) as (server, client):
            await started(server, client)
            routed = server.raw.routed
            silent = await client.call("kit__slow", {"seconds": CALL_TIMEOUT * 3, "steps": 0}, timeout=CALL_TIMEOUT * 3)
            fault = silent["result"]["structuredContent"]["error"]
            assert fault["reason"] == "timeout" and "kit/slow did not answer within 2s" in fault["message"], fault
            refused = await client.call("kit__reply", {"error": {"code": -32000, "message": "no"}})
            assert refused["result"]["structuredContent"]["error"]["reason"] == "upstream_error"
            assert server.raw.routed == routed + 2
            await until(lambda: "cancelled agg-" in (tmp_path / "kit.events").read_text())

    anyio.run(scenario)


def test_a_reload_mid_call_lets_the_routed_call_finish_and_moves_the_next_ones(tmp_path: Path) -> None:
    """The config changes while a routed call runs: it finishes on the old upstream (the pool's busy count
    keeps that one until then); the next call does not take the stale route, and the route after it is
    the new upstream's. An exposure change drops the direct name's route at once."""
    config = kit_config(tmp_path)

    async def scenario() -> None:
        async with raw_bench(config) as (server, client):
            old_pid = await started(server, client)
            old = server.pool.connection("kit")
            slow = client.expect("slow")
            call = {"name": "kit__slow", "arguments": {"seconds": 0.6, "steps": 0}}
            await client.send({"jsonrpc": "2.0", "id": "slow", "method": "tools/call", "params": call})
            await until(lambda: old.busy == 1)
            changed = json.loads(config.read_text())
            changed["upstreams"]["kit"]["description"] = "changed"
            server.pool.apply_config(load_config(_written(tmp_path, changed)))
            assert server.pool.connection("kit") is not old
            with anyio.fail_after(5):
                assert text(await slow.receive()) == "slept 0.6s in 0 steps"
            new_pid = int(text(await client.call("catalog_call_tool", via_catalog("pid", {}))))
            assert new_pid != old_pid
            routed = server.raw.routed
            assert int(text(await client.call("kit__pid"))) == new_pid
            assert server.raw.routed == routed + 1  # a new route, to the new upstream

            catalog_only = json.loads(config.read_text())
            catalog_only["upstreams"]["kit"]["description"] = "changed"
            catalog_only["upstreams"]["kit"]["expose"] = "catalog"
            server.pool.apply_config(load_config(_written(tmp_path, catalog_only)))
            assert "no tool named" in text(await client.call("kit__echo", {"message": "gone"}))
            assert text(await client.call("catalog_call_tool", via_catalog("echo", {"message": "still"}))) == "still"

    anyio.run(scenario)


def _written(directory: Path, config: dict[str, Any]) -> Path:
    path = directory / "changed.yaml"
    path.write_text(json.dumps(config))
    return path


def test_a_tool_that_vanished_is_unknown_and_never_sent(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with raw_bench(kit_config(tmp_path)) as (server, client):
            await started(server, client)
            await client.call("kit__set_tools", {"names": ["extra_one"]})
            await until(lists(server, "extra_one"))
            assert text(await client.call("catalog_call_tool", via_catalog("extra_one", {"message": "x"}))) == "x"
            assert text(await client.call("kit__extra_one", {"message": "y"})) == "y"
            await client.call("kit__set_tools", {"names": []})
            await until(lists(server, "extra_one", listed=False))
            sent = server.pool.connection("kit").raw_requests
            gone = await client.call("catalog_call_tool", via_catalog("extra_one", {"message": "x"}))
            assert gone["result"]["structuredContent"]["error"]["reason"] == "unknown_tool"
            assert "no tool named" in text(await client.call("kit__extra_one", {"message": "y"}))
            assert server.pool.connection("kit").raw_requests == sent

    anyio.run(scenario)


def test_an_upstream_killed_between_the_route_lookup_and_the_write(tmp_path: Path) -> None:
    """The route is current when looked up; the upstream dies before the request is written: the call
    fails with the lost-upstream fault at once (no hang), the route is then stale, and after the backoff
    the next call starts the upstream again and gets a new route."""

    async def scenario() -> None:
        async with raw_bench(kit_config(tmp_path)) as (server, client):
            pid = await started(server, client)
            params = {"name": "catalog_call_tool", "arguments": via_catalog("echo", {"message": "late"})}
            routed = server.raw.route_of(params)
            assert routed is not None and routed[0].current()
            route, arguments = routed
            os.kill(pid, signal.SIGKILL)
            with anyio.fail_after(CALL_TIMEOUT * 0.9), pytest.raises(Fault) as lost:  # sooner than a timeout
                await route.call(arguments, None, None, None)
            assert lost.value.reason == "upstream_error", lost.value
            await until(lambda: not route.current())
            assert server.raw.route_of(params) is None
            assert not server.pool._busy and not server.pool.connection("kit").busy
            await anyio.sleep(0.3)  # past the backoff
            assert text(await client.call("catalog_call_tool", via_catalog("echo", {"message": "again"}))) == "again"
            again = server.raw.route_of(params)
            assert again is not None and again[0] is not route

    anyio.run(scenario)


def test_an_upstream_dead_when_the_lane_writes_the_routed_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the lane: the upstream is killed (and gone) right after the lane's rules found the route,
    before the call's task writes the request: the client gets the lost-upstream fault, not a hang."""

    async def scenario() -> None:
        async with raw_bench(kit_config(tmp_path)) as (server, client):
            pid = await started(server, client)
            route_of = RawRouter.route_of

            def then_killed(self: RawRouter, params: Any) -> Any:
                found = route_of(self, params)
                if found is not None and params.get("arguments", {}).get("message") == "doomed":
                    os.kill(pid, signal.SIGKILL)
                    time.sleep(0.3)  # the loop is held: nothing has seen it die when the request is written
                return found

            monkeypatch.setattr(RawRouter, "route_of", then_killed)
            routed = server.raw.routed
            with anyio.fail_after(CALL_TIMEOUT * 0.9):  # sooner than a timeout
                answer = await client.call("kit__echo", {"message": "doomed"})
            assert server.raw.routed == routed + 1
            fault = answer["result"]["structuredContent"]["error"]
            assert fault["reason"] == "upstream_error" and "exited" in fault["message"], fault
            assert not server.pool._busy and not server.pool.connection("kit").busy

    anyio.run(scenario)


def test_two_clients_interleaving_while_the_catalog_changes(tmp_path: Path) -> None:
    """Two clients call by routes with the same ids at once while the upstream's catalog changes twice
    under them (each change drops every route): each gets exactly its own answers, in order."""

    async def scenario() -> None:
        async with raw_clients(kit_config(tmp_path), 3) as (server, (a, b, c)):
            await started(server, a)
            routed, stale_before = server.raw.routed, server.raw.stale_routes
            answers: dict[str, list[str]] = {"a": [], "b": []}
            churned = anyio.Event()

            async def calls(client: LineClient, tag: str) -> None:
                i = 0
                while i < 30 or not churned.is_set():
                    message = {"message": f"{tag}{i}"}
                    if i % 2:
                        params = {"name": "kit__echo", "arguments": message}
                    else:
                        params = {"name": "catalog_call_tool", "arguments": via_catalog("echo", message)}
                    answers[tag].append(text(await client.request("tools/call", params, request_id=i)))
                    i += 1

            async def churn() -> None:
                for i in range(2):
                    await c.call("kit__set_tools", {"names": [f"churn_{i}"]})
                    await until(lists(server, f"churn_{i}"))
                churned.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(calls, a, "a")
                tg.start_soon(calls, b, "b")
                tg.start_soon(churn)
            for tag in ("a", "b"):
                assert answers[tag] == [f"{tag}{i}" for i in range(len(answers[tag]))]
            total = len(answers["a"]) + len(answers["b"])
            # every call (the set_tools ones too) by a route, but one let in on a route a catalog change made
            # stale before it ran (at most one per client and change), which the layers took
            stale = server.raw.stale_routes - stale_before
            assert server.raw.routed + stale == routed + total + 2 and stale <= 4, (server.raw.routed, stale)
            assert not server.pool._busy and not server.pool.connection("kit").busy

    anyio.run(scenario)


def test_a_bug_on_the_route_answers_as_the_layers_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unexpected exception of ours on the route is the call's error result (redacted, the session goes
    on), as the layers' `_run_tool` gives it, not a JSON-RPC error."""
    from aggregator.upstream.pool import ToolRoute

    async def broken(*_args: Any, **_kwargs: Any) -> dict[str, Any]:
        raise RuntimeError("boom with token=sk-abcdefghijklmnopqrstuvwx")

    async def scenario() -> None:
        async with raw_bench(kit_config(tmp_path)) as (server, client):
            await started(server, client)
            routed = server.raw.routed
            monkeypatch.setattr(ToolRoute, "call", broken)
            answer = await client.call("kit__echo", {"message": "hi"})
            assert answer["result"]["isError"] is True, answer
            message = text(answer)
            assert "internal error in aggregator tool kit__echo: RuntimeError: boom" in message, message
            assert "sk-abcdefghijklmnopqrstuvwx" not in message, message
            assert server.raw.routed == routed + 1
            monkeypatch.undo()
            assert text(await client.call("kit__echo", {"message": "again"})) == "again"

    anyio.run(scenario)
