"""The per-user service behind `aggregator connect`, with real processes end to end.

Every test gets its own short runtime directory (`AGGREGATOR_RUNTIME_DIR`: a Unix socket
path must stay under ~100 bytes), and the `service` fixture stops whatever service a test
started and checks that neither it nor any upstream of it is left running.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from aggregator.cli.service import query_status
from aggregator.runtime import read_pid_file, service_files, service_running
from aggregator.upstream.guard import descendants
from tests.conftest import aggregator_env, alive, kit_upstream, structured, write_config

ROOT = Path(__file__).resolve().parent.parent
MEMORY_SERVER = ROOT / ".ci" / "servers" / "node" / "node_modules" / "@modelcontextprotocol" / "server-memory"
INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}

pytestmark = pytest.mark.anyio


@dataclass
class Service:
    """One test's runtime directory and config, and how to reach what runs there."""

    runtime: Path
    config: Path

    def env(self, **extra: str) -> dict[str, str]:
        return aggregator_env(AGGREGATOR_RUNTIME_DIR=str(self.runtime), **extra)

    @property
    def files(self) -> Any:
        return service_files(str(self.config), None, {"AGGREGATOR_RUNTIME_DIR": str(self.runtime)})

    def pid(self) -> int | None:
        info = read_pid_file(self.files.pid)
        return int(info["pid"]) if info and service_running(self.files.pid) else None

    def status(self) -> dict[str, Any]:
        found = query_status(self.files)
        assert found is not None, "no service answers"
        return found

    def connect(self, **env: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "aggregator", "connect", "--config", str(self.config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env(**env),
        )


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    runtime = Path(tempfile.mkdtemp(prefix="agg-", dir="/tmp")) / "rt"
    config = write_config(tmp_path, {"kit": kit_upstream()})
    found = Service(runtime, config)
    try:
        yield found
    finally:
        _stop_everything(found)
        shutil.rmtree(runtime.parent, ignore_errors=True)


def _stop_everything(found: Service) -> None:
    """SIGTERM every service of this runtime dir, SIGKILL after 10 s; then nothing of it may run."""
    pids = [_service_pid(pid_file) for pid_file in found.runtime.glob("*.pid")] if found.runtime.exists() else []
    pids = [pid for pid in pids if pid is not None]
    tree = {pid: descendants(pid) for pid in pids}
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    leftover = [pid for pid in pids if alive(pid)]
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    assert not leftover, f"the service did not stop on SIGTERM: {leftover}"
    _wait_gone([child for children in tree.values() for child in children])


def _service_pid(pid_file: Path) -> int | None:
    info = read_pid_file(str(pid_file))
    return int(info["pid"]) if info and service_running(str(pid_file)) else None


def _wait_gone(pids: list[int], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if alive(pid)], "processes outlived the service"


def send(proc: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
    assert proc.stdin
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
    proc.stdin.flush()


def answer(proc: subprocess.Popen[bytes], request_id: Any, timeout: float = 30.0) -> dict[str, Any]:
    """The response to `request_id`, skipping notifications; fails after `timeout` seconds."""
    assert proc.stdout
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        while True:
            line = proc.stdout.readline()
            assert line, f"connect closed its stdout: {proc.stderr.read().decode() if proc.stderr else ''}"
            message = json.loads(line)
            if message.get("id") == request_id and "method" not in message:
                return dict(message)
    finally:
        timer.cancel()


def handshake(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    send(proc, {"id": 0, "method": "initialize", "params": INIT})
    reply = answer(proc, 0)
    send(proc, {"method": "notifications/initialized"})
    return reply


def call_kit(proc: subprocess.Popen[bytes], request_id: int, tool: str, **arguments: Any) -> dict[str, Any]:
    params = {"name": "catalog_call_tool", "arguments": {"server": "kit", "tool": tool, "arguments": arguments}}
    send(proc, {"id": request_id, "method": "tools/call", "params": params})
    return answer(proc, request_id)


def finish(proc: subprocess.Popen[bytes]) -> int:
    assert proc.stdin
    proc.stdin.close()
    return proc.wait(timeout=30)


@asynccontextmanager
async def connected(found: Service) -> AsyncIterator[ClientSession]:
    """An SDK client session through `aggregator connect`, as a host would run it."""
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "aggregator", "connect", "--config", str(found.config)], env=found.env()
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def _processes_running(fragment: str, program: str | None = None) -> list[int]:
    """Live processes whose command line contains `fragment` (and whose argv[0] ends with `program`)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and alive(int(entry.name)):
            try:
                argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if fragment in "\0".join(argv) and (program is None or argv[0].endswith(program)):
                found.append(int(entry.name))
    return sorted(found)


# ---------------------------------------------------------------- sharing


@pytest.mark.skipif(shutil.which("node") is None or not MEMORY_SERVER.exists(), reason="needs .ci/servers (node)")
async def test_three_clients_share_one_memory_server(service: Service, tmp_path: Path) -> None:
    index = str(MEMORY_SERVER / "dist" / "index.js")
    memory = {"command": "node", "args": [index], "env": {"MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")}}
    write_config(tmp_path, {"memory": memory})
    async with AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(connected(service)) for _ in range(3)]
        for number, session in enumerate(sessions):
            entity = {"name": f"client{number}", "entityType": "person", "observations": [f"wrote by {number}"]}
            arguments = {"server": "memory", "tool": "create_entities", "arguments": {"entities": [entity]}}
            created = await session.call_tool("catalog_call_tool", arguments)
            assert not created.is_error, created
        for session in sessions:
            graph = await session.call_tool(
                "catalog_call_tool", {"server": "memory", "tool": "read_graph", "arguments": {}}
            )
            names = {entity["name"] for entity in json.loads(graph.content[0].text)["entities"]}
            assert names == {"client0", "client1", "client2"}  # each sees the others' writes
        status = service.status()
        assert status["clients_attached"] == 3
        assert status["upstreams_running"] == 1
        assert len(_processes_running(index, program="node")) == 1  # one upstream process for three clients
        listing = structured(await sessions[0].call_tool("catalog_list_servers", {}))
        assert [server["name"] for server in listing["servers"]] == ["memory"]


def test_racing_connects_start_exactly_one_service(service: Service) -> None:
    clients = [service.connect() for _ in range(4)]
    try:
        replies = [handshake(proc) for proc in clients]
        assert all("result" in reply for reply in replies), replies
        assert _processes_running(str(service.runtime)) == [service.pid()]  # its --log-file names the directory
        assert service.status()["clients_attached"] == 4
    finally:
        assert [finish(proc) for proc in clients] == [0, 0, 0, 0]


# ---------------------------------------------------------------- lifecycle


def test_a_client_eof_detaches_only_that_client(service: Service) -> None:
    first, second = service.connect(), service.connect()
    handshake(first)
    handshake(second)
    assert call_kit(first, 1, "echo", message="one")["result"]["content"][0]["text"] == "one"
    assert finish(first) == 0  # EOF passed on: the service closed our session and connect exited
    assert call_kit(second, 1, "echo", message="two")["result"]["content"][0]["text"] == "two"
    assert service.status()["clients_attached"] == 1
    assert finish(second) == 0


def test_service_sigkilled_under_clients(service: Service) -> None:
    client = service.connect()
    handshake(client)
    kit_pid = int(call_kit(client, 1, "pid")["result"]["content"][0]["text"])
    old = service.pid()
    assert old is not None and kit_pid in descendants(old)
    params = {"name": "catalog_call_tool", "arguments": {"server": "kit", "tool": "slow", "arguments": {"seconds": 30}}}
    send(client, {"id": 2, "method": "tools/call", "params": params})
    time.sleep(0.3)  # the call is with the upstream
    os.kill(old, signal.SIGKILL)
    lost = answer(client, 2, timeout=10)
    assert lost["error"]["code"] == -32000 and "stopped before answering" in lost["error"]["message"]
    _wait_gone([kit_pid])  # no upstream outlives its service
    # The next message starts a new service; the handshake is replayed, so the client just carries on.
    assert call_kit(client, 3, "echo", message="again")["result"]["content"][0]["text"] == "again"
    new = service.pid()
    assert new is not None and new != old
    assert finish(client) == 0


def test_service_stops_when_idle_and_removes_its_sockets(service: Service) -> None:
    client = service.connect(AGGREGATOR_SERVICE_IDLE_SECONDS="0.5")
    handshake(client)
    pid = service.pid()
    assert pid is not None
    assert finish(client) == 0
    deadline = time.monotonic() + 15
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)
    assert not Path(service.files.socket).exists() and not Path(service.files.control).exists()


def test_socket_and_directory_are_private(service: Service) -> None:
    client = service.connect()
    handshake(client)
    assert stat.S_IMODE(service.runtime.stat().st_mode) == 0o700
    for path in (service.files.socket, service.files.control, service.files.pid, service.files.log):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    assert finish(client) == 0


def test_a_broken_config_is_reported_by_connect(service: Service) -> None:
    service.config.write_text("upstreams: [not, a, mapping]\n")
    client = service.connect()
    assert client.wait(timeout=60) == 1
    assert client.stderr is not None
    err = client.stderr.read().decode()
    assert "exited with code 2 while starting" in err and "config error" in err
