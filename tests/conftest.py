"""Shared test helpers: configs naming real example upstreams, and a host-like client.

The client spawns `aggregator serve` as a host (Claude Desktop, Claude Code)
would and speaks MCP over its stdio. Per SDK_NOTES, a session must be opened
and closed in one task, so `aggregator_client` is an async context manager used
inside a test body, not a fixture.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from aggregator.catalog.model import Catalog, clean_tool, sorted_unique

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SHARED_DATA = ROOT.parent / "shared" / "data"


CATALOG_FILES = {
    "everything": "server-everything.json",
    "fetch": "mcp-server-fetch.json",
    "filesystem": "server-filesystem.json",
    "git": "mcp-server-git.json",
    "memory": "server-memory.json",
    "sequential-thinking": "server-sequential-thinking.json",
    "sqlite": "mcp-server-sqlite.json",
    "time": "mcp-server-time.json",
}
"""Real `tools/list` results of official servers, in ../shared/data/catalogs, by server name."""


def shared_data(*parts: str) -> Path:
    """A path under ../shared/data; where it is missing (a clone on its own), the test, or the
    module when called at import, skips with one line saying where it looked."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"needs ../shared/data beside the repo; not found: {path}", allow_module_level=True)
    return path


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        found += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return found


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    """A skip raised inside a task group (an MCP session) reports its own reason, not the group's."""
    try:
        return (yield)
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if leaves and all(isinstance(leaf, pytest.skip.Exception) for leaf in leaves):
            raise leaves[0] from None
        raise


def real_catalog(server: str) -> Catalog:
    """A cleaned catalog of one of the real servers in CATALOG_FILES."""
    raw = json.loads(shared_data("catalogs", CATALOG_FILES[server]).read_text())
    return Catalog(server, sorted_unique(clean_tool(server, tool) for tool in raw["tools"]))


def kit_upstream(*flags: str, **extra: Any) -> dict[str, Any]:
    """An upstream entry running the stdlib-only test server with `flags`."""
    return {"command": sys.executable, "args": [str(EXAMPLES / "testkit.py"), *flags], **extra}


def example(module: str, **extra: Any) -> dict[str, Any]:
    """An upstream entry running one of the SDK-based example servers."""
    return {"command": sys.executable, "args": ["-m", f"aggregator.examples.{module}"], **extra}


def write_config(directory: Path, upstreams: dict[str, Any], **top: Any) -> Path:
    path = directory / "aggregator.yaml"
    path.write_text(json.dumps({"upstreams": upstreams, **top}, indent=1))  # JSON is YAML
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes], host: str = "127.0.0.1", timeout: float = 20.0) -> None:
    """Block until something accepts connections on host:port; fail if `proc` exits first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=0.2).close()
            return
        except OSError:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise AssertionError(f"the server exited during start-up: {err[-2000:]}") from None
            if time.monotonic() > deadline:
                raise AssertionError(f"nothing listens on {host}:{port}") from None
            time.sleep(0.05)


def alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (killed but not yet reaped) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone between the open and the read: ESRCH
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def spawn_raw_aggregator(config: Path, *, stderr: Any = subprocess.DEVNULL, **env: str) -> subprocess.Popen[bytes]:
    """`aggregator serve` spoken to in raw JSON-RPC (signal, process-tree, wire tests), after the handshake."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "aggregator", "serve", "--config", str(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=aggregator_env(**env),
    )
    init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    assert "result" in rpc(proc, 0, "initialize", init)
    assert proc.stdin
    proc.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
    proc.stdin.flush()
    return proc


def rpc(proc: subprocess.Popen[bytes], request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """Send one request and return its response, skipping notifications."""
    assert proc.stdin and proc.stdout
    proc.stdin.write(
        (json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}) + "\n").encode()
    )
    proc.stdin.flush()
    while True:
        line = proc.stdout.readline()
        assert line, "the aggregator closed its stdout"
        message = json.loads(line)
        if message.get("id") == request_id:
            return dict(message)


def aggregator_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGGREGATOR_")}
    env.update(extra)
    return env


@asynccontextmanager
async def aggregator_client(
    config: Path, *args: str, env: dict[str, str] | None = None, errlog: Any = None, **session: Any
) -> AsyncIterator[ClientSession]:
    """An initialized MCP client session to a real `aggregator serve` subprocess over stdio.

    `session` goes to `ClientSession` (sampling/elicitation/list_roots callbacks declare those capabilities).
    """
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "aggregator", "serve", "--config", str(config), *args],
        env=env if env is not None else aggregator_env(),
    )
    async with (
        stdio_client(params, errlog=errlog or sys.stderr) as (read, write),
        ClientSession(read, write, **session) as session,
    ):
        await session.initialize()
        yield session


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> subprocess.CompletedProcess[str]:
    """`aggregator ARGV` in this process (faster than a subprocess): its exit code, stdout and stderr."""
    from aggregator.cli import main

    try:
        code = main(list(argv))
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(list(argv), code, out, err)


def structured(result: Any) -> dict[str, Any]:
    """The JSON payload of a catalog tool result (structuredContent, checked against its text).

    A fault's text is a one-line message rather than the JSON (DESIGN §2.1).
    """
    payload = result.structured_content
    assert payload is not None, result
    if result.is_error:
        assert set(payload) == {"error"} and payload["error"]["message"] in result.content[0].text
    else:
        assert json.loads(result.content[0].text) == payload
    return dict(payload)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session", autouse=True)
def private_user_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """No test writes into the real user's data, config or cache dirs (XDG, read by platformdirs).

    Set for the whole session, before any test runs, so spawned aggregators inherit them too.
    """
    root = tmp_path_factory.mktemp("user-dirs")
    with pytest.MonkeyPatch.context() as patch:
        for variable, name in (("XDG_DATA_HOME", "data"), ("XDG_CONFIG_HOME", "config"), ("XDG_CACHE_HOME", "cache")):
            patch.setenv(variable, str(root / name))
        patch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")  # nor into their keyring
        yield root


@pytest.fixture(autouse=True)
def logging_restored() -> Iterator[None]:
    """A test that runs the CLI in-process (`run_main`) configures logging for a one-shot command
    (errors only, our own stderr handler); put the root and `aggregator` loggers back afterwards, so
    the next test's `caplog` still sees warnings whatever order the tests run in."""
    loggers = [logging.getLogger(), logging.getLogger("aggregator")]
    saved = [(logger.level, list(logger.handlers), logger.propagate) for logger in loggers]
    yield
    for logger, (level, handlers, propagate) in zip(loggers, saved, strict=True):
        logger.setLevel(level)
        logger.handlers[:] = handlers
        logger.propagate = propagate


@pytest.fixture(autouse=True)
def private_data_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's aggregators (in-process or spawned) get their own default data dir.

    The data dir holds catalog snapshots: without this, one test's snapshots
    would be served to the next test whose config names the same upstream.
    """
    data_home = tmp_path_factory.mktemp("xdg-data")
    monkeypatch.setenv("XDG_DATA_HOME", str(data_home))
    return data_home / "aggregator"


# ---------------------------------------------------------------- no process outlives the session
# The pytest process becomes a child subreaper (Linux): a process whose parent exits is re-parented to
# it rather than to init, so whatever a test leaves running (an upstream's grandchild, a server started
# by a script) is still found here when the session ends, reported, killed, and fails the run.

PR_SET_CHILD_SUBREAPER = 36


def pytest_configure(config: pytest.Config) -> None:
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is `pid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when a process the tests started is still running (after a short grace period)."""
    if sys.platform != "linux":
        return
    deadline = time.monotonic() + 5.0
    left = _children(os.getpid())
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _children(os.getpid())
    if not left:
        return
    lines = [f"  pid {pid}: {_command_line(pid)[:200]}" for pid in left]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = "processes left running by the tests (now killed):\n" + "\n".join(lines)
    if reporter is not None:
        reporter.write_line(message, red=True)
    else:
        print(message, file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
