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
from hypothesis import given
from hypothesis import strategies as st
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from aggregator.cli import _command_index
from aggregator.cli.service import query_status
from aggregator.connect import _lines, parse_args
from aggregator.runtime import connect_target, private_dir, read_pid_file, service_files, service_running
from aggregator.upstream.guard import descendants
from tests.conftest import aggregator_env, alive, kit_upstream, structured, write_config
from tests.test_cli import run_cli
from tests.test_install import CLIENT_FILES, Home

ROOT = Path(__file__).resolve().parent.parent
MEMORY_SERVER = ROOT / ".ci" / "servers" / "node" / "node_modules" / "@modelcontextprotocol" / "server-memory"
INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}


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


@pytest.mark.anyio
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


# ---------------------------------------------------------------- operating it


def test_status_stop_logs_and_doctor(service: Service) -> None:
    env = service.env()
    assert "none runs" in run_cli("doctor", "--no-probe", "--config", str(service.config), env=env).stdout
    stopped = run_cli("service", "status", "--config", str(service.config), env=env)
    assert stopped.returncode == 3 and "no service runs" in stopped.stdout
    client = service.connect()
    handshake(client)
    call_kit(client, 1, "echo", message="warm")
    shown = run_cli("service", "status", "--json", "--config", str(service.config), env=env)
    status = json.loads(shown.stdout)
    assert shown.returncode == 0 and status["running"] and status["pid"] == service.pid()
    assert status["clients_attached"] == 1 and status["upstreams_running"] == 1
    assert status["processes"] >= 3 and status["rss_bytes_with_upstreams"] > status["rss_bytes"] > 0  # guard + kit
    doctor = run_cli("doctor", "--no-probe", "--config", str(service.config), env=env).stdout
    assert f"service: runs (pid {status['pid']}, 1 clients attached" in doctor
    logs = run_cli("service", "logs", "--config", str(service.config), env=env)
    assert logs.returncode == 0 and service.files.log in logs.stdout and "client attached" in logs.stdout
    pid = service.pid()
    assert run_cli("service", "stop", "--config", str(service.config), env=env).stdout.startswith("stopped")
    assert pid is not None and not alive(pid) and service.pid() is None
    # The client was attached: its next message finds no service and starts a new one.
    assert call_kit(client, 2, "echo", message="back")["result"]["content"][0]["text"] == "back"
    assert finish(client) == 0


@pytest.mark.anyio
async def test_installed_connect_entry_attaches_to_the_service(service: Service, tmp_path: Path) -> None:
    home = Home(tmp_path, "cursor", CLIENT_FILES["cursor"][1])
    assert home.run("install", "cursor").returncode == 0
    entry = json.loads(home.file.read_text())["mcpServers"]["aggregator"]
    assert entry["args"][-3:] == ["connect", "--config", str(home.config)]
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=service.env())
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        listing = structured(await session.call_tool("catalog_list_servers", {}))
    assert [server["name"] for server in listing["servers"]] == ["kit"]
    assert len(list(service.runtime.glob("*.sock"))) == 1  # the service of the installed config


# ---------------------------------------------------------------- connect's parts, in process


def test_connect_is_dispatched_before_the_cli_is_imported() -> None:
    code = (
        "import sys; from aggregator.cli import main; main(['--config', 'x.yaml', 'connect', '--help'])"
        "\nif 'aggregator.cli.commands' in sys.modules or 'mcp' in sys.modules: sys.exit(3)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "usage: aggregator connect" in done.stdout, done.stderr
    assert _command_index(["--log-level", "info", "--config", "a", "connect"]) == 4
    assert _command_index(["--version"]) is None


def test_connect_arguments() -> None:
    assert parse_args(["--config", "a.yaml", "--data-dir=d", "--start-timeout", "2"]) == {
        "config": "a.yaml",
        "data-dir": "d",
        "start-timeout": "2",
    }
    for bad in (["--nope"], ["--config"], ["serve"]):
        with pytest.raises(SystemExit) as raised:
            parse_args(bad)
        assert raised.value.code != 0


@given(st.lists(st.binary(min_size=1, max_size=40), max_size=12))
def test_lines_survive_any_chunking(chunks: list[bytes]) -> None:
    feed = iter(chunks)  # a read gives at least one byte until EOF
    lines = list(_lines(lambda: next(feed, b"")))
    assert b"".join(lines) == b"".join(chunks)  # nothing lost, nothing added
    assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in lines[:-1])
    assert not lines or lines[-1].count(b"\n") <= 1


def test_the_runtime_directory_must_be_ours(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "rt"
    link.symlink_to(target)
    with pytest.raises(PermissionError, match="not a directory owned by this user"):
        private_dir(str(link))
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    private_dir(str(loose))
    assert stat.S_IMODE(loose.stat().st_mode) == 0o700


def test_one_service_per_config_and_data_dir(tmp_path: Path) -> None:
    env = {"AGGREGATOR_RUNTIME_DIR": str(tmp_path)}
    same = connect_target("a.yaml", None, {}, str(tmp_path))
    assert same == (str(tmp_path / "a.yaml"), None)
    assert connect_target(None, None, {"AGGREGATOR_CONFIG": "a.yaml"}, str(tmp_path)) == same
    assert connect_target(None, None, {}, str(tmp_path)) == (None, None)  # the user's config: the service finds it
    keys = {service_files(c, d, env).key for c, d in [("/a", None), ("/b", None), ("/a", "/d"), (None, None)]}
    assert len(keys) == 4
    assert service_files("/a", None, env).socket == str(tmp_path / f"{service_files('/a', None, env).key}.sock")
