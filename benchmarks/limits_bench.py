"""How far `aggregator serve` is from the physical limit (issue 24), every figure beside its baseline in one run.

    .venv/bin/python benchmarks/limits_bench.py [--reps 7] [--calls 1000] [--block 50] [--upstreams 5]
        [--only startup|calls|memory] [--before DIR]

1. Start-up, broken down by phase (medians of interleaved runs, wall ms and the process's own CPU):
   the bare interpreter, importing what `serve` imports, spawn → `initialize` answered, spawn →
   `tools/list` answered (1 lazy upstream); beside the same for a direct upstream built on the SDK
   (`examples/toolbox.py`, the kind of server the aggregator fronts) and the stdlib test server.
2. Per call: sequential `tools/call echo` round trips, direct and through each path of ours
   (`catalog_call_tool`; a directly exposed `up01__echo`; each on the raw path and with
   `call_path: full`), interleaved in blocks in one run: p50/p90 added over direct, and the
   aggregator's CPU per call (from /proc).
3. Memory: the aggregator's own resident memory (its process tree minus the upstreams: the
   aggregator and its guard) with 1 and with N running upstreams, the cost of each additional one,
   and with 1 after a catalog search (what a session's first search loads).

Linux only (/proc). The upstream of 2 and 3 is `examples/testkit.py` (standard library only), so
the figures are the aggregator's own cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, get_default_environment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from passthrough_bench import cpu_seconds, process_of
from proxy_bench import TESTKIT, aggregator_params, pct, session_for, timed_calls

ROOT = Path(__file__).resolve().parent.parent
TOOLBOX = [str(ROOT / "examples" / "toolbox.py")]
SERVE_IMPORTS = "import aggregator.cli, aggregator.proxy.server, aggregator.upstream.pool, aggregator.downstream.stdio"
ECHO = {"server": "up01", "tool": "echo", "arguments": {"message": "p"}}
INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}


def write_config(directory: Path, count: int, expose: str = "catalog", call_path: str = "raw", tag: str = "") -> Path:
    upstreams = {
        f"up{i:02d}": {"command": sys.executable, "args": TESTKIT, "expose": expose, "call_path": call_path}
        for i in range(1, count + 1)
    }
    path = directory / f"limits-{count}-{expose}-{call_path}{tag}.yaml"
    path.write_text(json.dumps({"upstreams": upstreams}))
    return path


# ---------------------------------------------------------------- 1. start-up by phase


def own_cpu_ms(pid: int) -> float:
    return cpu_seconds(pid) * 1000


def run_to_exit(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU ms of a command that exits by itself."""
    started = time.perf_counter()
    before = os.times()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    after = os.times()
    cpu = (after.children_user - before.children_user + after.children_system - before.children_system) * 1000
    return (time.perf_counter() - started) * 1000, cpu


def spawn_to_list(argv: list[str]) -> tuple[float, float, float]:
    """Wall ms to `initialize` answered, to `tools/list` answered, and the server's own CPU ms then."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT)
    assert proc.stdin and proc.stdout

    def send(message: dict[str, Any]) -> None:
        assert proc.stdin
        proc.stdin.write((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())
        proc.stdin.flush()

    send({"id": 1, "method": "initialize", "params": INIT})
    proc.stdout.readline()
    initialized = (time.perf_counter() - started) * 1000
    send({"method": "notifications/initialized"})
    send({"id": 2, "method": "tools/list"})
    proc.stdout.readline()
    listed = (time.perf_counter() - started) * 1000
    cpu = own_cpu_ms(proc.pid)
    proc.stdin.close()
    proc.wait(timeout=30)
    return initialized, listed, cpu


def bench_startup(directory: Path, reps: int) -> None:
    python = [sys.executable]
    config = write_config(directory, 1)
    serve = aggregator_params(config)
    runs: dict[str, Any] = {
        "interpreter": lambda: run_to_exit([*python, "-c", "pass"]),
        "imports": lambda: run_to_exit([*python, "-c", SERVE_IMPORTS]),
        "aggregator": lambda: spawn_to_list([serve.command, *serve.args]),
        "direct SDK server": lambda: spawn_to_list([*python, *TOOLBOX]),
        "direct stdlib server": lambda: spawn_to_list([*python, *TESTKIT]),
    }
    for run in runs.values():  # unrecorded priming (page cache)
        run()
    samples: dict[str, list[tuple[float, ...]]] = {name: [] for name in runs}
    for rep in range(reps):
        names = list(runs)
        names = names[rep % len(names) :] + names[: rep % len(names)]
        for name in names:
            samples[name].append(runs[name]())

    def med(name: str, index: int) -> float:
        return statistics.median(sample[index] for sample in samples[name])

    print(f"1. Start-up, medians of {reps} interleaved runs (wall ms; own CPU ms)")
    rows = [("interpreter", "interpreter", 0, 1), ("+ the modules serve imports", "imports", 0, 1)]
    for name in ("aggregator", "direct SDK server", "direct stdlib server"):
        rows += [(f"{name}: initialize answered", name, 0, -1), (f"{name}: tools/list answered", name, 1, 2)]
    for label, name, wall, cpu in rows:
        cpu_text = f"   cpu {med(name, cpu):6.0f}" if cpu >= 0 else ""
        print(f"  {label:40} {med(name, wall):8.0f}{cpu_text}")
    ratio = med("aggregator", 1) / med("direct SDK server", 1)
    print(f"  aggregator / direct SDK server, to tools/list: {ratio:.2f}")


# ---------------------------------------------------------------- 2. per call


async def bench_calls(directory: Path, calls: int, block: int = 50, before: Path | None = None) -> None:
    """Every path of ours (tool naming × call path) beside the direct call, all in one interleaved run.

    `before`: the source tree of another commit (`git archive <ref> | tar -x -C DIR`); its raw paths
    join the same interleaved run, so a change is measured against its base under the same load.
    """
    catalog_call = ("catalog_call_tool", {"server": "up01", "tool": "echo", "arguments": {"message": "p"}})
    direct_call = ("up01__echo", {"message": "p"})
    namings = (("catalog_call_tool", "catalog", catalog_call), ("direct tool", "direct", direct_call))
    paths = {
        f"{label}, {path}": (write_config(directory, 1, expose, call_path=path), *call)
        for label, expose, call in namings
        for path in ("raw", "full")
    }
    direct_params = StdioServerParameters(command=sys.executable, args=TESTKIT)
    print(f"\n2. Sequential tools/call round trips ({calls} per path, interleaved blocks of {block}); ms")
    print(f"  {'':32} {'p50':>7} {'added p50':>10} {'added p90':>10} {'our CPU/call':>13}")
    async with AsyncExitStack() as stack:
        direct = await stack.enter_async_context(session_for(direct_params))
        await timed_calls(direct, "echo", {"message": "p"}, 200)  # warm-up; starts the upstream
        if before is not None:
            for label, expose, call in namings:
                config = write_config(directory, 1, expose, call_path="raw", tag="before")
                paths[f"{label}, raw (before)"] = (config, *call)
        sessions: dict[str, tuple[ClientSession, str, dict[str, Any], int | None]] = {}
        for label, (config, tool, args) in paths.items():
            params = aggregator_params(config)
            if label.endswith("(before)"):
                params.env = {**get_default_environment(), "PYTHONPATH": str(before)}
                params.cwd = before  # `-m` puts the working directory first on the path
            agg = await stack.enter_async_context(session_for(params))
            await timed_calls(agg, tool, args, 200)
            sessions[label] = (agg, tool, args, process_of(config))
        load_before = os.getloadavg()[0]
        samples, cpu = await interleaved(direct, sessions, calls, block)
        direct_ms = samples[DIRECT]
        print(f"  load average (1 min) {load_before:.2f} before the calls, {os.getloadavg()[0]:.2f} after")
        print(f"  {'direct (no aggregator)':32} {pct(direct_ms, 50):7.3f}")
        for label, agg_ms in samples.items():
            if label != DIRECT:
                added = [pct(agg_ms, p) - pct(direct_ms, p) for p in (50, 90)]
                print(
                    f"  {label:32} {pct(agg_ms, 50):7.3f} {added[0]:10.3f} {added[1]:10.3f}"
                    f" {cpu[label] / len(agg_ms) * 1000:13.3f}"
                )


DIRECT = "direct"


async def interleaved(
    direct: ClientSession,
    sessions: dict[str, tuple[ClientSession, str, dict[str, Any], int | None]],
    calls: int,
    block: int,
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Blocks of `block` calls on each session in turn (the order rotates every round); ms per call, and
    each aggregator's CPU seconds over its blocks."""
    samples: dict[str, list[float]] = {DIRECT: [], **{label: [] for label in sessions}}
    cpu = dict.fromkeys(sessions, 0.0)
    labels = [DIRECT, *sessions]
    for round_ in range(calls // block):
        shift = round_ % len(labels)
        for label in labels[shift:] + labels[:shift]:
            if label == DIRECT:
                samples[DIRECT] += await timed_calls(direct, "echo", {"message": "p"}, block)
                continue
            agg, tool, args, pid = sessions[label]
            before = cpu_seconds(pid)
            samples[label] += await timed_calls(agg, tool, args, block)
            cpu[label] += cpu_seconds(pid) - before
    return samples, cpu


# ---------------------------------------------------------------- 3. memory


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, queue = [root], [root]
    while queue:
        kids = children.get(queue.pop(), [])
        found += kids
        queue += kids
    return found


async def own_memory(directory: Path, count: int, search: bool = False) -> float:
    """RSS of the aggregator's tree minus its upstreams, all `count` upstreams running, after 200 calls
    (and one catalog search first if `search`: a session's first search loads the search vocabulary)."""
    config = write_config(directory, count)
    async with session_for(aggregator_params(config)) as agg:
        if search:
            await agg.call_tool("catalog_search_tools", {"query": "list the rows of a table"})
        for i in range(1, count + 1):
            await agg.call_tool(
                "catalog_call_tool", {"server": f"up{i:02d}", "tool": "echo", "arguments": {"message": "p"}}
            )
        await timed_calls(
            agg, "catalog_call_tool", {"server": "up01", "tool": "echo", "arguments": {"message": "p"}}, 200
        )
        pid = process_of(config)
        assert pid is not None
        total = 0.0
        for member in tree(pid):
            argv = Path(f"/proc/{member}/cmdline").read_bytes()
            if b"testkit.py" not in argv or b"guard.py" in argv:
                total += rss_mb(member)
        return total


async def bench_memory(directory: Path, upstreams: int) -> None:
    one = await own_memory(directory, 1)
    many = await own_memory(directory, upstreams)
    searched = await own_memory(directory, 1, search=True)
    print("\n3. Own resident memory (process tree minus upstreams), after 200 calls")
    print(f"  1 running upstream   {one:7.1f} MB")
    each = (many - one) / (upstreams - 1)
    print(f"  {upstreams} running upstreams  {many:7.1f} MB   +{each:.2f} MB per additional upstream")
    print(f"  1 running upstream, after a catalog search  {searched:7.1f} MB")


async def main() -> None:
    if not os.path.isdir("/proc"):
        sys.exit("limits_bench needs Linux (/proc)")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstreams", type=int, default=5, help="running upstreams for the memory figure")
    parser.add_argument("--reps", type=int, default=7, help="interleaved start-up runs")
    parser.add_argument("--calls", type=int, default=1000, help="round trips per path")
    parser.add_argument(
        "--block", type=int, default=50, help="calls per path in turn (smaller: a burst of load hits every path)"
    )
    parser.add_argument("--only", choices=["startup", "calls", "memory"], help="run one section")
    parser.add_argument("--before", type=Path, help="source tree of a base commit: its raw paths join section 2")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "startup"):
            bench_startup(Path(tmp), args.reps)
        if args.only in (None, "calls"):
            await bench_calls(Path(tmp), args.calls, args.block, before=args.before)
        if args.only in (None, "memory"):
            await bench_memory(Path(tmp), max(2, args.upstreams))


if __name__ == "__main__":
    anyio.run(main)
