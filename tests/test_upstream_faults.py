"""Issue 11, upstream side: upstreams that misbehave on purpose (real subprocesses, real stdio/HTTP).

Each test reproduces one way an upstream used to crash, hang or lock out the aggregator.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from aggregator.examples.testkit import nested

from aggregator.faults import Fault
from aggregator.upstream.pool import UpstreamPool
from tests.conftest import (
    EXAMPLES,
    aggregator_client,
    aggregator_env,
    alive,
    free_port,
    kit_upstream,
    rpc,
    spawn_raw_aggregator,
    structured,
    wait_for_port,
    write_config,
)
from tests.test_pool import config_of, toolbox_over

# A call that is not answered at once waits this long before the test fails; far below the 60 s
# call timeout the bugs used to wait out, far above any honest answer even on a loaded machine.
PROMPT = 30


async def call_fault(pool: UpstreamPool, server: str, tool: str, arguments: dict[str, Any]) -> Fault:
    with anyio.fail_after(PROMPT), pytest.raises(Fault) as caught:
        await pool.call_tool(server, tool, arguments)
    return caught.value


async def test_list_changed_after_every_listing_is_rate_limited(tmp_path: Path) -> None:
    """Case 1: an upstream answering every tools/list with list_changed must not be re-listed in a loop."""
    events = tmp_path / "events.log"
    config = config_of({"storm": kit_upstream("--list-changed-storm", "--event-log", str(events))})
    async with UpstreamPool.running(config) as pool:
        await pool.ensure_catalog("storm")
        await anyio.sleep(3)
        listings = events.read_text().count("tools/list")
        assert await pool.call_tool("storm", "echo", {"message": "still here"})
    # A loop re-lists hundreds of times a second; the rate limit allows about one a second, doubling.
    assert 2 <= listings <= 8, listings


async def test_jsonrpc_error_is_an_answer_not_a_lost_connection(tmp_path: Path) -> None:
    """Case 3: -32000 from the upstream is its answer; the connection, catalog and other calls stay."""
    config = config_of({"kit": kit_upstream()})
    async with UpstreamPool.running(config) as pool:
        pid = (await pool.call_tool("kit", "pid", {}))["content"][0]["text"]
        async with anyio.create_task_group() as tg:
            slow: list[dict[str, Any]] = []

            async def slow_call() -> None:
                slow.append(await pool.call_tool("kit", "slow", {"seconds": 1}))

            tg.start_soon(slow_call)
            await anyio.sleep(0.2)
            error = {"code": -32000, "message": "quota exceeded for today"}
            fault = await call_fault(pool, "kit", "reply", {"error": error})
        assert fault.reason == "upstream_error"
        assert "-32000" in fault.message and "quota exceeded for today" in fault.message
        assert slow and not slow[0].get("isError")
        assert pool.status("kit").state == "ready" and pool.store.get("kit") is not None
        assert (await pool.call_tool("kit", "pid", {}))["content"][0]["text"] == pid  # not restarted


async def test_deeply_nested_tool_schema_drops_that_tool_only(tmp_path: Path) -> None:
    """Case 4: a schema nested ~130 levels used to lose the whole catalog after the connect timeout."""
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps([{"name": "medium", "inputSchema": nested(25)}]))  # 51 levels: fine
    kit = kit_upstream("--deep-tool", "130", "--extra-tools", str(extra), timeouts={"connect": 60})
    async with UpstreamPool.running(config_of({"kit": kit})) as pool:
        with anyio.fail_after(PROMPT):
            catalog = await pool.ensure_catalog("kit")
        assert catalog.tool("echo") is not None and catalog.tool("medium") is not None
        assert catalog.tool("deep") is None
        assert any("deep" in reason and "nested" in reason for reason in catalog.dropped)


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"nest": 250}, "nested"),
        ({"result": 5}, "invalid"),
        ({"result": [1, 2]}, "invalid"),
        ({"error": "boom"}, "invalid"),
        ({"error": {"message": 7}}, "invalid"),
        ({"line": '{"jsonrpc": "2.0", "id": ID, "result": {"content": [}'}, "invalid"),
    ],
)
async def test_unreadable_answer_is_a_fault_at_once(arguments: dict[str, Any], expected: str) -> None:
    """Case 5: an answer that cannot be read used to be dropped, and the call waited out its timeout."""
    config = config_of({"kit": kit_upstream(timeouts={"call": 600})})
    async with UpstreamPool.running(config) as pool:
        fault = await call_fault(pool, "kit", "reply", arguments)
        assert fault.reason == "upstream_error" and expected in fault.message
        assert (await pool.call_tool("kit", "echo", {"message": "ok"}))["content"][0]["text"] == "ok"


async def test_missing_cwd_is_reported_as_such(tmp_path: Path) -> None:
    """Case 17: a cwd that does not exist used to be reported as "command not found"."""
    missing = tmp_path / "no" / "such" / "dir"
    config = config_of({"kit": kit_upstream(cwd=str(missing))})
    async with UpstreamPool.running(config) as pool:
        with pytest.raises(Fault) as caught:
            await pool.ensure_catalog("kit")
    assert "working directory" in caught.value.message and str(missing) in caught.value.message
    assert "command not found" not in caught.value.message


BROKEN_TOOL = {"name": "broken", "inputSchema": {"type": "object", "required": "x", "properties": {"a": 5}}}


async def test_malformed_direct_tool_does_not_empty_tools_list(tmp_path: Path) -> None:
    """Case 2: one broken tool on a direct upstream used to fail the whole tools/list with -32603."""
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps([BROKEN_TOOL]))
    config = write_config(tmp_path, {"kit": kit_upstream("--extra-tools", str(extra), expose="direct")})
    async with aggregator_client(config) as session:
        names = {tool.name for tool in (await session.list_tools()).tools}
    assert "catalog_search_tools" in names and "kit__echo" in names
    assert "kit__broken" not in names


@pytest.mark.parametrize("result", [{}, {"content": "not a list"}, {"content": [{"type": "nonsense"}]}])
async def test_result_invalid_per_schema_is_a_fault_result(tmp_path: Path, result: dict[str, Any]) -> None:
    """Case 6: a result the protocol forbids used to become JSON-RPC -32603 with a traceback in the log."""
    log = tmp_path / "agg.log"
    config = write_config(tmp_path, {"kit": kit_upstream(expose="direct")})
    async with aggregator_client(config, "--log-file", str(log)) as session:
        await session.list_tools()
        for answer in (
            await session.call_tool("kit__reply", {"result": result}),
            await session.call_tool(
                "catalog_call_tool", {"server": "kit", "tool": "reply", "arguments": {"result": result}}
            ),
        ):
            fault = structured(answer)["error"]
            assert answer.is_error and fault["reason"] == "upstream_error" and "invalid" in fault["message"]
    assert "Traceback" not in log.read_text()


# ---------------------------------------------------------------- secrets (cases 19, 20)

ENV_SECRET = "s3cr3t-Value-42xyz"
HEADER_SECRET = "hdr-Secret-999zz"


async def test_env_secret_printed_by_an_upstream_is_masked_everywhere(tmp_path: Path) -> None:
    """Case 20: a secret the upstream prints as plain text (not key=value) used to reach logs, results, CLI."""
    leaky = kit_upstream("--print-env", "LEAKY", "--exit-at-start", env={"LEAKY": ENV_SECRET})
    config = write_config(tmp_path, {"leaky": leaky})
    log = tmp_path / "agg.log"
    async with aggregator_client(config, "--log-file", str(log), "--log-level", "debug") as session:
        failed = await session.call_tool("catalog_call_tool", {"server": "leaky", "tool": "echo", "arguments": {}})
        servers = await session.call_tool("catalog_list_servers", {})
    seen = [failed.content[0].text, json.dumps(failed.structured_content), servers.content[0].text]
    assert failed.is_error and "starting with ***" in failed.content[0].text  # the tail is shown, masked
    cli = subprocess.run(
        [sys.executable, "-m", "aggregator", "list-upstreams", "--probe", "--config", str(config)],
        capture_output=True,
        text=True,
        env=aggregator_env(),
        timeout=60,
    )
    seen += [cli.stdout, cli.stderr, log.read_text()]
    assert "starting with ***" in cli.stdout
    for text in seen:
        assert ENV_SECRET not in text


async def test_header_secret_ending_in_a_newline_is_not_returned(tmp_path: Path) -> None:
    """Case 19: an invalid header value used to come back to the client whole, in the error text."""
    port = free_port()
    server = subprocess.Popen([sys.executable, str(EXAMPLES / "testkit.py"), "--http", str(port)])
    try:
        wait_for_port(port, server)
        upstream = {"url": f"http://127.0.0.1:{port}/mcp", "headers": {"X-Api-Key": f"{HEADER_SECRET}\n"}}
        config = write_config(tmp_path, {"web": upstream})
        async with aggregator_client(config) as session:
            failed = await session.call_tool("catalog_list_tools", {"server": "web"})
    finally:
        server.kill()
        server.wait()
    assert failed.is_error and "***" in failed.content[0].text, failed.content[0].text
    assert HEADER_SECRET not in failed.content[0].text and HEADER_SECRET not in json.dumps(failed.structured_content)


# ---------------------------------------------------------------- beyond the process group


def upstream_pids(proc: subprocess.Popen[bytes], pid_file: Path) -> tuple[int, int]:
    called = rpc(proc, 1, "tools/call", {"name": "catalog_call_tool", "arguments": {"server": "kit", "tool": "pid"}})
    return int(called["result"]["content"][0]["text"]), int(pid_file.read_text())


def gone_soon(*pids: int, seconds: float = 10) -> list[int]:
    """The pids still alive after waiting up to `seconds` for them to go."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


@pytest.mark.skipif(sys.platform != "linux", reason="process containment beyond the group is Linux-only")
def test_setsid_grandchild_does_not_survive_shutdown(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    kit = kit_upstream("--spawn-grandchild", "--grandchild-setsid", "--pid-file", str(pid_file))
    proc = spawn_raw_aggregator(write_config(tmp_path, {"kit": kit}))
    upstream, grandchild = upstream_pids(proc, pid_file)
    assert os.getsid(grandchild) != os.getsid(upstream)  # it really left the session and group
    assert proc.stdin
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    assert gone_soon(upstream, grandchild) == []


@pytest.mark.skipif(sys.platform != "linux", reason="process containment beyond the group is Linux-only")
def test_nothing_survives_an_aggregator_killed_with_sigkill(tmp_path: Path) -> None:
    """An upstream ignoring EOF and SIGTERM, and its setsid() grandchild, after `kill -9` of the aggregator."""
    pid_file = tmp_path / "grandchild.pid"
    kit = kit_upstream("--ignore-term", "--spawn-grandchild", "--grandchild-setsid", "--pid-file", str(pid_file))
    proc = spawn_raw_aggregator(write_config(tmp_path, {"kit": kit}))
    upstream, grandchild = upstream_pids(proc, pid_file)
    proc.kill()
    proc.wait(timeout=10)
    assert gone_soon(upstream, grandchild) == []


# ---------------------------------------------------------------- one message cap for every transport (case 7)


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_max_message_bytes_holds_on_every_transport(tmp_path: Path, transport: str) -> None:
    """Case 7: the cap used to hold on stdio only; an HTTP upstream's huge answer passed through."""
    cap = 256 * 1024
    server = None
    if transport == "http":
        port = free_port()
        server = subprocess.Popen([sys.executable, str(EXAMPLES / "testkit.py"), "--http", str(port)])
        wait_for_port(port, server)
        upstream: dict[str, Any] = {"url": f"http://127.0.0.1:{port}/mcp"}
    else:
        upstream = kit_upstream()
    try:
        async with UpstreamPool.running(config_of({"kit": {**upstream, "max_message_bytes": cap}})) as pool:
            small = await pool.call_tool("kit", "big", {"n": cap // 2})
            assert len(small["content"][0]["text"]) == cap // 2
            fault = await call_fault(pool, "kit", "big", {"n": 4 * cap})
            assert fault.reason == "response_too_large" and str(cap) in fault.message
            if transport == "http":  # the connection itself is fine: only that answer was refused
                assert pool.status("kit").state == "ready"
    finally:
        if server is not None:
            server.kill()
            server.wait()


@pytest.mark.parametrize(("transport", "kind"), [("streamable-http", "http"), ("sse", "sse")])
async def test_max_message_bytes_holds_on_sse_events(transport: str, kind: str) -> None:
    """The SDK's toolbox answers over SSE events (streamable HTTP and legacy SSE): each event is capped."""
    cap = 64 * 1024
    with toolbox_over(transport) as url:
        config = config_of({"remote": {"url": url, "transport": kind, "max_message_bytes": cap}})
        async with UpstreamPool.running(config) as pool:
            small = await pool.call_tool("remote", "base64_encode", {"text": "x" * 1000})
            assert not small.get("isError")
            with anyio.fail_after(PROMPT), pytest.raises(Fault) as caught:
                await pool.call_tool("remote", "base64_encode", {"text": "x" * (2 * cap)})
            assert caught.value.reason == "response_too_large", caught.value
