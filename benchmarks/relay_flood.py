"""Memory and admission under a flood of upstream→client requests (issue 20.11).

Run by hand: `.venv/bin/python benchmarks/relay_flood.py [--requests N] [--answer-ms MS]`.
Starts a real stdio `aggregator serve` in front of tests/rogue_upstream.py, whose `flood` tool sends
N `sampling/createMessage` requests to its client at once. The client answers each after MS ms.
Prints the aggregator's RSS idle (the baseline, same run), its peak during the flood and the
growth, how many requests reached the client (and the most at once) and how many were refused.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import aggregator_client, structured, write_config  # noqa: E402
from tests.test_downstream_faults import rss_kib  # noqa: E402
from tests.test_isolation import SAMPLE, call, rogue  # noqa: E402


def aggregator_pid(config: Path) -> int:
    """The pid of the `aggregator serve` reading `config` (found by its command line)."""
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"serve" in cmdline and str(config).encode() in cmdline:
            return int(proc.name)
    raise SystemExit("the aggregator process was not found")


async def run(requests: int, answer_ms: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = write_config(Path(tmp), {"rogue": rogue(timeouts={"call": 600})})
        at_once = most = 0

        async def sampling(ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
            nonlocal at_once, most
            at_once += 1
            most = max(most, at_once)
            await anyio.sleep(answer_ms / 1000)
            at_once -= 1
            return types.CreateMessageResult(
                role="assistant", content=types.TextContent(type="text", text="ok"), model="m"
            )

        async with aggregator_client(config, sampling_callback=sampling) as session:
            await session.call_tool("catalog_list_tools", {"server": "rogue"})
            pid = aggregator_pid(config)
            idle = peak = rss_kib(pid)
            done = anyio.Event()

            async def watch() -> None:
                nonlocal peak
                while not done.is_set():
                    peak = max(peak, rss_kib(pid))
                    await anyio.sleep(0.02)

            started = time.perf_counter()
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                args = call("rogue", "flood", n=requests, method="sampling/createMessage", params=SAMPLE)
                summary = structured(await session.call_tool("catalog_call_tool", args))
                done.set()
            seconds = time.perf_counter() - started
        print(f"requests sent by the upstream: {requests}, client answers after {answer_ms:g} ms")
        print(f"reached the client: {summary['results']} (at most {most} at once); refused: {summary['errors']}")
        print(f"refusal: {summary['messages'][:1]}")
        growth = (peak - idle) / 1024
        print(f"aggregator RSS idle {idle / 1024:.1f} MiB, peak {peak / 1024:.1f} MiB, growth {growth:.1f} MiB")
        print(f"flood answered in {seconds:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--answer-ms", type=float, default=50.0)
    args = parser.parse_args()
    anyio.run(run, args.requests, args.answer_ms)


if __name__ == "__main__":
    main()
