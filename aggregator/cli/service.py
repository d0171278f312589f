"""The per-user service: `aggregator serve --transport socket`, `aggregator service status|stop|logs`, and
the `connect` entry in the help (`aggregator connect` itself is dispatched before this is imported).

One service runs per user and config (`aggregator.downstream.runtime`): the first `connect` starts it
detached; it holds its pid file locked while it lives (so exactly one runs, and a SIGKILL
frees the place at once), serves every attached client as its own MCP session over the
Unix socket (`downstream/unix.py`) with one shared upstream pool behind them, answers
`service status` on a second socket, and stops after `AGGREGATOR_SERVICE_IDLE_SECONDS`
with no client attached.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio

from aggregator.downstream.runtime import (
    RUNTIME_DIR_ENV,
    ServiceFiles,
    connect_target,
    private_dir,
    read_pid_file,
    service_files,
    service_running,
    try_connect,
)
from aggregator.downstream.stdio import StdioLimits
from aggregator.log import get_logger
from aggregator.settings import Settings

__all__ = ["Claim", "claim_service", "register", "run_service"]

log = get_logger(__name__)

CLAIM_WAIT = 30.0  # seconds to wait for a previous service that is still shutting down
STOP_WAIT = 15.0  # seconds `service stop` waits after SIGTERM before SIGKILL


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    connect = sub.add_parser(
        "connect",
        parents=[common],
        help="what an MCP client runs: attach to this user's aggregator service (starting it), hand it stdio",
        description="What a client's config runs instead of serve: attach to the running aggregator service of this "
        "user and config (starting it when none runs) and carry the client's stdio to it. One set of upstreams "
        "serves every client (docs/service.md).",
    )
    connect.add_argument("--data-dir", type=Path, help="where indexes and snapshots live (as for serve)")
    connect.set_defaults(standalone=_connect)
    service = sub.add_parser(
        "service",
        parents=[common],
        help="the per-user service behind `connect`",
        description="Operate the per-user service that `connect` attaches to: status, stop, logs.",
    )
    actions = service.add_subparsers(dest="action", required=True)
    for name, what, handler in (
        ("status", "pid, socket, uptime, clients, upstreams, memory", _status),
        ("stop", "stop the service (attached clients reconnect on their next message)", _stop),
        ("logs", "where the service's log file is, and its last lines", _logs),
    ):
        action = actions.add_parser(name, parents=[common], help=what)
        action.add_argument("--data-dir", type=Path, help="the data dir the service was started with")
        if name != "stop":
            action.add_argument("--json", action="store_true", help="print JSON")
        if name == "logs":
            action.add_argument("--lines", type=int, default=20, help="how many last lines to show")
        action.set_defaults(standalone=handler)


async def _connect(args: argparse.Namespace, settings: Settings) -> int:  # pragma: no cover - dispatched earlier
    from aggregator.downstream.connect import main as connect_main

    argv = [f"--{key.replace('_', '-')}={value}" for key, value in vars(args).items() if key in ("config", "data_dir")]
    return connect_main(argv)


def files_for(args: argparse.Namespace) -> ServiceFiles:
    """The service files `connect` with the same arguments in this directory would use."""
    config, data_dir = connect_target(
        _text(getattr(args, "config", None)), _text(getattr(args, "data_dir", None)), os.environ, os.getcwd()
    )
    return service_files(config, data_dir)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


# ---------------------------------------------------------------- the service itself


@dataclass
class Claim:
    """The running service's place: its files and the descriptor holding the pid lock (open while we live)."""

    files: ServiceFiles
    lock_fd: int
    started: float


def claim_service(args: argparse.Namespace, config_source: str) -> Claim | str:
    """Take the pid lock of this user's service for this config, or say why not (another one runs)."""
    import fcntl  # not at the top: the CLI imports this module on Windows too, where there is no service

    files = files_for(args)
    private_dir(files.directory)
    fd = os.open(files.pid, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + CLAIM_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            probe = try_connect(files.socket)
            if probe is not None:
                probe.close()
            if probe is not None or time.monotonic() > deadline:
                os.close(fd)
                owner = (read_pid_file(files.pid) or {}).get("pid", "?")
                return f"the service for this config already runs (pid {owner}, socket {files.socket})"
            time.sleep(0.05)  # the previous one is shutting down: its socket is gone, its lock not yet
    started = time.time()
    # the pid first: `connect` reads it without json (`downstream.connect._holder_pid`)
    info = {"pid": os.getpid(), "config": config_source, "socket": str(files.socket), "started": started}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    return Claim(files, fd, started)


async def run_service(server: Any, claim: Claim, settings: Settings) -> None:
    """Serve attached clients until idle for `service_idle_seconds` (or cancelled); then remove the sockets."""
    from aggregator.downstream.unix import Attached, listen_unix, serve_connections

    limits = StdioLimits(max_in_flight=settings.max_in_flight, drain_seconds=settings.drain_seconds)
    attached = Attached()
    listeners = [listen_unix(Path(claim.files.socket)), listen_unix(Path(claim.files.control))]
    log.info("service listening", socket=str(claim.files.socket), pid=os.getpid())
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve_connections, server, listeners[0], limits, attached)
            tg.start_soon(_serve_status, listeners[1], server, claim, attached)
            await _until_idle(attached, settings.service_idle_seconds)
            log.info("no client for a while: stopping", idle_seconds=settings.service_idle_seconds)
            tg.cancel_scope.cancel()
    finally:
        for path, listener in zip((claim.files.socket, claim.files.control), listeners, strict=True):
            listener.close()
            Path(path).unlink(missing_ok=True)  # before the pid lock goes with the process: a successor binds anew


async def _until_idle(attached: Any, idle_seconds: float) -> None:
    """Return once no client has been attached for `idle_seconds` (0: never)."""
    while True:
        changed = attached.changed
        if attached.now or not idle_seconds:
            await changed.wait()
            continue
        with anyio.move_on_after(idle_seconds):
            await changed.wait()
        if not changed.is_set():
            return


async def _serve_status(listener: socket.socket, server: Any, claim: Claim, attached: Any) -> None:
    """Each connection to the control socket gets one JSON line of status, then is closed."""
    from aggregator.downstream.unix import accept

    while True:
        conn = await accept(listener)
        with conn:
            data = json.dumps(status_of(server, claim, attached)).encode() + b"\n"
            conn.setblocking(True)
            conn.settimeout(1.0)
            with suppress(OSError):
                await anyio.to_thread.run_sync(conn.sendall, data)


def status_of(server: Any, claim: Claim, attached: Any) -> dict[str, Any]:
    from aggregator.upstream.guard import descendants

    upstreams = [{"name": s.name, "state": s.state, "tools": s.tool_count} for s in server.pool.statuses()]
    children = descendants(os.getpid()) if sys.platform.startswith("linux") else []
    return {
        "pid": os.getpid(),
        "socket": str(claim.files.socket),
        "config": server.pool.config.source,
        "log": str(claim.files.log),
        "uptime_seconds": round(time.time() - claim.started, 1),
        "clients_attached": attached.now,
        "clients_total": attached.total,
        "upstreams_running": sum(u["state"] == "ready" for u in upstreams),
        "upstreams": upstreams,
        "processes": 1 + len(children),
        "rss_bytes": _rss(os.getpid()),
        "rss_bytes_with_upstreams": sum(_rss(pid) for pid in [os.getpid(), *children]),
    }


def _rss(pid: int) -> int:
    """Resident memory of `pid` in bytes (Linux /proc), 0 where unknown."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


# ---------------------------------------------------------------- service status | stop | logs


def service_health(args: argparse.Namespace) -> tuple[Literal["ok", "note", "problem"], str, str]:
    """For `doctor`: (level, what was found, the fix) about the service of this config."""
    files = files_for(args)
    try:
        if os.path.lexists(files.directory):  # checked, not created: doctor changes nothing
            private_dir(files.directory)
    except OSError as exc:
        return "problem", f"the runtime directory cannot be used: {exc}", f"fix it, or set {RUNTIME_DIR_ENV}"
    status = query_status(files)
    if status is not None:
        detail = (
            f"runs (pid {status['pid']}, {status['clients_attached']} clients attached, "
            f"{status['upstreams_running']} upstreams running, up {status['uptime_seconds']:.0f}s) at {files.socket}"
        )
        return "ok", detail, ""
    if service_running(files.pid):
        return "problem", f"a service holds {files.pid} but does not answer", "aggregator service stop"
    return "ok", f"none runs for this config; the first `aggregator connect` starts one ({files.socket})", ""


def query_status(files: ServiceFiles, timeout: float = 5.0) -> dict[str, Any] | None:
    """The running service's status, or None when none answers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        try:
            conn.connect(str(files.control))
            data = b""
            while chunk := conn.recv(1 << 16):
                data += chunk
            found = json.loads(data)
        except (OSError, ValueError):
            return None
    return found if isinstance(found, dict) else None


async def _status(args: argparse.Namespace, settings: Settings) -> int:
    files = files_for(args)
    status = query_status(files)
    if args.json:
        print(json.dumps({"running": status is not None, "socket": str(files.socket), **(status or {})}, indent=2))
    elif status is None:
        print(f"no service runs for this config (its socket would be {files.socket}); `connect` starts one")
    else:
        print(_status_text(status))
    return 0 if status is not None else 3


def _status_text(status: dict[str, Any]) -> str:
    mib = 1024 * 1024
    states = ", ".join(f"{u['name']} {u['state']}" for u in status["upstreams"]) or "none configured"
    return "\n".join(
        [
            f"pid:       {status['pid']}",
            f"socket:    {status['socket']}",
            f"config:    {status['config']}",
            f"uptime:    {status['uptime_seconds']:.0f}s",
            f"clients:   {status['clients_attached']} attached ({status['clients_total']} since start)",
            f"upstreams: {status['upstreams_running']} running ({states})",
            f"memory:    {status['rss_bytes'] / mib:.1f} MiB service, "
            f"{status['rss_bytes_with_upstreams'] / mib:.1f} MiB with its {status['processes'] - 1} child processes",
            f"log:       {status['log']}",
        ]
    )


async def _stop(args: argparse.Namespace, settings: Settings) -> int:
    files = files_for(args)
    info = read_pid_file(files.pid)
    if info is None or not service_running(files.pid):
        print("no service runs for this config")
        return 0
    pid = int(info["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT
    while service_running(files.pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            print(f"the service (pid {pid}) did not stop within {STOP_WAIT:g}s: killed")
            return 1
        await anyio.sleep(0.05)
    print(f"stopped the service (pid {pid})")
    return 0


async def _logs(args: argparse.Namespace, settings: Settings) -> int:
    files = files_for(args)
    try:
        lines = Path(files.log).read_text(errors="replace").splitlines()[-max(args.lines, 0) :] if args.lines else []
    except FileNotFoundError:
        lines = []
    if args.json:
        print(json.dumps({"log": str(files.log), "lines": lines}, indent=2))
    else:
        print(f"log: {files.log}")
        print("\n".join(lines))
    return 0
