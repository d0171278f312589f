"""Soak: mixed calls against upstreams that crash, hang and flood at random, over stdio and HTTP.

    .venv/bin/python benchmarks/soak.py [--seconds 600] [--seed 1] [--workers 4]

Two `aggregator serve` processes run the same config, one spoken to over stdio and one over
streamable HTTP. Their upstreams are `examples/testkit.py`: `steady` and `flaky` over stdio
(`flaky` leaves a setsid() grandchild behind at every start), `storm` (answers every listing
with `tools/list_changed`) and `web`, a testkit served over HTTP. Workers pick calls at random
(seeded): echoes, short sleeps, hangs past the call timeout, crashes, results over
`max_message_bytes`, progress floods and invalid answers.

Prints: calls made and answered, outcomes by reason, each aggregator's RSS and open fds after a
warm-up and at the end, and orphans (processes carrying this run's marker in their environment
that are still alive after both aggregators stopped). Targets: every call answered, RSS growth
under 10 MB, fds flat, 0 orphans. Not run in CI.

Reading the fd figures: under uvloop each stdio upstream's stdin and stdout are socket pairs
(libuv), so `socket` counts those as well as HTTP connections; the samples over time show
whether the count drifts or only follows how many upstreams are up at that moment.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parent.parent
TESTKIT = str(ROOT / "examples" / "testkit.py")
CALL_TIMEOUT = 3.0  # the upstreams' call timeout: hangs end as `timeout` faults
ANSWER_LIMIT = 60.0  # a call not answered within this counts as unanswered
CAP = 1024 * 1024  # max_message_bytes of every upstream


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, seconds: float = 30) -> None:
    import socket

    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def write_config(directory: Path, web_port: int, marker: str) -> Path:
    env = {"SOAK_MARK": marker}
    kit = {"command": sys.executable, "env": env}
    upstreams = {
        "steady": {**kit, "args": [TESTKIT]},
        "flaky": {
            **kit,
            "args": [TESTKIT, "--spawn-grandchild", "--grandchild-setsid", "--pid-file", str(directory / "gc.pid")],
        },
        "storm": {**kit, "args": [TESTKIT, "--list-changed-storm"]},
        "web": {"url": f"http://127.0.0.1:{web_port}/mcp"},
    }
    defaults = {"timeouts": {"connect": 10, "call": CALL_TIMEOUT}, "max_message_bytes": CAP}
    path = directory / "soak.yaml"
    path.write_text(json.dumps({"defaults": defaults, "upstreams": upstreams}))
    return path


def pick_call(rng: random.Random) -> tuple[str, str, dict[str, Any]]:
    """One random call: (server, tool, arguments)."""
    server = rng.choice(["steady", "flaky", "storm", "web"])
    kind = rng.choices(
        ["echo", "sleep", "hang", "crash", "big", "flood", "invalid", "error"],
        weights=[40, 10, 4, 3, 6, 6, 6, 5],
    )[0]
    if kind == "crash" and server in ("flaky", "steady"):
        return server, "crash", {}
    if kind == "sleep":
        return server, "slow", {"seconds": rng.uniform(0, 0.5), "steps": 2}
    if kind == "hang":
        return server, "slow", {"seconds": CALL_TIMEOUT * 3, "steps": 0}
    if kind == "big":
        return server, "big", {"n": rng.randrange(CAP // 4, CAP * 2)}
    if kind == "flood":
        return server, "slow", {"seconds": 0, "steps": rng.randrange(100, 1000)}
    if kind == "invalid":
        answer = rng.choice([{"result": 5}, {"nest": 300}, {"result": {}}, {"line": '{"id": ID, "result": {'}])
        return server, "reply", answer
    if kind == "error":
        return server, "reply", {"error": {"code": -32000, "message": "try again later"}}
    return server, "echo", {"message": f"hello {rng.random()}"}


def outcome(result: Any) -> str:
    if not result.is_error:
        return "ok"
    payload = result.structured_content or {}
    error = payload.get("error") if isinstance(payload, dict) else None
    return f"fault:{error.get('reason')}" if isinstance(error, dict) else "tool_error"


async def worker(session: ClientSession, rng: random.Random, until: float, tally: collections.Counter[str]) -> None:
    while time.monotonic() < until:
        server, tool, arguments = pick_call(rng)
        tally["calls"] += 1
        try:
            with anyio.fail_after(ANSWER_LIMIT):
                result = await session.call_tool(
                    "catalog_call_tool", {"server": server, "tool": tool, "arguments": arguments}
                )
        except TimeoutError:
            tally["unanswered"] += 1
            continue
        except Exception as exc:
            tally[f"client_error:{type(exc).__name__}"] += 1
            continue
        tally["answered"] += 1
        tally[outcome(result)] += 1
        await anyio.sleep(rng.uniform(0, 0.02))


def proc_figures(pid: int) -> tuple[float, int, str]:
    """(RSS in MB, open fds, fds by kind) of a process."""
    rss_kb = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
    kinds: collections.Counter[str] = collections.Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        kinds[target.split(":")[0] if ":" in target else "file"] += 1
    return rss_kb / 1024, sum(kinds.values()), " ".join(f"{k}={v}" for k, v in sorted(kinds.items()))


def find_pid(predicate: Callable[[list[str]], bool]) -> int:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if predicate(argv):
                return int(entry)
    raise LookupError("process not found")


def marked(marker: str) -> list[int]:
    """Live processes whose environment carries the marker (zombies excluded)."""
    found = []
    needle = f"SOAK_MARK={marker}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if needle not in Path(f"/proc/{entry}/environ").read_bytes():
                continue
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(entry))
    return found


@asynccontextmanager
async def stdio_session(config: Path) -> AsyncIterator[tuple[ClientSession, int]]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "aggregator", "serve", "--config", str(config), "--log-level", "error"],
        env={k: v for k, v in os.environ.items() if not k.startswith("AGGREGATOR_")},
    )
    with open(os.devnull, "w") as devnull:
        async with stdio_client(params, errlog=devnull) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            pid = find_pid(lambda argv: str(config) in argv and "serve" in argv and "--transport" not in argv)
            yield session, pid


@asynccontextmanager
async def http_session(config: Path) -> AsyncIterator[tuple[ClientSession, int]]:
    port = free_port()
    argv = ["serve", "--config", str(config), "--transport", "http", "--port", str(port), "--log-level", "error"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "aggregator", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if not k.startswith("AGGREGATOR_")},
    )
    try:
        wait_for_port(port)
        async with (
            streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


async def soak(seconds: float, seed: int, workers: int) -> dict[str, Any]:
    marker = secrets.token_hex(8)
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        web_port = free_port()
        web = subprocess.Popen(
            [sys.executable, TESTKIT, "--http", str(web_port)], stderr=subprocess.DEVNULL, env=os.environ.copy()
        )
        try:
            wait_for_port(web_port)
            config = write_config(Path(tmp), web_port, marker)
            tally: collections.Counter[str] = collections.Counter()
            async with stdio_session(config) as (stdio, stdio_pid), http_session(config) as (http, http_pid):
                pids = {"stdio": stdio_pid, "http": http_pid}
                warm = min(10.0, seconds / 10)
                start = time.monotonic()
                async with anyio.create_task_group() as tg:
                    for i, session in enumerate([stdio, http] * workers):
                        tg.start_soon(worker, session, random.Random(seed * 1000 + i), start + seconds, tally)
                    await anyio.sleep(warm)
                    report["start"] = {name: proc_figures(pid) for name, pid in pids.items()}
                    report["samples"] = {name: [] for name in pids}
                    while time.monotonic() < start + seconds - 1:  # ten samples: growth or a plateau?
                        await anyio.sleep((seconds - warm) / 10)
                        for name, pid in pids.items():
                            rss, fds, _kinds = proc_figures(pid)
                            report["samples"][name].append(f"{rss:.0f}/{fds}")
                report["end"] = {name: proc_figures(pid) for name, pid in pids.items()}
                report["elapsed"] = time.monotonic() - start
            deadline = time.monotonic() + 10
            while (left := marked(marker)) and time.monotonic() < deadline:
                await anyio.sleep(0.2)
            report["orphans"] = left
            report["tally"] = tally
        finally:
            web.kill()
            web.wait()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=4, help="concurrent callers per aggregator")
    args = parser.parse_args()
    report = anyio.run(soak, args.seconds, args.seed, args.workers)
    tally = report["tally"]
    print(f"soak: {report['elapsed']:.0f}s, seed {args.seed}, {args.workers} workers per aggregator")
    print(f"calls made {tally['calls']}, answered {tally['answered']}, unanswered {tally['unanswered']}")
    for key in sorted(k for k in tally if k not in ("calls", "answered", "unanswered")):
        print(f"  {key:32} {tally[key]}")
    for name in ("stdio", "http"):
        (rss0, fd0, kinds0), (rss1, fd1, kinds1) = report["start"][name], report["end"][name]
        print(f"{name:5} aggregator: RSS {rss0:.1f} -> {rss1:.1f} MB ({rss1 - rss0:+.1f}), fds {fd0} -> {fd1}")
        print(f"      fds by kind: {kinds0} -> {kinds1}")
        print(f"      RSS MB/fds over time: {' '.join(report['samples'][name])}")
    print(f"orphans after shutdown: {len(report['orphans'])} {report['orphans'] or ''}")


if __name__ == "__main__":
    main()
