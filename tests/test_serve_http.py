"""`aggregator serve --transport http` as a real subprocess on 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.conftest import aggregator_env, free_port, kit_upstream, structured, wait_for_port, write_config


def serve_http_command(config: Path) -> list[str]:
    return [sys.executable, "-m", "aggregator", "serve", "--config", str(config), "--transport", "http"]


@contextmanager
def http_aggregator_process(
    config: Path, *args: str, env: dict[str, str] | None = None, start_timeout: float = 20.0
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real `aggregator serve --transport http` on a free port: (its /mcp URL, the process)."""
    port = free_port()
    proc = subprocess.Popen(
        [*serve_http_command(config), "--port", str(port), *args],
        env=env or aggregator_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for_port(port, proc, timeout=start_timeout)
        yield f"http://127.0.0.1:{port}/mcp", proc
    finally:
        proc.terminate()
        assert proc.wait(timeout=15) is not None
        assert proc.stdout is not None and proc.stdout.read() == b""  # nothing but protocol, and HTTP has none


@contextmanager
def http_aggregator(
    config: Path, *args: str, env: dict[str, str] | None = None, start_timeout: float = 20.0
) -> Iterator[str]:
    with http_aggregator_process(config, *args, env=env, start_timeout=start_timeout) as (url, _proc):
        yield url


async def echo_many(url: str, tag: str, count: int, headers: dict[str, str] | None = None) -> list[str]:
    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        answers = []
        for i in range(count):
            result = await session.call_tool(
                "catalog_call_tool", {"server": "kit", "tool": "echo", "arguments": {"message": f"{tag}-{i}"}}
            )
            answers.append(result.content[0].text)
        return answers


async def test_two_http_clients_at_once(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream()})
    with http_aggregator(config) as url:
        results: dict[str, list[str]] = {}

        async def client(tag: str) -> None:
            results[tag] = await echo_many(url, tag, 20)

        async with anyio.create_task_group() as tg:
            tg.start_soon(client, "a")
            tg.start_soon(client, "b")
        assert results["a"] == [f"a-{i}" for i in range(20)]
        assert results["b"] == [f"b-{i}" for i in range(20)]


async def test_bearer_token_is_enforced_when_set(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream()})
    with http_aggregator(config, env=aggregator_env(AGGREGATOR_TOKEN="s3cret-token")) as url:
        async with httpx2.AsyncClient() as http:
            denied = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            assert denied.status_code == 401
            wrong = await http.post(url, json={}, headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401
        answers = await echo_many(url, "t", 2, headers={"Authorization": "Bearer s3cret-token"})
        assert answers == ["t-0", "t-1"]


async def test_foreign_host_header_is_rejected(tmp_path: Path) -> None:
    config = write_config(tmp_path, {})
    with http_aggregator(config) as url:
        async with httpx2.AsyncClient() as http:
            response = await http.post(
                url,
                json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                headers={"Host": "evil.example", "Accept": "application/json, text/event-stream"},
            )
            assert response.status_code in (403, 421)


def test_refuses_a_non_loopback_bind_without_a_token(tmp_path: Path) -> None:
    config = write_config(tmp_path, {})
    done = subprocess.run(
        [*serve_http_command(config), "--host", "0.0.0.0", "--port", str(free_port())],
        env=aggregator_env(),
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert b"AGGREGATOR_TOKEN" in done.stderr
    assert b"Traceback" not in done.stderr


async def test_catalog_tools_over_http(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream(description="scriptable")})
    with http_aggregator(config) as url:
        async with (
            streamable_http_client(url) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            servers = structured(await session.call_tool("catalog_list_servers", {}))["servers"]
            assert servers[0]["name"] == "kit" and servers[0]["description"] == "scriptable"


def test_port_in_use_is_one_clear_error(tmp_path: Path) -> None:
    config = write_config(tmp_path, {})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [*serve_http_command(config), "--port", str(port)], env=aggregator_env(), capture_output=True, timeout=30
        )
    assert done.returncode == 2
    assert b"cannot listen" in done.stderr and b"Traceback" not in done.stderr


async def test_loopback_alias_and_allowed_hosts_are_checked(tmp_path: Path) -> None:
    config = write_config(tmp_path, {})
    port = free_port()
    proc = subprocess.Popen(
        [*serve_http_command(config), "--host", "127.0.0.2", "--port", str(port), "--allow-host", "proxy.local"],
        env=aggregator_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, proc, host="127.0.0.2")
        url = f"http://127.0.0.2:{port}/mcp"
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        accept = {"Accept": "application/json, text/event-stream"}
        async with httpx2.AsyncClient() as http:
            evil = await http.post(url, json=ping, headers={**accept, "Host": "attacker.example"})
            assert evil.status_code in (403, 421)
            allowed = await http.post(url, json=ping, headers={**accept, "Host": f"proxy.local:{port}"})
            assert allowed.status_code not in (403, 421)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
