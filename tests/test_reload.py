"""Hot reload: config edits (and SIGHUP) applied to a running pool and a live `aggregator serve`."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from aggregator.config import AggregatorConfig, parse_config
from aggregator.config.watch import watch_config
from aggregator.upstream.pool import UpstreamPool
from tests.conftest import aggregator_env, alive, kit_upstream, structured, write_config

WAIT = 30.0  # generous: the machine is shared


def config_of(upstreams: dict[str, Any]) -> AggregatorConfig:
    return parse_config(json.dumps({"upstreams": upstreams}), "test.yaml")


async def eventually(check: Any) -> None:
    with anyio.fail_after(WAIT):
        while not check():
            await anyio.sleep(0.05)


def text_of(result: Any) -> str:
    return "".join(block["text"] for block in result["content"] if block["type"] == "text")


# ---------------------------------------------------------------- the pool


async def test_apply_config_adds_removes_replaces_and_leaves_the_rest(tmp_path: Path) -> None:
    same, changed = kit_upstream(), kit_upstream("--tag", "v1")
    async with UpstreamPool.running(config_of({"same": same, "changed": changed, "gone": kit_upstream()})) as pool:
        same_conn, changed_conn = pool.connection("same"), pool.connection("changed")
        pids = {n: int(text_of(await pool.call_tool(n, "pid", {}))) for n in ("same", "changed", "gone")}
        slow: dict[str, Any] = {}

        async def slow_call(name: str) -> None:
            slow[name] = await pool.call_tool(name, "slow", {"seconds": 1.5})

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_call, "same")
            tg.start_soon(slow_call, "changed")
            await anyio.sleep(0.3)  # both calls are in flight
            diff = pool.apply_config(
                config_of({"same": same, "changed": kit_upstream("--tag", "v2"), "new": kit_upstream()})
            )
        assert (diff.added, diff.removed, diff.changed) == (["new"], ["gone"], ["changed"])
        assert text_of(slow["same"]) == text_of(slow["changed"]) == "slept 1.5s in 1 steps"  # calls in flight completed
        assert pool.connection("same") is same_conn and pool.connection("changed") is not changed_conn
        assert pool.upstream_names() == ["changed", "new", "same"]
        assert pool.status("changed").state == "configured"  # restarted on the next need
        new_pid = int(text_of(await pool.call_tool("changed", "pid", {})))
        assert new_pid != pids["changed"] and int(text_of(await pool.call_tool("same", "pid", {}))) == pids["same"]
        await eventually(lambda: not alive(pids["changed"]) and not alive(pids["gone"]))
        assert pool.store.get("gone") is None


async def test_removed_upstream_leaves_no_process_behind(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    config = config_of({"kit": kit_upstream("--spawn-grandchild", "--pid-file", str(pid_file))})
    async with UpstreamPool.running(config) as pool:
        pid = int(text_of(await pool.call_tool("kit", "pid", {})))
        grandchild = int(pid_file.read_text())
        assert alive(pid) and alive(grandchild)
        pool.apply_config(config_of({}))
        await eventually(lambda: not alive(pid) and not alive(grandchild))


async def test_watch_config_applies_edits_keeps_broken_ones_and_hears_sighup(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"a": kit_upstream()})
    seen: list[list[str]] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: watch_config(path, lambda c: seen.append(list(c.upstreams)), poll=0.05))
        await anyio.sleep(0.2)
        write_config(tmp_path, {"a": kit_upstream(), "b": kit_upstream()})
        await eventually(lambda: seen == [["a", "b"]])
        path.write_text("upstreams: [broken\n")
        await anyio.sleep(1.0)
        assert seen == [["a", "b"]]  # the broken edit was not applied
        tg.cancel_scope.cancel()
    async with anyio.create_task_group() as tg:
        write_config(tmp_path, {"c": kit_upstream()})
        tg.start_soon(lambda: watch_config(path, lambda c: seen.append(list(c.upstreams)), poll=3600))
        await anyio.sleep(0.2)
        os.kill(os.getpid(), signal.SIGHUP)
        await eventually(lambda: seen[-1] == ["c"])
        tg.cancel_scope.cancel()


# ---------------------------------------------------------------- a live `aggregator serve` with a client


@pytest.mark.slow
async def test_live_serve_reloads_with_a_client_attached(tmp_path: Path) -> None:
    pid_file = tmp_path / "direct.pid"
    base = {"kit": kit_upstream(description="kit")}
    path = write_config(tmp_path, base)
    changed = anyio.Event()
    stderr_path = tmp_path / "serve.stderr"

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    params = StdioServerParameters(
        command=sys.executable, args=["-m", "aggregator", "serve", "--config", str(path)], env=aggregator_env()
    )
    with stderr_path.open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write, message_handler=on_message) as session,
        ):
            await session.initialize()

            async def tool_names() -> set[str]:
                return {tool.name for tool in (await session.list_tools()).tools}

            async def servers() -> list[str]:
                return [s["name"] for s in structured(await session.call_tool("catalog_list_servers", {}))["servers"]]

            async def call(server: str, tool: str, **arguments: Any) -> Any:
                args = {"server": server, "tool": tool, "arguments": arguments}
                return await session.call_tool("catalog_call_tool", args)

            before = await tool_names()
            kit_pid = int((await call("kit", "pid")).content[0].text)

            # add: a directly exposed upstream appears, and the client hears list_changed
            direct = kit_upstream("--spawn-grandchild", "--pid-file", str(pid_file), expose="direct")
            write_config(tmp_path, {**base, "direct": direct})
            with anyio.fail_after(WAIT):
                await changed.wait()
            assert await servers() == ["direct", "kit"]
            assert "direct__echo" in await tool_names()
            direct_pid = int((await call("direct", "pid")).content[0].text)
            grandchild = int(pid_file.read_text())

            # change kit while a call to it runs: the call completes, the next call runs a new process
            async with anyio.create_task_group() as tg:
                slow: list[Any] = []

                async def run_slow() -> None:
                    slow.append(await call("kit", "slow", seconds=2))

                tg.start_soon(run_slow)
                await anyio.sleep(0.5)
                write_config(tmp_path, {"kit": kit_upstream("--tag", "v2", description="kit v2"), "direct": direct})
            assert slow[0].is_error is False and slow[0].content[0].text == "slept 2s in 1 steps"
            await eventually(lambda: not alive(kit_pid))
            assert int((await call("kit", "pid")).content[0].text) != kit_pid

            # a broken edit: logged in one line, the running config stays
            path.write_text("upstreams: {kit: {comand: x}}\n")
            await anyio.sleep(1.5)
            assert await servers() == ["direct", "kit"]
            assert "config reload failed" in stderr_path.read_text()

            # remove the direct upstream: its tools go, list_changed, its process group ends
            changed = anyio.Event()  # (listing after the add started it: that was a list_changed too)
            write_config(tmp_path, {"kit": kit_upstream("--tag", "v2", description="kit v2")})
            with anyio.fail_after(WAIT):
                await changed.wait()
            assert await tool_names() == before
            assert await servers() == ["kit"]
            await eventually(lambda: not alive(direct_pid) and not alive(grandchild))
    lines = [line for line in stderr_path.read_text().splitlines() if "config reload failed" in line]
    assert len(lines) == 1 and "upstreams.kit.comand" in lines[0]
