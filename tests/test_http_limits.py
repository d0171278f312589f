"""Issue 11 case 13: session floods, leaks and slow clients against a real `aggregator serve --transport http`."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import aggregator_env, kit_upstream, write_config
from tests.test_downstream_faults import INIT, rss_kib
from tests.test_serve_http import echo_many, http_aggregator_process

HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def open_session(http: httpx2.Client, url: str) -> str:
    """A raw session: initialize, then the initialized notification; its id."""
    opened = http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}, headers=HEADERS)
    assert opened.status_code == 200, opened.text
    session = opened.headers["mcp-session-id"]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert http.post(url, json=note, headers={**HEADERS, "mcp-session-id": session}).status_code == 202
    return str(session)


def list_tools_status(http: httpx2.Client, url: str, session: str) -> int:
    listed = http.post(
        url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers={**HEADERS, "mcp-session-id": session}
    )
    return int(listed.status_code)


def flood(url: str, count: int) -> list[str]:
    with httpx2.Client(timeout=30) as http:
        return [open_session(http, url) for _ in range(count)]


async def test_a_session_flood_evicts_idle_sessions_instead_of_locking_clients_out(tmp_path: Path) -> None:
    """10k sessions answered every new client 503 for 30 minutes; now the idle leftovers are evicted."""
    config = write_config(tmp_path, {"kit": kit_upstream()})
    env = aggregator_env(AGGREGATOR_HTTP_MAX_SESSIONS="20")
    with http_aggregator_process(config, env=env) as (url, _proc):
        async with streamable_http_client(url) as (read, write), ClientSession(read, write) as busy:
            await busy.initialize()  # a real client: it keeps a GET stream open, so it is never idle
            flooded = await anyio.to_thread.run_sync(flood, url, 60)
            assert len((await busy.list_tools()).tools) > 0  # the busy client survived the flood
        with httpx2.Client(timeout=30) as http:
            statuses = [list_tools_status(http, url, session) for session in flooded]
        assert statuses[:30] == [404] * 30  # the oldest idle sessions made room ...
        assert statuses[-10:] == [200] * 10  # ... for the newest
        assert await echo_many(url, "new", 2) == ["new-0", "new-1"]  # and a new client gets in


async def test_sessions_expire_when_idle(tmp_path: Path) -> None:
    env = aggregator_env(AGGREGATOR_HTTP_SESSION_IDLE_SECONDS="1")
    with http_aggregator_process(write_config(tmp_path, {}), env=env) as (url, _proc), httpx2.Client() as http:
        session = open_session(http, url)
        assert list_tools_status(http, url, session) == 200
        time.sleep(3)
        assert list_tools_status(http, url, session) == 404


def test_many_sessions_cost_bounded_memory(tmp_path: Path) -> None:
    """Closed sessions leaked about 20 KB each and open ones were unbounded; both are bounded now."""
    env = aggregator_env(AGGREGATOR_HTTP_MAX_SESSIONS="50")
    with http_aggregator_process(write_config(tmp_path, {}), env=env) as (url, proc), httpx2.Client() as http:

        def churn(count: int) -> None:
            for i in range(count):
                session = open_session(http, url)
                assert list_tools_status(http, url, session) == 200
                if i % 2:  # half are closed by their client, half are left open (and evicted)
                    assert http.delete(url, headers={**HEADERS, "mcp-session-id": session}).status_code == 200

        churn(200)  # warm up: caches, allocator arenas
        warm = rss_kib(proc.pid)
        churn(800)
        grown_mib = (rss_kib(proc.pid) - warm) / 1024
    assert grown_mib < 8, f"RSS grew {grown_mib:.1f} MiB over 800 more sessions"


def raw_connection(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), timeout=20)
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server closes the connection (EOF or reset) without sending a response first."""
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_slow_headers_and_bodies_are_cut_off(tmp_path: Path) -> None:
    env = aggregator_env(AGGREGATOR_HTTP_HEADER_TIMEOUT="1", AGGREGATOR_HTTP_BODY_TIMEOUT="1")
    with http_aggregator_process(write_config(tmp_path, {}), env=env) as (url, _proc):
        host = urlsplit(url).netloc
        silent = [raw_connection(url) for _ in range(20)]
        slow_headers = [raw_connection(url) for _ in range(100)]
        for sock in slow_headers:
            sock.sendall(f"POST /mcp HTTP/1.1\r\nHost: {host}\r\nX-Slow: ".encode())
        slow_body = [raw_connection(url) for _ in range(20)]
        for sock in slow_body:
            sock.sendall(f"POST /mcp HTTP/1.1\r\nHost: {host}\r\nContent-Length: 1000\r\n\r\n{{".encode())
        time.sleep(0.5)
        for sock in slow_headers:
            sock.sendall(b"x")  # trickling bytes does not extend the deadline
        with httpx2.Client(timeout=20) as http:
            assert list_tools_status(http, url, open_session(http, url)) == 200  # others are served meanwhile
        try:
            assert all(closed_by_server(sock) for sock in silent + slow_headers + slow_body)
        finally:
            for sock in silent + slow_headers + slow_body:
                sock.close()
