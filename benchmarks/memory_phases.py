"""Where the memory of `aggregator serve` goes (issue 24): RSS per import phase, and per process.

    .venv/bin/python benchmarks/memory_phases.py [--calls 200] [--guards c,python]

1. Import phases, in a fresh interpreter, in the order `serve` imports them and with the deferrals
   the CLI applies for `serve` (`aggregator.sdk`, `aggregator.sdk.deferred`): VmRSS after each
   phase and what the phase added. The last rows are what a stdio `serve` still imports without
   using it (measured as what importing it adds on top of everything else).
2. A real stdio `serve` with one running upstream (`examples/testkit.py`), after `--calls` proxied
   calls, once per guard of `--guards` (``AGGREGATOR_GUARD``; the C guard is built first, into the
   user's cache, when a compiler is there): RSS, PSS and private (USS) memory of the aggregator and
   of its guard, with the guard's kind, beside a bare interpreter started the way the Python guard
   is (`python -I -S`) in the same run.

Linux only (/proc). One run; read the phases against each other, not as absolute figures.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from limits_bench import ECHO, tree, write_config
from passthrough_bench import process_of
from proxy_bench import aggregator_params, session_for, timed_calls

from aggregator.upstream import guard_build

ROOT = Path(__file__).resolve().parent.parent

# (label, code): each runs after the ones before it, in serve's order of first import.
PHASES = [
    (
        "first deferrals (metadata, pickle), pydantic's package",
        "from aggregator.sdk import deferred; deferred.defer_package_metadata(); deferred.defer_pickle()",
    ),
    ("asyncio (with ssl and OpenSSL)", "import asyncio"),
    ("pydantic", "import pydantic; from pydantic import BaseModel, TypeAdapter"),
    (
        "mcp_types public models (built), pydantic's model machinery",
        "from aggregator import sdk; from aggregator.sdk import deferred\n"
        "sdk.defer_wire_model_builds(); deferred.defer_mcpserver(); deferred.defer_http_clients()\n"
        "deferred.defer_http_server(); deferred.defer_tracing()\n"
        "import mcp_types",
    ),
    ("mcp_types both eras' wire models (deferred)", "import mcp_types.methods"),
    ("anyio and its asyncio backend", "import anyio, anyio._backends._asyncio"),
    ("the rest of `import mcp` (its server and client sessions)", "import mcp, mcp.client.stdio, mcp.server.stdio"),
    ("structlog and our logging", "import aggregator.log"),
    ("our config and settings (yaml, platformdirs, models)", "import aggregator.config, aggregator.settings"),
    ("our CLI (the parser and `serve`'s module)", "import aggregator.cli.commands, aggregator.cli.serve"),
    (
        "our server, pool, stdio side",
        "import aggregator.proxy.server, aggregator.upstream.pool, aggregator.downstream.stdio",
    ),
    ("uvloop", "import uvloop"),
]
DEFERRED = [  # kept out of a stdio serve: what they would add
    ("importlib.metadata (pydantic's plugin scan, a plugin installed)", "import importlib.metadata as m; m.version"),
    ("pickle (structlog's PicklingError; anything pickling)", "import pickle; pickle.dumps"),
    (
        "the CLI's other subcommands, python-dotenv, difflib",
        "import aggregator.cli.auth, aggregator.cli.calls, aggregator.cli.clients, aggregator.cli.doctor,"
        " aggregator.cli.editing, aggregator.cli.service, aggregator.cli.upstreams, dotenv.parser, difflib",
    ),
    ("OpenTelemetry's API (a span made: an OTEL endpoint set)", "import mcp.shared._otel as o; o.otel_span.__name__"),
    ("the SDK's OAuth models (the first OAuth upstream)", "import mcp.shared.auth"),
    (
        "httpx2 and the SDK's HTTP clients",
        "import mcp.client.client as c, mcp.client.auth; c.streamable_http_client.__name__",
    ),
    (
        "starlette and the SDK's HTTP app (--transport http)",
        "from mcp.server.lowlevel.server import Server; Server('x').streamable_http_app()",
    ),
    ("the SDK's MCPServer with cryptography", "import mcp.server as s; s.MCPServer.__name__"),
]

PROBE = """
import gc, sys
gc.disable()
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
print(f"start\\t{rss():.1f}")
for label, code in PHASES:
    exec(code, {})
    print(f"{label}\\t{rss():.1f}")
"""


def phases(rows: list[tuple[str, str]]) -> list[tuple[str, float]]:
    """RSS after each phase, in a fresh interpreter (the way `serve` starts: `python -m`, with site)."""
    script = f"PHASES = {rows!r}\n{PROBE}"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True, timeout=120
    )
    return [(label, float(mb)) for label, mb in (line.split("\t") for line in done.stdout.splitlines())]


def rollup(pid: int) -> dict[str, float]:
    """RSS, PSS and private memory of one process, MB (/proc/PID/smaps_rollup)."""
    fields: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        fields[key] = int(value.split()[0]) / 1024
    return {"rss": fields["Rss"], "pss": fields["Pss"], "uss": fields["Private_Clean"] + fields["Private_Dirty"]}


def bare_interpreter() -> dict[str, float]:
    """A `python -I -S` that has started and waits, as the guard is started."""
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        time.sleep(0.3)  # started and waiting
        return rollup(proc.pid)
    finally:
        assert proc.stdin
        proc.stdin.close()
        proc.wait(timeout=10)


async def serving(calls: int, guard: str) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        config = write_config(Path(tmp), 1)
        params = aggregator_params(config)
        params.env = {**os.environ, "AGGREGATOR_GUARD": guard}
        async with session_for(params) as agg:
            await timed_calls(agg, "catalog_call_tool", ECHO, calls)
            pid = process_of(config)
            assert pid is not None
            found = {f"aggregator (AGGREGATOR_GUARD={guard})": rollup(pid)}
            for member in tree(pid):
                if _ppid(member) == pid:  # the guard: the aggregator's only child
                    found[f"guard ({guard_build.kind_of(member)})"] = rollup(member)
            return found


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def row(name: str, figures: dict[str, float]) -> None:
    print(f"  {name:36} rss {figures['rss']:6.1f}   pss {figures['pss']:6.1f}   private {figures['uss']:6.1f}")


def main() -> None:
    if not os.path.isdir("/proc"):
        sys.exit("memory_phases needs Linux (/proc)")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="proxied calls before the per-process figures")
    parser.add_argument("--guards", default="c,python", help="the guards to measure section 2 with (c, python)")
    args = parser.parse_args()
    guards = [kind.strip() for kind in args.guards.split(",") if kind.strip()]
    if "c" in guards and guard_build.build() is None:
        print("(the C guard could not be built here: measuring the Python guard only)")
        guards = [kind for kind in guards if kind != "c"] or ["python"]

    print("1. RSS after each import phase, in serve's order (MB; fresh interpreter)")
    measured = phases(PHASES + DEFERRED)
    previous = measured[0][1]
    for index, (label, mb) in enumerate(measured):
        if index == len(PHASES) + 1:
            print("  -- kept out of a stdio serve (deferred until used), what each would add:")
        print(f"  {label:60} {mb:7.1f}  {mb - previous:+6.1f}")
        previous = mb

    print(f"\n2. A stdio serve, 1 running upstream, after {args.calls} calls (MB)")
    for guard in guards:
        found = anyio.run(serving, args.calls, guard)
        for name, figures in found.items():
            row(name, figures)
        own = sum(figures["rss"] for figures in found.values())
        print(f"  own memory (aggregator + guard, RSS, as peer_bench counts it): {own:.1f}\n")
    row("bare `python -I -S` (same run)", bare_interpreter())


if __name__ == "__main__":
    main()
