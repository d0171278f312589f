"""The per-user service behind `aggregator connect`, with real processes end to end.

Every test gets its own short runtime directory (`AGGREGATOR_RUNTIME_DIR`: a Unix socket
path must stay under ~100 bytes), and the `service` fixture stops whatever service a test
started and checks that neither it nor any upstream of it is left running.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import select
import shutil
import signal
import socket
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

import anyio
import mcp.types as types
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from aggregator.cli import _command_index
from aggregator.cli.service import Claim, claim_service, query_status
from aggregator.downstream.connect import _holder_pid, parse_args
from aggregator.downstream.connect_relay import SLOW, _lines, _service_head
from aggregator.downstream.runtime import connect_target, private_dir, read_pid_file, service_files, service_running
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

    def connect(self, *flags: str, **env: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "aggregator", "connect", "--config", str(self.config), *flags],
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
async def connected(found: Service, **options: Any) -> AsyncIterator[ClientSession]:
    """An SDK client session through `aggregator connect`, as a host would run it."""
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "aggregator", "connect", "--config", str(found.config)], env=found.env()
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write, **options) as session:
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


@pytest.mark.anyio
async def test_both_eras_attached_hear_list_changed(service: Service, tmp_path: Path) -> None:
    """A modern client (listen) and a legacy one (notification) share a direct upstream; one changes its tools."""
    from mcp import Client

    write_config(tmp_path, {"kit": kit_upstream(expose="direct")})
    heard = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            heard.set()

    params = StdioServerParameters(
        command=sys.executable, args=["-m", "aggregator", "connect", "--config", str(service.config)], env=service.env()
    )
    async with connected(service, message_handler=on_message) as legacy, Client(params, mode="auto") as modern:
        assert modern.protocol_version >= "2026"
        assert "kit__echo" in {tool.name for tool in (await legacy.list_tools()).tools}
        assert "kit__echo" in {tool.name for tool in (await modern.list_tools()).tools}
        async with modern.listen(tools_list_changed=True) as subscription:
            await legacy.call_tool("kit__set_tools", {"names": ["shared_new"]})
            with anyio.fail_after(15):
                async for _event in subscription:
                    if "kit__shared_new" in {tool.name for tool in (await modern.list_tools()).tools}:
                        break
                await heard.wait()
        assert service.status()["upstreams_running"] == 1


def test_a_relayed_request_reaches_the_client_whose_call_asked(service: Service) -> None:
    """Two clients call the same upstream's `ask` (sampling): each request reaches the client whose call asked,
    one after the other; at the same time, each gets its own answer or a refusal, never the other's."""
    clients = {tag: service.connect() for tag in ("a", "b")}
    init = {**INIT, "capabilities": {"sampling": {}}}
    for proc in clients.values():
        send(proc, {"id": 0, "method": "initialize", "params": init})
        assert "result" in answer(proc, 0)
        send(proc, {"method": "notifications/initialized"})
    for tag, proc in clients.items():
        ask(proc, 1)
        assert f"from {tag}" in answered_asking(proc, 1, tag)
    for proc in clients.values():
        ask(proc, 2)
    for tag, proc in clients.items():
        text = answered_asking(proc, 2, tag)
        other = "from b" if tag == "a" else "from a"
        assert other not in text and (f"from {tag}" in text or "cannot tell which client" in text), text
    assert [finish(proc) for proc in clients.values()] == [0, 0]


def ask(proc: subprocess.Popen[bytes], request_id: int) -> None:
    sampling = {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 5}
    arguments = {"method": "sampling/createMessage", "params": sampling}
    params = {"name": "catalog_call_tool", "arguments": {"server": "kit", "tool": "ask", "arguments": arguments}}
    send(proc, {"id": request_id, "method": "tools/call", "params": params})


def answered_asking(proc: subprocess.Popen[bytes], request_id: int, tag: str) -> str:
    """The result of call `request_id` as text, answering every sampling request on the way as client `tag`."""
    assert proc.stdout
    while True:
        message = json.loads(proc.stdout.readline())
        if message.get("method") == "sampling/createMessage":
            result = {"role": "assistant", "content": {"type": "text", "text": f"from {tag}"}, "model": "m"}
            send(proc, {"id": message["id"], "result": result})
        elif message.get("id") == request_id:
            return json.dumps(message["result"])


def test_a_config_reload_is_applied_once_for_every_client(service: Service, tmp_path: Path) -> None:
    clients = [service.connect(), service.connect()]
    for proc in clients:
        handshake(proc)
    write_config(tmp_path, {"kit": kit_upstream(), "kit2": kit_upstream()})
    pid = service.pid()
    assert pid is not None
    os.kill(pid, signal.SIGHUP)  # reload now rather than at the next poll of the file
    listed = {"name": "catalog_list_servers", "arguments": {}}
    for number, proc in enumerate(clients):
        deadline = time.monotonic() + 15
        while True:
            send(proc, {"id": 10 + number, "method": "tools/call", "params": listed})
            servers = answer(proc, 10 + number)["result"]["structuredContent"]["servers"]
            if [server["name"] for server in servers] == ["kit", "kit2"]:
                break
            assert time.monotonic() < deadline, servers
            time.sleep(0.1)
    assert Path(service.files.log).read_text().count("config reloaded") == 1
    assert [finish(proc) for proc in clients] == [0, 0]


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


@pytest.mark.parametrize("relay", [False, True], ids=["hand-off", "relay"])
def test_eof_with_a_call_running_still_gets_its_answer(service: Service, relay: bool) -> None:
    client = service.connect(*(["--relay"] if relay else []))
    handshake(client)
    params = {"name": "catalog_call_tool", "arguments": {"server": "kit", "tool": "slow", "arguments": {"seconds": 1}}}
    send(client, {"id": 1, "method": "tools/call", "params": params})
    assert client.stdin and client.stdout
    client.stdin.close()  # EOF at once: the service drains, answers, closes; connect passes it all on and exits
    out = client.stdout.read()
    assert client.wait(timeout=30) == 0
    answers = [json.loads(line) for line in out.splitlines()]
    assert [a["result"]["content"][0]["text"] for a in answers if a.get("id") == 1] == ["slept 1s in 1 steps"]
    assert service.status()["clients_attached"] == 0


@pytest.mark.parametrize("relay", [False, True], ids=["hand-off", "relay"])
def test_big_answers_and_garbage_pass_intact(service: Service, relay: bool) -> None:
    client = service.connect(*(["--relay"] if relay else []))
    handshake(client)
    big = call_kit(client, 1, "big", n=3_000_000)["result"]["content"][0]["text"]
    assert len(big) == 3_000_000
    assert client.stdin
    client.stdin.write(b'{"jsonrpc": "2.0", "id": 2, "method": \xff not json\n\n[1, 2\n')
    client.stdin.flush()
    assert answer(client, None)["error"]["code"] == -32700  # refused by the service, the session goes on
    assert call_kit(client, 3, "echo", message="still here")["result"]["content"][0]["text"] == "still here"
    assert finish(client) == 0


@pytest.mark.parametrize("relay", [False, True], ids=["hand-off", "relay"])
def test_service_sigkilled_under_clients(service: Service, relay: bool) -> None:
    client = service.connect(*(["--relay"] if relay else []))
    handshake(client)
    kit_pid = int(call_kit(client, 1, "pid")["result"]["content"][0]["text"])
    old = service.pid()
    assert old is not None and kit_pid in descendants(old)
    params = {"name": "catalog_call_tool", "arguments": {"server": "kit", "tool": "slow", "arguments": {"seconds": 30}}}
    send(client, {"id": 2, "method": "tools/call", "params": params})
    time.sleep(0.3)  # the call is with the upstream
    os.kill(old, signal.SIGKILL)
    if relay:  # an error at once; the next message starts a new service, the handshake replayed
        lost = answer(client, 2, timeout=10)
        assert lost["error"]["code"] == -32000 and "stopped before answering" in lost["error"]["message"], lost
        _wait_gone([kit_pid])  # no upstream outlives its service
        echoed = call_kit(client, 3, "echo", message="again")
        assert echoed.get("result", {}).get("content", [{}])[0].get("text") == "again", echoed
        new = service.pid()
        assert new is not None and new != old
        assert finish(client) == 0
    else:  # a clean end: connect exits, the client's stdout ends; the next connect starts a new service
        assert client.stdout and client.stdout.read() == b""
        assert client.wait(timeout=10) == 0
        _wait_gone([kit_pid])
        again = service.connect()
        handshake(again)
        assert call_kit(again, 3, "echo", message="again")["result"]["content"][0]["text"] == "again"
        assert service.pid() not in (None, old)
        assert finish(again) == 0


class DyingService:
    """What a SIGKILLed service is for an instant: its listener still at the socket path, its pid lock
    still held or freed. It dies once the connection it takes has sent something (or ended), what was
    sent unread: the kernel resets the peer, as for a connection a dying listener never accepted."""

    def __init__(self, files: Any, *, holds_lock: bool) -> None:
        Path(files.socket).unlink()  # the killed service's stale file; ours in its place, unaccepted
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(files.socket)
        self.listener.listen(8)
        self.lock = -1
        if holds_lock:  # the pid file says it is this process's listener, and the lock says it lives
            self.lock = os.open(files.pid, os.O_RDWR)
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(self.lock, 0)
            os.pwrite(self.lock, json.dumps({"pid": os.getpid(), "socket": files.socket}).encode(), 0)
        self.reached = threading.Event()
        self.closing = threading.Lock()
        self.thread = threading.Thread(target=self._die_when_reached, daemon=True)
        self.thread.start()

    def _die_when_reached(self) -> None:
        conn = None
        if select.select([self.listener], [], [], 30)[0]:
            conn, _ = self.listener.accept()
            self.reached.set()
            select.select([conn], [], [], 30)  # the client's first bytes: it took us for the live service
        self.close()
        if conn is not None:
            conn.close()

    def close(self) -> None:
        with self.closing:
            if self.lock >= 0:
                os.close(self.lock)  # as the kernel does: the lock freed first, then the listener closed
                self.lock = -1
            self.listener.close()


@pytest.mark.parametrize("holds_lock", [False, True], ids=["lock-freed", "lock-held"])
def test_a_relay_reconnecting_past_a_dying_service_starts_a_new_one(service: Service, holds_lock: bool) -> None:
    """The race behind the SIGKILL test's flakiness, made certain: the relay's next message reaches the
    killed service's listener before the kernel has closed it. It must start a new service all the same."""
    client = service.connect("--relay")
    handshake(client)
    old = service.pid()
    assert old is not None
    os.kill(old, signal.SIGKILL)
    _wait_gone([old])
    dying = DyingService(service.files, holds_lock=holds_lock)
    try:
        echoed = call_kit(client, 1, "echo", message="again")
    finally:
        dying.close()
    assert echoed.get("result", {}).get("content", [{}])[0].get("text") == "again", echoed
    assert dying.reached.is_set()  # the race was run: the relay reached the dying listener first
    assert service.pid() not in (None, old)
    assert finish(client) == 0


def test_a_connect_handing_off_to_a_dying_service_finds_a_new_one(service: Service) -> None:
    """Its hand-off reset unread by a service dying as it connected, `connect` still holds the client's
    stdio, and gives it to a new service: the client never sees the race."""
    first = service.connect()
    handshake(first)
    old = service.pid()
    assert old is not None
    os.kill(old, signal.SIGKILL)
    assert first.stdout and first.stdout.read() == b""
    assert first.wait(timeout=10) == 0
    _wait_gone([old])
    dying = DyingService(service.files, holds_lock=True)
    try:
        again = service.connect()
        handshake(again)
    finally:
        dying.close()
    assert dying.reached.is_set()
    assert call_kit(again, 1, "echo", message="again")["result"]["content"][0]["text"] == "again"
    assert service.pid() not in (None, old)
    assert finish(again) == 0


def test_the_handed_over_stdin_is_left_blocking(service: Service) -> None:
    """The service serves the client's pipe non-blocking; the description is shared (a terminal, say): restored."""
    read_end, write_end = os.pipe()
    client = subprocess.Popen(
        [sys.executable, "-m", "aggregator", "connect", "--config", str(service.config)],
        stdin=read_end,
        stdout=subprocess.PIPE,
        env=service.env(),
    )
    try:
        os.write(write_end, json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INIT}).encode())
        os.write(write_end, b"\n")
        assert "result" in answer(client, 0)
    finally:
        os.close(write_end)
    assert client.wait(timeout=30) == 0
    assert os.get_blocking(read_end)
    os.close(read_end)


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
    client = service.connect("--relay")  # survives `service stop`: its next message starts a new service
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
    assert parse_args(["--config", "a.yaml", "--data-dir=d", "--start-timeout", "2", "--relay"]) == {
        "config": "a.yaml",
        "data-dir": "d",
        "start-timeout": "2",
        "relay": "",
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


@given(
    st.one_of(st.integers(min_value=-(2**53), max_value=2**53), st.text(max_size=20)),
    st.sampled_from(["result", "error", "request", "notification"]),
)
def test_connect_reads_the_service_answer_id_from_the_head_alone(key: Any, kind: str) -> None:
    """The fast path agrees with parsing the whole line, for the lines the service really writes."""
    if kind == "result":
        message: Any = types.JSONRPCResponse(jsonrpc="2.0", id=key, result={"content": [], "big": "x" * 300})
    elif kind == "error":
        message = types.JSONRPCError(jsonrpc="2.0", id=key, error=types.ErrorData(code=-1, message="no"))
    elif kind == "request":
        message = types.JSONRPCRequest(jsonrpc="2.0", id=key, method="sampling/createMessage", params={})
    else:
        message = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/progress", params={})
    line = message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
    head = _service_head(line)
    parsed = json.loads(line)
    if head is SLOW:
        assert not isinstance(key, int) or kind == "notification", line  # integer ids take the fast path
        return  # parsed in full: always right
    assert head == (parsed["id"] if kind in ("result", "error") else None)


def test_connect_reads_the_pid_claim_service_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`connect` reads the live service's pid without json: from the very file `claim_service` writes."""
    monkeypatch.setenv("AGGREGATOR_RUNTIME_DIR", str(Path(tempfile.mkdtemp(prefix="agg-", dir="/tmp")) / "rt"))
    config = write_config(tmp_path, {"kit": kit_upstream()})
    claim = claim_service(argparse.Namespace(config=str(config), data_dir=None), str(config))
    assert isinstance(claim, Claim), claim
    try:
        assert _holder_pid(claim.files.pid) == os.getpid()
    finally:
        os.close(claim.lock_fd)
        shutil.rmtree(Path(claim.files.directory).parent, ignore_errors=True)


@given(st.binary(max_size=80))
def test_a_garbled_pid_file_reads_as_no_pid(content: bytes) -> None:
    with tempfile.NamedTemporaryFile() as fh:
        fh.write(content)
        fh.flush()
        found = _holder_pid(fh.name)
    assert found is None or (isinstance(found, int) and found >= 0 and str(found).encode() in content)
