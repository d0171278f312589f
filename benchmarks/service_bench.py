"""One shared service behind `aggregator connect` versus one `aggregator serve` per client, in one run.

    .venv/bin/python benchmarks/service_bench.py [--clients 3] [--upstreams 10] [--attaches 20] [--calls 300]

1. Footprint: N clients each call each of the 10 upstreams once, first through N
   separate `aggregator serve`s, then through N `aggregator connect`s to one service.
   Counted: every process of the client's side (aggregators, connects, guards,
   upstreams) and their total RSS (Linux /proc). Target: upstream processes and
   RSS at most ~1/N of the `serve` case plus the service's own.
2. Warm attach: with the service running, wall time from spawning `connect` to
   the answer of `initialize` (p50 and min of `--attaches`), beside the time this
   machine takes to start `python -c pass` (the floor of any Python process).
   Target: under 0.1 s.
3. The connect hop: sequential `ping` and `catalog_call_tool(echo)` round trips through
   `connect` (stdio handed to the service), `connect --relay` (messages carried) and the
   service's socket spoken to directly, versus plain stdio `serve`, interleaved in blocks
   so machine noise hits all alike; the added p50 per call. Target: under 0.2 ms.

Upstreams: the official servers where `.ci/servers` has them (server-memory,
-filesystem, -everything via node; mcp-server-time via its venv), the rest
`examples/testkit.py` (standard library only, starts in tens of ms).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aggregator.upstream import guard_build  # noqa: E402  (after the path insert)
from aggregator.upstream.guard import descendants  # noqa: E402

NODE = ROOT / ".ci" / "servers" / "node" / "node_modules" / "@modelcontextprotocol"
PY_BIN = ROOT / ".ci" / "servers" / "py" / "bin"
INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}


def upstreams(count: int, work: Path) -> tuple[dict[str, Any], dict[str, tuple[str, dict[str, Any]]]]:
    """(config entries, name -> (tool, arguments) to call once); official servers first where installed."""
    entries: dict[str, Any] = {}
    calls: dict[str, tuple[str, dict[str, Any]]] = {}
    if shutil.which("node"):
        official = {
            "memory": ("server-memory", [], {"MEMORY_FILE_PATH": str(work / "memory.jsonl")}, "read_graph", {}),
            "filesystem": ("server-filesystem", [str(work)], {}, "list_allowed_directories", {}),
            "everything": ("server-everything", ["stdio"], {}, "echo", {"message": "hi"}),
        }
        for name, (package, args, env, tool, arguments) in official.items():
            index = NODE / package / "dist" / "index.js"
            if index.exists() and len(entries) < count - 1:  # one testkit at least: the hop target
                entries[name] = {"command": "node", "args": [str(index), *args], "env": env}
                calls[name] = (tool, arguments)
    if (PY_BIN / "mcp-server-time").exists() and len(entries) < count - 1:
        entries["time"] = {"command": str(PY_BIN / "mcp-server-time"), "args": []}
        calls["time"] = ("get_current_time", {"timezone": "UTC"})
    for number in range(1, count - len(entries) + 1):
        name = f"kit{number:02d}"
        entries[name] = {"command": sys.executable, "args": [str(ROOT / "examples" / "testkit.py")]}
        calls[name] = ("echo", {"message": name})
    return entries, calls


class Client:
    """A raw JSON-RPC client over a child's stdio (no SDK: its own cost stays out of the figures)."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
        )
        self.next_id = 0

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self._send(json.dumps(message).encode() + b"\n")
        while True:
            line = self._line()
            if not line:
                raise RuntimeError(f"{method}: the aggregator closed its stdout")
            reply = json.loads(line)
            if reply.get("id") == self.next_id and "method" not in reply:
                return dict(reply)

    def initialize(self) -> float:
        """Seconds from spawning to the answer of initialize."""
        assert "result" in self.request("initialize", INIT)
        seconds = time.perf_counter() - self.started
        self._send(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        return seconds

    def _send(self, data: bytes) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def _line(self) -> bytes:
        assert self.proc.stdout
        return self.proc.stdout.readline()

    def call(self, server: str, tool: str, arguments: dict[str, Any]) -> None:
        reply = self.request(
            "tools/call",
            {"name": "catalog_call_tool", "arguments": {"server": server, "tool": tool, "arguments": arguments}},
        )
        result = reply.get("result") or {}
        if "error" in reply or result.get("isError"):
            raise RuntimeError(f"{server}.{tool} failed: {str(reply)[:300]}")

    def close(self) -> tuple[float, int]:
        """End the client; (CPU seconds it used, its peak RSS in bytes)."""
        assert self.proc.stdin
        self.proc.stdin.close()
        _pid, status, usage = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        return usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


def rss(pids: list[int]) -> int:
    """Total resident memory of `pids` in bytes."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", encoding="ascii") as fh:
                total += int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            continue
    return total


def tree_rss(pids: list[int]) -> tuple[int, int]:
    """(processes, total RSS in bytes) of `pids` and everything below them."""
    every = sorted({p for pid in pids for p in [pid, *descendants(pid)]})
    return len(every), rss(every)


def upstream_count(pids: list[int]) -> int:
    """Upstream server processes below `pids` (not `pids` themselves, nor the guards that wrap upstreams)."""
    below = {p for root in pids for p in descendants(root)} - set(pids)
    return sum(1 for pid in below if Path(f"/proc/{pid}").exists() and guard_build.kind_of(pid) is None)


def footprint(
    command: list[str], env: dict[str, str], clients: int, calls: dict[str, tuple[str, dict[str, Any]]], service: Any
) -> dict[str, Any]:
    opened = [Client(command, env) for _ in range(clients)]
    try:
        for client in opened:
            client.initialize()
        for client in opened:
            for server, (tool, arguments) in calls.items():
                client.call(server, tool, arguments)
        roots = [client.proc.pid for client in opened]
        service_pid = service() if service else None
        if service_pid:
            roots.append(service_pid)
        processes, total = tree_rss(roots)
        mib = 2**20
        return {
            "processes": processes,
            "rss_mib": round(total / mib, 1),
            "upstreams": upstream_count(roots),
            "clients_side_mib": round(rss([client.proc.pid for client in opened]) / mib, 1),  # serves or connects
            "service_mib": round(rss([service_pid]) / mib, 1) if service_pid else 0.0,
        }
    finally:
        for client in opened:
            client.close()


def timed(client: Any, server: str | None, calls: int) -> list[float]:
    """Seconds of each of `calls` sequential round trips: `echo` on `server`, or `ping` when None."""
    times = []
    for number in range(calls):
        started = time.perf_counter()
        if server is None:
            client.request("ping", {})
        else:
            client.call(server, "echo", {"message": f"m{number}"})
        times.append(time.perf_counter() - started)
    return times


class SocketClient(Client):
    """The service's socket spoken to directly: the same session without the `connect` process between."""

    def __init__(self, runtime: Path) -> None:
        self.started = time.perf_counter()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(next(runtime.glob("*.sock"))))
        self.reader = self.sock.makefile("rb")
        self.next_id = 0

    def _send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _line(self) -> bytes:
        return self.reader.readline()

    def close(self) -> tuple[float, int]:
        self.sock.close()
        return 0.0, 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid` so far (Linux /proc, clock ticks)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def python_floor(reps: int) -> tuple[float, float, int]:
    """`python -c pass` on this machine: p50 wall seconds, p50 CPU seconds, peak RSS bytes."""
    walls, cpus, peaks = [], [], []
    for _ in range(reps):
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        _pid, _status, usage = os.wait4(proc.pid, 0)
        proc.returncode = 0
        walls.append(time.perf_counter() - started)
        cpus.append(usage.ru_utime + usage.ru_stime)
        peaks.append(usage.ru_maxrss * 1024)
    return statistics.median(walls), statistics.median(cpus), max(peaks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--upstreams", type=int, default=10)
    parser.add_argument("--attaches", type=int, default=20)
    parser.add_argument("--calls", type=int, default=100, help="calls per block in the hop measurement")
    parser.add_argument("--blocks", type=int, default=10)
    options = parser.parse_args()

    # As an installed package is: compiled. Without it (PYTHONDONTWRITEBYTECODE) every start compiles the source.
    compile_all = [sys.executable, "-m", "compileall", "-q", str(ROOT / "aggregator")]
    subprocess.run(compile_all, check=True, capture_output=True)
    work = Path(tempfile.mkdtemp(prefix="svcb-", dir="/tmp"))
    runtime = work / "rt"
    entries, calls = upstreams(options.upstreams, work)
    config = work / "aggregator.yaml"
    config.write_text(json.dumps({"upstreams": entries}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGGREGATOR_")}
    env.update(AGGREGATOR_RUNTIME_DIR=str(runtime), AGGREGATOR_DATA_DIR=str(work / "data"))
    serve = [sys.executable, "-m", "aggregator", "serve", "--config", str(config)]
    connect = [sys.executable, "-m", "aggregator", "connect", "--config", str(config)]
    print(f"upstreams: {', '.join(entries)}")

    def service_pid() -> int | None:
        pid_files = list(runtime.glob("*.pid"))
        return int(json.loads(pid_files[0].read_text())["pid"]) if pid_files else None

    try:
        separate = footprint(serve, env, options.clients, calls, None)
        shared = footprint(connect, env, options.clients, calls, service_pid)
        print(f"\n1. footprint, {options.clients} clients x {len(calls)} upstreams, each called once per client")
        print(f"   {options.clients} x serve:   {separate}")
        print(f"   connect+service: {shared}")
        print(
            f"   ratio connect/serve: processes {shared['processes'] / separate['processes']:.2f}, "
            f"upstreams {shared['upstreams'] / separate['upstreams']:.2f}, "
            f"RSS {shared['rss_mib'] / separate['rss_mib']:.2f}"
        )

        attach, cpu, peak = [], [], []
        for _ in range(options.attaches):
            client = Client(connect, env)
            attach.append(client.initialize())
            used, most = client.close()
            cpu.append(used)
            peak.append(most)
        floor_wall, floor_cpu, floor_peak = python_floor(options.attaches)
        mib = 2**20
        print(f"\n2. warm attach (spawn connect -> initialize answered), {options.attaches} runs")
        print(
            f"   wall p50 {statistics.median(attach) * 1000:.1f} ms, min {min(attach) * 1000:.1f} ms; "
            f"connect's CPU p50 {statistics.median(cpu) * 1000:.0f} ms, peak RSS {max(peak) / mib:.1f} MiB"
        )
        print(
            f"   floor on this machine, `python -c pass`: wall p50 {floor_wall * 1000:.1f} ms, "
            f"CPU p50 {floor_cpu * 1000:.0f} ms, peak RSS {floor_peak / mib:.1f} MiB"
        )

        target = "kit01"
        print(f"\n3. per call, {options.blocks} interleaved blocks of {options.calls} calls per path")
        paths = {
            "serve": Client(serve, env),
            "connect": Client(connect, env),
            "relay": Client([*connect, "--relay"], env),
            "socket": SocketClient(runtime),
        }
        for client in paths.values():
            client.initialize()
            timed(client, target, 20)  # warm: the upstream is started, the code paths are hot
        relay = paths["relay"].proc.pid  # type: ignore[attr-defined]
        for kind in ("ping", "echo"):
            times: dict[str, list[float]] = {name: [] for name in paths}
            cpu_before = cpu_seconds(relay)
            for _ in range(options.blocks):
                for name, client in paths.items():
                    times[name] += timed(client, target if kind == "echo" else None, options.calls)
            relay_cpu = (cpu_seconds(relay) - cpu_before) / len(times["relay"])
            p50 = {name: statistics.median(found) * 1000 for name, found in times.items()}
            print(
                f"   {kind}: p50 serve {p50['serve']:.3f} ms, connect {p50['connect']:.3f} ms "
                f"({p50['connect'] - p50['serve']:+.3f}), connect --relay {p50['relay']:.3f} ms "
                f"({p50['relay'] - p50['serve']:+.3f}; CPU of the relay per call {relay_cpu * 1e6:.0f} us), "
                f"the service's socket spoken to directly {p50['socket']:.3f} ms"
            )
        for client in paths.values():
            client.close()
    finally:
        pid = service_pid()
        if pid:
            os.kill(pid, signal.SIGTERM)
            for _ in range(200):
                if not Path(f"/proc/{pid}").exists():
                    break
                time.sleep(0.05)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
