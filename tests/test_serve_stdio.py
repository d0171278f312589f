"""`aggregator serve` driven as a host would drive it: a subprocess speaking MCP over stdio,
in front of real upstream subprocesses."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import anyio
import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.conftest import (
    aggregator_client,
    aggregator_env,
    alive,
    example,
    kit_upstream,
    rpc,
    spawn_raw_aggregator,
    structured,
    write_config,
)


async def call(session: ClientSession, name: str, /, **arguments: object) -> types.CallToolResult:
    return await session.call_tool(name, arguments)


async def test_list_describe_call_through_the_catalog(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        {"kit": kit_upstream(description="scriptable test server"), "toolbox": example("toolbox")},
    )
    async with aggregator_client(config) as session:
        listed = await session.list_tools()
        names = {tool.name for tool in listed.tools}
        assert {"catalog_list_servers", "catalog_call_tool", "catalog_search_tools"} <= names
        assert not any(name.startswith("kit__") for name in names)  # catalog exposure: nothing listed directly

        servers = structured(await call(session, "catalog_list_servers"))["servers"]
        assert [s["name"] for s in servers] == ["kit", "toolbox"]
        assert all(s["state"] == "configured" and s["tool_count"] is None for s in servers)  # nothing started

        tools = structured(await call(session, "catalog_list_tools", server="kit"))
        assert "echo" in [item["tool"] for item in tools["items"]]
        assert tools["items"] == sorted(tools["items"], key=lambda item: item["tool"])

        described = structured(await call(session, "catalog_describe_tool", server="kit", tool="add"))
        assert described["required"] == ["a", "b"]
        assert described["call_example"]["arguments"]["tool"] == "add"

        result = await call(session, "catalog_call_tool", server="kit", tool="echo", arguments={"message": "hi"})
        assert not result.is_error
        assert result.content[0].text == "hi"
        any_case = await call(session, "catalog_call_tool", server="KIT", tool="echo", arguments={"message": "ci"})
        assert any_case.content[0].text == "ci"  # server names match ignoring case, as in the config

        toolbox_tools = structured(await call(session, "catalog_list_tools", server="toolbox", limit=200))
        assert toolbox_tools["total"] >= 15


async def test_results_pass_through_untouched(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream()})
    async with aggregator_client(config) as session:
        image = await call(session, "catalog_call_tool", server="kit", tool="image", arguments={})
        assert [block.type for block in image.content] == ["image", "text"]
        assert image.content[0].mime_type == "image/png" and image.content[0].data

        added = await call(session, "catalog_call_tool", server="kit", tool="add", arguments={"a": 2, "b": 3})
        assert added.structured_content == {"sum": 5} or added.structured_content["sum"] == 5

        structured_result = await call(session, "catalog_call_tool", server="kit", tool="structured", arguments={})
        assert structured_result.structured_content["nested"] == {"ok": True}

        failed = await call(session, "catalog_call_tool", server="kit", tool="fail", arguments={"message": "boom"})
        assert failed.is_error
        assert "boom" in failed.content[0].text
        assert failed.structured_content is None  # the upstream's own error, not our fault shape


async def test_progress_reaches_the_client(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream()})
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    async with aggregator_client(config) as session:
        result = await session.call_tool(
            "catalog_call_tool",
            {"server": "kit", "tool": "slow", "arguments": {"seconds": 0.6, "steps": 3}},
            progress_callback=on_progress,
        )
        assert not result.is_error
        await anyio.sleep(0.2)  # progress callbacks run in their own tasks
    assert len(seen) >= 2


async def test_progress_extends_the_call_deadline_and_silence_times_out(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream(timeouts={"call": 0.8})})
    async with aggregator_client(config) as session:
        # 2 s in total, but a progress every 0.4 s keeps restarting the 0.8 s deadline
        ok = await call(session, "catalog_call_tool", server="kit", tool="slow", arguments={"seconds": 2, "steps": 5})
        assert not ok.is_error, ok
        # 2 s with no progress at all: our deadline fires
        started = time.monotonic()
        late = await call(session, "catalog_call_tool", server="kit", tool="slow", arguments={"seconds": 2, "steps": 0})
        assert late.is_error
        assert late.structured_content["error"]["reason"] == "timeout"
        assert time.monotonic() - started < 1.8
        # the upstream is still fine afterwards
        echo = await call(session, "catalog_call_tool", server="kit", tool="echo", arguments={"message": "x"})
        assert echo.content[0].text == "x"


async def test_client_cancellation_reaches_the_upstream(tmp_path: Path) -> None:
    log = tmp_path / "events.log"
    config = write_config(tmp_path, {"kit": kit_upstream("--event-log", str(log))})
    async with aggregator_client(config) as session:
        await call(session, "catalog_call_tool", server="kit", tool="echo", arguments={"message": "warm"})
        with anyio.move_on_after(0.5):
            await call(session, "catalog_call_tool", server="kit", tool="slow", arguments={"seconds": 5, "steps": 0})
        for _ in range(100):
            if log.exists() and "cancelled" in log.read_text():
                break
            await anyio.sleep(0.05)
        assert "cancelled" in log.read_text()
        echo = await call(session, "catalog_call_tool", server="kit", tool="echo", arguments={"message": "after"})
        assert echo.content[0].text == "after"


async def test_crash_mid_call_then_restart_after_backoff(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream()})
    async with aggregator_client(config) as session:
        first_pid = (await call(session, "catalog_call_tool", server="kit", tool="pid", arguments={})).content[0].text
        crashed = await call(session, "catalog_call_tool", server="kit", tool="crash", arguments={})
        assert crashed.is_error
        error = crashed.structured_content["error"]
        assert error["kind"] == "world"
        assert "stderr" in error["message"]  # the tail of the child's stderr says why

        at_once = await call(session, "catalog_call_tool", server="kit", tool="echo", arguments={"message": "x"})
        assert at_once.is_error and at_once.structured_content["error"]["reason"] == "upstream_unavailable"

        await anyio.sleep(0.3)  # first backoff window is 100 ms
        again = await call(session, "catalog_call_tool", server="kit", tool="pid", arguments={})
        assert not again.is_error
        assert again.content[0].text != first_pid

        servers = structured(await call(session, "catalog_list_servers"))["servers"]
        assert servers[0]["state"] == "ready"


async def test_missing_command_is_upstream_unavailable_with_the_reason(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"ghost": {"command": "/nonexistent/mcp-server-ghost"}})
    async with aggregator_client(config) as session:
        result = await call(session, "catalog_list_tools", server="ghost")
        assert result.is_error
        error = result.structured_content["error"]
        assert error["reason"] == "upstream_unavailable"
        assert "not found" in error["message"] and "mcp-server-ghost" in error["message"]


async def test_failed_start_reports_stderr_and_hung_handshake_times_out(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        {
            "dies": kit_upstream("--exit-at-start"),
            "hangs": kit_upstream("--hang-initialize", timeouts={"connect": 0.5}),
        },
    )
    async with aggregator_client(config) as session:
        dies = structured(await call(session, "catalog_list_tools", server="dies"))["error"]
        assert dies["reason"] == "upstream_unavailable" and "stderr" in dies["message"]
        started = time.monotonic()
        hangs = structured(await call(session, "catalog_list_tools", server="hangs"))["error"]
        assert hangs["reason"] == "upstream_unavailable" and "handshake" in hangs["message"]
        assert time.monotonic() - started < 3


async def test_malformed_tools_are_dropped_not_the_list(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream("--malformed", expose="direct")})
    async with aggregator_client(config) as session:
        items = structured(await call(session, "catalog_list_tools", server="kit", limit=200))["items"]
        names = {item["tool"] for item in items}
        assert {"echo", "add"} <= names
        assert "bad_schema_string" not in names
        # a schema without "type" is repaired, so strict clients accept the listing
        listed = await session.list_tools()
        assert "kit__echo" in {tool.name for tool in listed.tools}


async def test_pagination_is_followed(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream("--page-size", "7", "--tools", "40")})
    async with aggregator_client(config) as session:
        page = structured(await call(session, "catalog_list_tools", server="kit", limit=10, offset=5))
        assert page["total"] >= 40 + 10
        assert page["truncated"] is True and page["next_offset"] == 15


async def test_unknown_server_tool_and_bad_arguments_are_programmer_faults(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream()})
    async with aggregator_client(config) as session:
        cases = [
            ("catalog_list_tools", {"server": "nope"}, "unknown_server"),
            ("catalog_call_tool", {"server": "kit", "tool": "nope", "arguments": {}}, "unknown_tool"),
            ("catalog_call_tool", {"server": "kit", "tool": "echo", "arguments": "x"}, "invalid_argument"),
            ("catalog_list_tools", {"server": "kit", "limit": 0}, "invalid_argument"),
            ("catalog_list_tools", {"server": "kit", "limit": "5"}, "invalid_argument"),
            ("catalog_describe_tool", {"server": "kit"}, "invalid_argument"),
        ]
        for tool, arguments, reason in cases:
            result = await session.call_tool(tool, arguments)
            assert result.is_error, (tool, arguments)
            error = result.structured_content["error"]
            assert (error["kind"], error["reason"]) == ("programmer", reason), (tool, arguments, error)


async def test_direct_exposure_and_list_changed(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream(expose="direct", tools={"deny": ["crash"]})})
    notifications: list[object] = []

    async def on_message(message: object) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            notifications.append(message)

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "aggregator", "serve", "--config", str(config)],
        env=aggregator_env(),
    )
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, message_handler=on_message) as s,
    ):
        init = await s.initialize()
        assert init.capabilities.tools.list_changed is True
        names = {tool.name for tool in (await s.list_tools()).tools}
        assert "kit__echo" in names and "kit__crash" not in names
        result = await s.call_tool("kit__add", {"a": 1, "b": 2})
        assert result.structured_content["sum"] == 3
        before = len(notifications)
        await s.call_tool("kit__set_tools", {"names": ["brand_new"]})
        with anyio.fail_after(5):
            while len(notifications) == before:
                await anyio.sleep(0.02)
        assert "kit__brand_new" in {tool.name for tool in (await s.list_tools()).tools}


@pytest.mark.parametrize("how", ["eof", "sigterm", "sigint"])
async def test_no_child_process_left_after_shutdown(tmp_path: Path, how: str) -> None:
    pid_file = tmp_path / "grandchild.pid"
    config = write_config(tmp_path, {"kit": kit_upstream("--spawn-grandchild", "--pid-file", str(pid_file))})
    proc = spawn_raw_aggregator(config)
    assert proc.stdin
    called = rpc(proc, 1, "tools/call", {"name": "catalog_call_tool", "arguments": {"server": "kit", "tool": "pid"}})
    upstream_pid = int(called["result"]["content"][0]["text"])
    grandchild = int(pid_file.read_text())
    assert alive(upstream_pid) and alive(grandchild)

    if how == "eof":
        proc.stdin.close()
    else:
        proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGINT)
    assert proc.wait(timeout=15) in (0, 130, -signal.SIGINT)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (alive(upstream_pid) or alive(grandchild)):
        time.sleep(0.05)
    assert not alive(upstream_pid), "upstream survived"
    assert not alive(grandchild), "grandchild in the upstream's process group survived"


async def test_modern_protocol_era_client(tmp_path: Path) -> None:
    """A 2026-07-28 client (server/discover, per-request _meta) gets the same tools and results."""
    from mcp import Client

    config = write_config(tmp_path, {"kit": kit_upstream()})
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "aggregator", "serve", "--config", str(config)], env=aggregator_env()
    )
    async with Client(params, mode="auto") as client:
        assert client.protocol_version >= "2026"
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert "catalog_call_tool" in names
        result = await client.call_tool(
            "catalog_call_tool", {"server": "kit", "tool": "echo", "arguments": {"message": "modern"}}
        )
        assert result.content[0].text == "modern"


async def test_direct_tools_survive_a_crash_and_restart_the_upstream(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream(expose="direct")})
    async with aggregator_client(config) as session:
        assert "kit__echo" in {tool.name for tool in (await session.list_tools()).tools}
        crashed = await session.call_tool("kit__crash", {})
        assert crashed.is_error
        assert "kit__echo" in {tool.name for tool in (await session.list_tools()).tools}  # still listed
        await anyio.sleep(0.3)
        echo = await session.call_tool("kit__echo", {"message": "back"})
        assert not echo.is_error and echo.content[0].text == "back"


async def test_modern_client_hears_tools_list_changed_through_listen(tmp_path: Path) -> None:
    from mcp import Client

    config = write_config(tmp_path, {"kit": kit_upstream(expose="direct")})
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "aggregator", "serve", "--config", str(config)], env=aggregator_env()
    )
    async with Client(params, mode="auto") as client:
        assert "kit__echo" in {tool.name for tool in (await client.list_tools()).tools}
        async with client.listen(tools_list_changed=True) as subscription:
            await client.call_tool("kit__set_tools", {"names": ["modern_new"]})
            with anyio.fail_after(5):
                async for _event in subscription:
                    if "kit__modern_new" in {tool.name for tool in (await client.list_tools()).tools}:
                        break
