"""uvloop or asyncio's own loop under `aggregator serve` (issue 24): what each costs in memory and buys per call.

    .venv/bin/python benchmarks/uvloop_bench.py [--calls 1000]

Two stdio `serve` processes on the same config shape (raw path, `catalog_call_tool`), one with uvloop
(the default when it is installed) and one with `AGGREGATOR_UVLOOP=0`, their calls interleaved in
blocks of 50 with a direct call to the same upstream as the baseline (`limits_bench.interleaved`):
added p50 / p90 latency, the aggregator's CPU per call, and each aggregator's RSS / PSS / private
memory after the calls. One run; read the two rows against each other.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
from mcp.client.stdio import StdioServerParameters, get_default_environment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from limits_bench import DIRECT, ECHO, interleaved, write_config
from memory_phases import rollup
from passthrough_bench import process_of
from proxy_bench import TESTKIT, aggregator_params, pct, session_for, timed_calls

LOOPS = {"uvloop": "1", "asyncio": "0"}  # label: AGGREGATOR_UVLOOP


async def compare(calls: int, block: int = 50) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with AsyncExitStack() as stack:
            upstream = StdioServerParameters(command=sys.executable, args=TESTKIT)
            direct = await stack.enter_async_context(session_for(upstream))
            await timed_calls(direct, "echo", {"message": "p"}, 200)  # warm-up; starts the upstream
            sessions: dict[str, tuple[Any, str, dict[str, Any], int | None]] = {}
            for label, flag in LOOPS.items():
                config = write_config(Path(tmp), 1, tag=f"-{label}")
                params = aggregator_params(config)
                params.env = {**get_default_environment(), "AGGREGATOR_UVLOOP": flag}
                agg = await stack.enter_async_context(session_for(params))
                await timed_calls(agg, "catalog_call_tool", ECHO, 200)
                sessions[label] = (agg, "catalog_call_tool", ECHO, process_of(config))
            samples, cpu = await interleaved(direct, sessions, calls, block)
            direct_ms = samples[DIRECT]
            print(f"{calls} sequential tools/call per loop, interleaved blocks of {block}; ms, MB")
            print(f"  direct (no aggregator) p50 {pct(direct_ms, 50):.3f}")
            columns = ("added p50", 10), ("added p90", 10), ("CPU/call", 9), ("rss", 6), ("pss", 6), ("private", 8)
            print(f"  {'loop':8} " + " ".join(f"{name:>{width}}" for name, width in columns))
            for label in LOOPS:
                added = [pct(samples[label], p) - pct(direct_ms, p) for p in (50, 90)]
                pid = sessions[label][3]
                memory = rollup(pid) if pid is not None else {"rss": 0.0, "pss": 0.0, "uss": 0.0}
                print(
                    f"  {label:8} {added[0]:10.3f} {added[1]:10.3f} {cpu[label] / len(samples[label]) * 1000:9.3f}"
                    f" {memory['rss']:6.1f} {memory['pss']:6.1f} {memory['uss']:8.1f}"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000, help="round trips per loop")
    anyio.run(compare, parser.parse_args().calls)


if __name__ == "__main__":
    main()
