"""Added latency of `prompts/get` and `resources/read` through `aggregator serve`, measured in one run.

    .venv/bin/python benchmarks/passthrough_bench.py [--requests 1000]

Sequential round trips of the same request, sent by the same client to the
upstream directly and through the aggregator, interleaved in blocks so machine
noise hits both alike (target: median added latency under 1 ms, as for calls).
`tools/call` is measured beside them as the reference. The upstream is
`examples/testkit.py` (standard library only), so the figures are the
aggregator's own cost. On Linux the aggregator's CPU time per request (from
/proc) is printed too: on a loaded machine it is steadier than wall time.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_bench import TESTKIT, aggregator_params, pct, session_for, write_config

Request = Callable[[ClientSession], Awaitable[object]]


async def timed(session: ClientSession, request: Request, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await request(session)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def process_of(config: Path) -> int | None:
    """The pid of the `aggregator serve` running `config` (Linux), else None."""
    if not os.path.isdir("/proc"):
        return None
    for entry in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(config).encode() in argv and b"serve" in argv:
            return int(entry)
    return None


def cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def kinds() -> dict[str, tuple[Request, Request]]:
    """(direct, through the aggregator) for each request kind."""
    return {
        "prompts/get": (
            lambda s: s.get_prompt("greet", {"name": "Ada"}),
            lambda s: s.get_prompt("up01__greet", {"name": "Ada"}),
        ),
        "resources/read": (
            lambda s: s.read_resource("testkit://items/7"),
            lambda s: s.read_resource("testkit://items/7"),
        ),
        "tools/call": (
            lambda s: s.call_tool("echo", {"message": "ping"}),
            lambda s: s.call_tool(
                "catalog_call_tool", {"server": "up01", "tool": "echo", "arguments": {"message": "p"}}
            ),
        ),
    }


async def bench(requests: int, block: int = 50) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = write_config(Path(tmp), 1)
        direct_params = StdioServerParameters(command=sys.executable, args=TESTKIT)
        async with session_for(direct_params) as direct, session_for(aggregator_params(config)) as agg:
            await agg.call_tool("catalog_list_tools", {"server": "up01"})  # starts the upstream, lists its prompts
            pid = process_of(config)
            print(f"Sequential round trips ({requests} each, interleaved blocks of {block}); ms")
            header = ["direct p50", "ours p50", "added p50", "added p90", "added p99", "our CPU/req"]
            print(f"  {'':16}" + "".join(f" {h:>11}" for h in header))
            for kind, (via_direct, via_agg) in kinds().items():
                await timed(direct, via_direct, 100)  # warm-up
                await timed(agg, via_agg, 100)
                direct_ms: list[float] = []
                agg_ms: list[float] = []
                cpu = 0.0
                for round_ in range(requests // block):
                    pair = [(direct, via_direct, direct_ms), (agg, via_agg, agg_ms)]
                    for session, request, sink in pair if round_ % 2 == 0 else reversed(pair):
                        before = cpu_seconds(pid) if session is agg else 0.0
                        sink.extend(await timed(session, request, block))
                        cpu += cpu_seconds(pid) - before if session is agg else 0.0
                added = [pct(agg_ms, p) - pct(direct_ms, p) for p in (50, 90, 99)]
                figures = [pct(direct_ms, 50), pct(agg_ms, 50), *added, cpu / len(agg_ms) * 1000]
                print(f"  {kind:16}" + "".join(f" {value:11.3f}" for value in figures))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    args = parser.parse_args()
    await bench(args.requests)


if __name__ == "__main__":
    anyio.run(main)
