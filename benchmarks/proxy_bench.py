"""Start-up and call overhead of `aggregator serve`, measured side by side in one run.

    .venv/bin/python benchmarks/proxy_bench.py [--calls 1000] [--reps 5] [--upstreams 50]

1. Start-up: wall time from spawning `aggregator serve` until `initialize` and
   `tools/list` are both answered, with 1 and with N configured lazy upstreams
   (interleaved repetitions; target: the same within 10 %, nothing is spawned).
2. Overhead: sequential `catalog_call_tool(echo)` round trips through the
   aggregator versus the same upstream tool called directly by the same client,
   interleaved in blocks so machine noise hits both alike (target: median added
   latency under 1 ms).
3. Concurrency: 200 concurrent calls with distinct payloads; none may be lost or
   answered with another call's result.

The upstream is `examples/testkit.py` (standard library only), so the figures
are the aggregator's own cost, not an SDK server's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

ROOT = Path(__file__).resolve().parent.parent
TESTKIT = [str(ROOT / "examples" / "testkit.py")]


def write_config(directory: Path, count: int) -> Path:
    upstreams = {f"up{i:02d}": {"command": sys.executable, "args": TESTKIT} for i in range(1, count + 1)}
    path = directory / f"agg-{count}.yaml"
    path.write_text(json.dumps({"upstreams": upstreams}))
    return path


def aggregator_params(config: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "aggregator", "serve", "--config", str(config)])


@asynccontextmanager
async def session_for(params: StdioServerParameters) -> AsyncIterator[ClientSession]:
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def cold_start(config: Path) -> float:
    started = time.perf_counter()
    async with session_for(aggregator_params(config)) as session:
        await session.list_tools()
        return (time.perf_counter() - started) * 1000


async def bench_startup(directory: Path, upstreams: int, reps: int) -> None:
    configs = {1: write_config(directory, 1), upstreams: write_config(directory, upstreams)}
    for config in configs.values():  # unrecorded priming start (page cache, imports)
        await cold_start(config)
    times: dict[int, list[float]] = {n: [] for n in configs}
    for rep in range(reps):
        order = list(configs) if rep % 2 == 0 else list(reversed(configs))
        for n in order:
            times[n].append(await cold_start(configs[n]))
    one, many = statistics.median(times[1]), statistics.median(times[upstreams])
    print("Start-up until initialize + tools/list answered (median of", reps, "interleaved runs)")
    print(f"  1 upstream      {one:8.1f} ms")
    print(f"  {upstreams} upstreams    {many:8.1f} ms   ratio {many / one:.3f}")


async def timed_calls(session: ClientSession, tool: str, args: dict[str, object], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        result = await session.call_tool(tool, args)
        samples.append((time.perf_counter() - started) * 1000)
        assert not result.is_error, result
    return samples


def pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def bench_overhead(directory: Path, calls: int, block: int = 50) -> None:
    config = write_config(directory, 1)
    direct_params = StdioServerParameters(command=sys.executable, args=TESTKIT)
    proxied_args = {"server": "up01", "tool": "echo", "arguments": {"message": "ping"}}
    async with session_for(direct_params) as direct, session_for(aggregator_params(config)) as agg:
        await timed_calls(direct, "echo", {"message": "ping"}, 200)  # warm-up, starts the upstream
        await timed_calls(agg, "catalog_call_tool", proxied_args, 200)
        direct_ms: list[float] = []
        agg_ms: list[float] = []
        for round_ in range(calls // block):
            pair = [
                (direct, "echo", {"message": "ping"}, direct_ms),
                (agg, "catalog_call_tool", proxied_args, agg_ms),
            ]
            for session, tool, args, sink in pair if round_ % 2 == 0 else reversed(pair):
                sink.extend(await timed_calls(session, tool, args, block))
        print(f"\nSequential round trips ({len(agg_ms)} each, interleaved blocks of {block})")
        print(f"  {'':12} {'p50':>7} {'p90':>7} {'p99':>7}  (ms)")
        for label, samples in (("direct", direct_ms), ("aggregator", agg_ms)):
            print(f"  {label:12} {pct(samples, 50):7.3f} {pct(samples, 90):7.3f} {pct(samples, 99):7.3f}")
        print(
            f"  added p50 {pct(agg_ms, 50) - pct(direct_ms, 50):.3f} ms,"
            f" p90 {pct(agg_ms, 90) - pct(direct_ms, 90):.3f} ms"
        )
        await bench_concurrency(agg)


async def bench_concurrency(session: ClientSession, count: int = 200) -> None:
    answers: dict[int, str] = {}

    async def one(i: int) -> None:
        result = await session.call_tool(
            "catalog_call_tool", {"server": "up01", "tool": "echo", "arguments": {"message": f"call-{i}"}}
        )
        answers[i] = result.content[0].text

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(one, i)
    wall = (time.perf_counter() - started) * 1000
    matched = sum(1 for i, text in answers.items() if text == f"call-{i}")
    print(f"\n{count} concurrent calls: {wall:.0f} ms wall, {len(answers)} answered, {matched} matched their request")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--upstreams", type=int, default=50)
    parser.add_argument("--skip-startup", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_startup:
            await bench_startup(Path(tmp), args.upstreams, args.reps)
        await bench_overhead(Path(tmp), args.calls)


if __name__ == "__main__":
    anyio.run(main)
