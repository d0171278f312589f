"""The upstream pool in-process, against real upstream subprocesses (stdio, HTTP, SSE)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from aggregator.config import parse_config
from aggregator.faults import Fault
from aggregator.upstream.pool import UpstreamPool
from tests.conftest import EXAMPLES, free_port, kit_upstream, wait_for_port


def config_of(upstreams: dict[str, dict]) -> object:
    import json

    return parse_config(json.dumps({"upstreams": upstreams}), "test.yaml")


async def test_single_flight_start_and_parallel_upstreams(tmp_path: Path) -> None:
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    config = config_of({"a": kit_upstream("--spawn-log", str(log_a)), "b": kit_upstream("--spawn-log", str(log_b))})
    async with UpstreamPool.running(config) as pool:
        assert pool.status("a").state == "configured"
        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(pool.ensure_catalog, "a")
                tg.start_soon(pool.ensure_catalog, "b")
        assert len(log_a.read_text().splitlines()) == 1  # ten concurrent needs, one spawn
        assert len(log_b.read_text().splitlines()) == 1
        assert pool.status("a").state == "ready"
        assert pool.status("a").tool_count and pool.status("a").tool_count > 5


async def test_allow_deny_filters_hide_tools_but_keep_them_in_the_catalog() -> None:
    config = config_of({"kit": kit_upstream(tools={"allow": ["e*", "add", "crash"], "deny": ["crash"]})})
    async with UpstreamPool.running(config) as pool:
        catalog = await pool.ensure_catalog("kit")
        exposed = [tool.name for tool in catalog.exposed_tools]
        assert exposed == ["add", "echo"]
        assert catalog.tool("crash") is not None and catalog.tool("crash").hidden


async def test_malformed_entries_are_dropped_with_a_reason() -> None:
    config = config_of({"kit": kit_upstream("--malformed")})
    async with UpstreamPool.running(config) as pool:
        catalog = await pool.ensure_catalog("kit")
        assert catalog.tool("echo") is not None
        assert catalog.tool("bad_schema_no_type") is not None  # repaired: type object added
        assert catalog.tool("bad_schema_string") is None
        assert any("bad_schema_string" in reason for reason in catalog.dropped)
        assert any("no name" in reason for reason in catalog.dropped)


async def test_prompts_resources_and_templates_are_catalogued() -> None:
    config = config_of({"kit": kit_upstream()})
    async with UpstreamPool.running(config) as pool:
        catalog = await pool.ensure_catalog("kit")
        assert catalog.prompts and catalog.resources and catalog.resource_templates


async def test_list_changed_refreshes_the_catalog() -> None:
    config = config_of({"kit": kit_upstream()})
    async with UpstreamPool.running(config) as pool:
        await pool.ensure_catalog("kit")
        await pool.call_tool("kit", "set_tools", {"names": ["fresh_tool"]})
        with anyio.fail_after(5):
            while (catalog := pool.store.get("kit")) is None or catalog.tool("fresh_tool") is None:
                await anyio.sleep(0.02)


async def test_backoff_doubles_and_calls_inside_it_fail_at_once() -> None:
    config = config_of({"dead": kit_upstream("--exit-at-start")})
    async with UpstreamPool.running(config) as pool:
        with pytest.raises(Fault) as first:
            await pool.ensure_catalog("dead")
        assert first.value.reason == "upstream_unavailable"
        assert pool.in_backoff("dead")
        started = time.monotonic()
        with pytest.raises(Fault):
            await pool.ensure_catalog("dead")  # inside the window: no spawn
        assert time.monotonic() - started < 0.05
        windows = []
        for _ in range(3):
            await anyio.sleep(pool.connection("dead").backoff_remaining() + 0.01)
            with pytest.raises(Fault):
                await pool.ensure_catalog("dead")
            windows.append(pool.connection("dead").backoff_remaining())
        assert windows[0] < windows[1] < windows[2]  # 0.2, 0.4, 0.8 s


async def test_unknown_server_is_a_programmer_fault() -> None:
    async with UpstreamPool.running(config_of({})) as pool:
        with pytest.raises(Fault) as caught:
            await pool.call_tool("nope", "x", {})
        assert caught.value.reason == "unknown_server" and caught.value.kind == "programmer"


def start_toolbox(transport: str, port: int) -> subprocess.Popen[bytes]:
    """The toolbox example over HTTP or SSE on 127.0.0.1:port, once its port accepts connections."""
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "toolbox.py"), transport, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, proc)
    except AssertionError:
        proc.kill()
        raise
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=10)


@contextmanager
def toolbox_over(transport: str) -> Iterator[str]:
    port = free_port()
    proc = start_toolbox(transport, port)
    try:
        yield f"http://127.0.0.1:{port}" + ("/mcp" if transport == "streamable-http" else "/sse")
    finally:
        stop(proc)


@pytest.mark.parametrize(("transport", "kind"), [("streamable-http", "http"), ("sse", "sse")])
async def test_http_and_sse_upstreams(transport: str, kind: str) -> None:
    with toolbox_over(transport) as url:
        config = config_of({"remote": {"url": url, "transport": kind}})
        async with UpstreamPool.running(config) as pool:
            catalog = await pool.ensure_catalog("remote")
            assert len(catalog.exposed_tools) >= 15
            names = {tool.name for tool in catalog.exposed_tools}
            tool = "word_count" if "word_count" in names else sorted(names)[0]
            result = await pool.call_tool("remote", tool, {"text": "one two three"})
            assert "content" in result
            assert pool.status("remote").transport == kind


async def test_dead_http_upstream_is_unavailable_not_a_crash() -> None:
    config = config_of({"remote": {"url": f"http://127.0.0.1:{free_port()}/mcp", "timeouts": {"connect": 2}}})
    async with UpstreamPool.running(config) as pool:
        with pytest.raises(Fault) as caught:
            await pool.ensure_catalog("remote")
        assert caught.value.reason == "upstream_unavailable"


async def test_http_upstream_that_dies_is_reconnected_after_backoff() -> None:
    port = free_port()
    config = config_of({"remote": {"url": f"http://127.0.0.1:{port}/mcp", "timeouts": {"connect": 5, "call": 5}}})
    proc = start_toolbox("streamable-http", port)
    try:
        async with UpstreamPool.running(config) as pool:
            await pool.call_tool("remote", "word_count", {"text": "a b"})
            stop(proc)
            with pytest.raises(Fault) as caught:
                await pool.call_tool("remote", "word_count", {"text": "a b"})
            assert caught.value.kind == "world"
            proc = start_toolbox("streamable-http", port)
            await anyio.sleep(pool.connection("remote").backoff_remaining() + 0.05)
            result = await pool.call_tool("remote", "word_count", {"text": "a b c"})
            assert result.get("isError") is not True
    finally:
        stop(proc)


async def test_eager_upstream_starts_in_the_background_and_lazy_one_does_not(tmp_path: Path) -> None:
    eager_log, lazy_log = tmp_path / "eager.log", tmp_path / "lazy.log"
    config = config_of(
        {
            "early": kit_upstream("--spawn-log", str(eager_log), start="eager"),
            "late": kit_upstream("--spawn-log", str(lazy_log)),
        }
    )
    async with UpstreamPool.running(config) as pool:
        with anyio.fail_after(10):
            while pool.status("early").state != "ready":
                await anyio.sleep(0.02)
        assert pool.store.get("early") is not None
        assert pool.status("late").state == "configured" and not lazy_log.exists()


async def test_malformed_prompt_is_dropped_not_the_upstream() -> None:
    config = config_of({"kit": kit_upstream("--malformed")})
    async with UpstreamPool.running(config) as pool:
        catalog = await pool.ensure_catalog("kit")
        assert catalog.prompts and all(prompt.name != "bad_prompt" for prompt in catalog.prompts)
        assert any("bad_prompt" in reason for reason in catalog.dropped)


async def test_crash_is_noticed_even_when_a_grandchild_keeps_stdout_open(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    config = config_of(
        {
            "kit": kit_upstream(
                "--spawn-grandchild", "--pid-file", str(pid_file), "--grandchild-keeps-stdout", timeouts={"call": 20}
            )
        }
    )
    async with UpstreamPool.running(config) as pool:
        await pool.ensure_catalog("kit")
        started = time.monotonic()
        with pytest.raises(Fault) as caught:
            await pool.call_tool("kit", "crash", {})
        assert time.monotonic() - started < 3  # not the 20 s call timeout
        assert caught.value.kind == "world" and pool.status("kit").state in ("backoff", "failed")


async def test_stop_abandons_a_start_in_progress() -> None:
    config = config_of({"hangs": kit_upstream("--hang-initialize", start="eager")})
    started = time.monotonic()
    async with UpstreamPool.running(config) as pool:
        with anyio.fail_after(5):
            while pool.status("hangs").state != "starting":
                await anyio.sleep(0.02)
    assert time.monotonic() - started < 4  # not the 10 s handshake timeout, nor the 5 s shutdown grace


async def test_restarted_http_upstream_gets_a_new_session() -> None:
    port = free_port()
    config = config_of({"remote": {"url": f"http://127.0.0.1:{port}/mcp", "timeouts": {"connect": 5, "call": 5}}})
    proc = start_toolbox("streamable-http", port)
    try:
        async with UpstreamPool.running(config) as pool:
            await pool.call_tool("remote", "word_count", {"text": "a b"})
            stop(proc)
            proc = start_toolbox("streamable-http", port)  # same URL, a server that never saw our session
            outcome = None
            for _ in range(5):  # the first call may learn that the session is gone; a later one reconnects
                try:
                    outcome = await pool.call_tool("remote", "word_count", {"text": "a b c"})
                    break
                except Fault:
                    await anyio.sleep(pool.connection("remote").backoff_remaining() + 0.05)
            assert outcome is not None and outcome.get("isError") is not True
    finally:
        stop(proc)


async def test_a_call_in_flight_when_its_upstream_is_stopped_says_so() -> None:
    """A stop (a reload's retire after its grace, or shutdown) ends the call with a fault that says why,
    not with `upstream 'kit': None` (nothing is recorded as the upstream's last error for a stop)."""
    config = config_of({"kit": kit_upstream()})
    async with UpstreamPool.running(config) as pool:
        await pool.ensure_catalog("kit")
        outcome: list[BaseException] = []

        async def call() -> None:
            try:
                await pool.call_tool("kit", "slow", {"seconds": 30})
            except Fault as fault:
                outcome.append(fault)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await anyio.sleep(0.5)
            pool.connection("kit").request_stop()
        assert len(outcome) == 1 and isinstance(outcome[0], Fault), outcome
        assert "was stopped during the call" in str(outcome[0]) and "None" not in str(outcome[0])
