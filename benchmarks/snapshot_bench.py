"""Time to the first useful tool search, with and without catalog snapshots, in one run.

    .venv/bin/python benchmarks/snapshot_bench.py [--upstreams 20] [--queries 6] [--rounds 2]
                                                  [--startup-delay 0] [--json]

Twenty upstreams are the 20 largest servers of the LiveMCPBench tool-retrieval
set (`../shared/data/toolsearch/livemcpbench.json`, real MCP servers' tool
lists), each served by `examples/testkit.py --catalog` (standard library only,
so spawning one costs tens of milliseconds; `--startup-delay` adds what a
launcher such as npx or uvx costs). Queries are the set's real tasks whose gold
tool ranks in the top 3 once every catalog is loaded.

For each query, a fresh `aggregator serve` is spawned and spoken to over stdio:

- without snapshots (empty data dir): `catalog_search_tools(load: false)`
  answers with server-level guesses; the client then has to ask with
  `load: true`, which spawns every upstream. Time to the first useful answer
  (top 3 holds a gold tool) and the upstream processes spawned by then;
- warm in memory (the baseline): a fresh aggregator whose upstreams were all
  started and listed (by a `load: true` search for something else) answers
  the query for the first time; the same query repeated in the cold process
  (its per-term caches hot) is printed beside it;
- with snapshots (data dir filled by `aggregator refresh` beforehand):
  `catalog_search_tools(load: false)` once, in a fresh aggregator.

Wall time on a shared machine is noisy, so the same first search is also
measured in-process (the server and an SDK client over memory streams) as CPU
time, which load on the machine does not inflate: a fresh aggregator seeded
from snapshots against one whose catalogs were all listed live.

Last, the cost of writing snapshots on the load path: the same 20 upstreams
started and listed in-process by `UpstreamPool.start_all`, with a data dir
(each listing then written to disk in a worker thread) and without,
interleaved; and the time of one snapshot write itself.

With `--official`, the upstreams are the official MCP servers that
`.ci/install-servers` puts under `.ci/servers/` (server-everything through npx,
filesystem, memory, time, git), each configured `--upstreams / 5` times under
numbered names, with five hand-written queries whose right tool is known;
upstreams started are then counted from `catalog_list_servers` (states ready
or starting) instead of testkit's spawn logs.

Every query runs `--rounds` times in each mode, interleaved so that the noise
of a shared machine hits all modes alike; figures are medians with the
interquartile range. Also printed: the aggregator's start-up (spawn to `initialize` answered), which
with snapshots includes reading and indexing them. Target: with snapshots,
within 10 % of the warm search, and 0 upstreams spawned.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from aggregator.catalog.model import Catalog, catalog_of_wire_tools
from aggregator.catalog.search import ToolSearchIndex
from aggregator.catalog.snapshot import SnapshotDir
from aggregator.catalog.store import CatalogStore
from aggregator.config import AggregatorConfig, load_config
from aggregator.upstream.pool import UpstreamPool

ROOT = Path(__file__).resolve().parent.parent
OFFICIAL = ROOT / ".ci" / "servers"
OFFICIAL_QUERIES = [  # (query, kind of server, right tool)
    ("convert a time between time zones", "time", "convert_time"),
    ("sum of two numbers", "everything", "get-sum"),
    ("what time is it in Tokyo", "time", "get_current_time"),
    ("read the contents of a text file", "filesystem", "read_text_file"),
    ("create entities in the knowledge graph", "memory", "create_entities"),
]
DATASET = ROOT.parent / "shared" / "data" / "toolsearch" / "livemcpbench.json"
TESTKIT = str(ROOT / "examples" / "testkit.py")
TOP = 3
WARM_UP_QUERY = "read a file"


def pick_servers(dataset: dict[str, Any], count: int) -> list[dict[str, Any]]:
    servers = sorted(dataset["servers"], key=lambda s: (-len(s["tools"]), s["id"]))
    return sorted(servers[:count], key=lambda s: s["id"])


def clean_catalog(server: dict[str, Any]) -> Catalog:
    return catalog_of_wire_tools(server["id"], server["tools"])


def useful(results: list[dict[str, Any]], gold: set[tuple[str, str]]) -> bool:
    return any((item.get("server"), item.get("tool")) in gold for item in results[:TOP])


def pick_queries(dataset: dict[str, Any], servers: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """Real tasks whose gold tool the warm index puts in the top 3 (in-process, no aggregator)."""
    store = CatalogStore()
    index = ToolSearchIndex()
    for server in servers:
        index.set_server_metadata(server["id"], server.get("description"), [])
    index.attach(store)
    for server in servers:
        store.put(clean_catalog(server))
    names = {s["id"] for s in servers}
    chosen = []
    for query in dataset["queries"]:
        gold = {(g["tool"], s) for g in query["gold"] for s in g["servers"] if s in names}
        if not gold:
            continue
        hits = [{"server": h.server, "tool": h.tool} for h in index.search(query["query"], 8)]
        gold_pairs = {(s, t) for t, s in gold}
        if useful(hits, gold_pairs):
            chosen.append({"query": query["query"], "gold": sorted(gold_pairs)})
        if len(chosen) == count:
            break
    return chosen


def write_setup(directory: Path, servers: list[dict[str, Any]], delay: float) -> tuple[Path, list[Path]]:
    upstreams: dict[str, Any] = {}
    logs = []
    for server in servers:
        catalog = directory / f"{server['id']}.tools.json"
        catalog.write_text(json.dumps({"tools": server["tools"]}))
        log = directory / f"{server['id']}.spawns"
        logs.append(log)
        args = [TESTKIT, "--catalog", str(catalog), "--spawn-log", str(log), "--startup-delay", str(delay)]
        upstreams[server["id"]] = {
            "command": sys.executable,
            "args": args,
            "description": (server.get("description") or "")[:300],
        }
    config = directory / "aggregator.yaml"
    config.write_text(json.dumps({"upstreams": upstreams}, indent=1))
    return config, logs


def official_setup(directory: Path, count: int) -> tuple[Path, list[dict[str, Any]]]:
    """A config of the official servers, each kind `count / 5` times, and queries with their gold tools."""
    node = OFFICIAL / "node"
    packages = node / "node_modules" / "@modelcontextprotocol"
    py_bin = OFFICIAL / "py" / "bin"
    if not (packages.is_dir() and (OFFICIAL / "py" / ".installed").is_file()):
        raise SystemExit(f"official servers not installed under {OFFICIAL}: run .ci/install-servers")
    repo = directory / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "README").write_text("bench\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first"], check=True)
    kinds: dict[str, dict[str, Any]] = {
        "everything": {"command": "npx", "args": ["--no", "mcp-server-everything", "stdio"], "cwd": str(node)},
        "filesystem": {"command": "node", "args": [str(packages / "server-filesystem/dist/index.js"), str(repo)]},
        "memory": {
            "command": "node",
            "args": [str(packages / "server-memory/dist/index.js")],
            "env": {"MEMORY_FILE_PATH": str(directory / "memory.jsonl")},
        },
        "time": {"command": str(py_bin / "mcp-server-time"), "args": ["--local-timezone", "UTC"]},
        "git": {"command": str(py_bin / "mcp-server-git"), "args": ["--repository", str(repo)]},
    }
    copies = max(1, count // len(kinds))
    upstreams = {
        f"{kind}-{i}": {**entry, "timeouts": {"connect": 120}}
        for kind, entry in kinds.items()
        for i in range(1, copies + 1)
    }
    config = directory / "aggregator.yaml"
    config.write_text(json.dumps({"upstreams": upstreams}, indent=1))
    queries = [
        {"query": query, "gold": [[f"{kind}-{i}", tool] for i in range(1, copies + 1)]}
        for query, kind, tool in OFFICIAL_QUERIES
    ]
    return config, queries


def spawned(logs: list[Path]) -> int:
    return sum(len(log.read_text().splitlines()) for log in logs if log.exists())


class Aggregator:
    """`aggregator serve` over stdio, spoken to in raw JSON-RPC lines."""

    def __init__(self, config: Path, data_dir: Path) -> None:
        started = time.perf_counter()
        command = [sys.executable, "-m", "aggregator", "serve", "--config", str(config), "--data-dir", str(data_dir)]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.next_id = 0
        init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}
        self.request("initialize", init)
        self.startup = time.perf_counter() - started
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.request("tools/list", {})  # as every client does before its first call

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdout
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the aggregator closed its stdout")
            message = json.loads(line)
            if message.get("id") == self.next_id:
                return dict(message["result"])

    def started(self) -> int:
        """Upstreams this aggregator has started (ready or starting), from catalog_list_servers."""
        result = self.request("tools/call", {"name": "catalog_list_servers", "arguments": {}})
        return sum(s["state"] in ("ready", "starting") for s in result["structuredContent"]["servers"])

    def search(self, query: str, load: bool) -> tuple[float, list[dict[str, Any]]]:
        started = time.perf_counter()
        arguments = {"query": query, "limit": 8, "load": load}
        result = self.request("tools/call", {"name": "catalog_search_tools", "arguments": arguments})
        return time.perf_counter() - started, list(result["structuredContent"]["results"])

    def close(self) -> None:
        assert self.proc.stdin
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run_cold(config: Path, work: Path, logs: list[Path], query: dict[str, Any]) -> dict[str, Any]:
    """No snapshots: load: false first (as a client would), then load: true; then the warm repeat."""
    gold = {tuple(pair) for pair in query["gold"]}
    before = spawned(logs)
    agg = Aggregator(config, Path(tempfile.mkdtemp(dir=work, prefix="cold-")))
    try:
        first, results = agg.search(query["query"], load=False)
        total, answered_by = first, "load: false"
        if not useful(results, gold):
            second, results = agg.search(query["query"], load=True)
            total, answered_by = first + second, "load: true"
        spawn_count = spawned(logs) - before if logs else agg.started()
        repeat = statistics.median(agg.search(query["query"], load=False)[0] for _ in range(5))
        return {
            "startup": agg.startup,
            "first_useful": total if useful(results, gold) else None,
            "answered_by": answered_by,
            "spawned": spawn_count,
            "repeat": repeat,
        }
    finally:
        agg.close()


def run_warm(config: Path, work: Path, query: dict[str, Any]) -> float | None:
    """Every catalog live in memory (loaded by another query), then this query for the first time."""
    gold = {tuple(pair) for pair in query["gold"]}
    agg = Aggregator(config, Path(tempfile.mkdtemp(dir=work, prefix="warm-")))
    try:
        agg.search(WARM_UP_QUERY, load=True)
        elapsed, results = agg.search(query["query"], load=False)
        return elapsed if useful(results, gold) else None
    finally:
        agg.close()


def run_snapshot(config: Path, data_dir: Path, logs: list[Path], query: dict[str, Any]) -> dict[str, Any]:
    gold = {tuple(pair) for pair in query["gold"]}
    before = spawned(logs)
    agg = Aggregator(config, data_dir)
    try:
        elapsed, results = agg.search(query["query"], load=False)
        return {
            "startup": agg.startup,
            "first_useful": elapsed if useful(results, gold) else None,
            "spawned": spawned(logs) - before if logs else agg.started(),
        }
    finally:
        agg.close()


async def _first_search_cpu(config: AggregatorConfig, data_dir: Path | None, query: str) -> float:
    """CPU seconds of the first `catalog_search_tools` of a fresh in-process server (after tools/list)."""
    from mcp import ClientSession
    from mcp.shared.memory import create_client_server_memory_streams

    from aggregator.proxy.server import AggregatorServer

    async with UpstreamPool.running(config, data_dir) as pool:
        server = AggregatorServer(pool, data_dir=Path(tempfile.mkdtemp()), max_result_bytes=config.max_result_bytes)
        lowlevel = server.lowlevel
        async with (
            server.running(),
            create_client_server_memory_streams() as ((client_read, client_write), (read, write)),
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(lambda: lowlevel.run(read, write, lowlevel.create_initialization_options()))
            async with ClientSession(client_read, client_write) as session:
                await session.initialize()
                await session.list_tools()
                if data_dir is None:  # warm: every catalog listed live first, by another search
                    await session.call_tool("catalog_search_tools", {"query": WARM_UP_QUERY, "load": True})
                started = time.process_time()
                await session.call_tool("catalog_search_tools", {"query": query})
                elapsed = time.process_time() - started
            tg.cancel_scope.cancel()
    return elapsed


def first_search_cpu(config_path: Path, data_dir: Path, queries: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    config = load_config(config_path)
    snap, warm = [], []
    for query in [q for _ in range(rounds) for q in queries]:
        snap.append(anyio.run(_first_search_cpu, config, data_dir, query["query"]))
        warm.append(anyio.run(_first_search_cpu, config, None, query["query"]))
    return {"snapshot": median(list(snap)), "warm": median(list(warm))}


def load_cost(config_path: Path, work: Path, rounds: int) -> dict[str, Any]:
    """Start and list every upstream in-process, writing snapshots or not; and one write's own time."""
    config = load_config(config_path)
    times: dict[str, list[float]] = {"with": [], "without": []}

    async def start_all(data_dir: Path | None) -> float:
        async with UpstreamPool.running(config, data_dir) as pool:
            started = time.perf_counter()
            outcome = await pool.start_all()
            elapsed = time.perf_counter() - started
            assert not any(outcome.values()), outcome
            await pool.flush_snapshots()
            catalogs = [pool.store.live(name) for name in pool.upstream_names()]
        writer = SnapshotDir(work / "write-only")
        write_started = time.perf_counter()
        for catalog in catalogs:
            assert catalog is not None
            writer.write(catalog, "sha256:bench")
        times.setdefault("write", []).append((time.perf_counter() - write_started) / len(catalogs))
        return elapsed

    for _ in range(rounds * 2):
        times["with"].append(anyio.run(start_all, Path(tempfile.mkdtemp(dir=work, prefix="load-"))))
        times["without"].append(anyio.run(start_all, None))
    return {key: median(list(values)) for key, values in times.items()}


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def quartiles(values: list[float | None]) -> tuple[float, float] | None:
    present = [v for v in values if v is not None]
    if len(present) < 2:
        return None
    q = statistics.quantiles(present, n=4)
    return q[0], q[2]


def ms(value: float | None, spread: tuple[float, float] | None = None) -> str:
    if value is None:
        return "-"
    text = f"{value * 1000:.1f} ms"
    return text + (f" ({spread[0] * 1000:.1f}-{spread[1] * 1000:.1f})" if spread else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstreams", type=int, default=20)
    parser.add_argument("--queries", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2, help="repetitions of every query in every mode")
    parser.add_argument("--startup-delay", type=float, default=0.0, help="seconds each upstream sleeps at start")
    parser.add_argument("--official", action="store_true", help="the official MCP servers under .ci/servers")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="snapshot-bench-") as tmp:
        work = Path(tmp)
        logs: list[Path] = []
        if args.official:
            config, queries = official_setup(work, args.upstreams)
        else:
            if not DATASET.exists():
                print(f"dataset not found: {DATASET} (needs ../shared/data)", file=sys.stderr)
                return 2
            dataset = json.loads(DATASET.read_text(encoding="utf-8"))
            servers = pick_servers(dataset, args.upstreams)
            queries = pick_queries(dataset, servers, args.queries)
            config, logs = write_setup(work, servers, args.startup_delay)
        data_dir = work / "snapshots"
        refresh = [sys.executable, "-m", "aggregator", "refresh", "--config", str(config), "--data-dir", str(data_dir)]
        subprocess.run(refresh, check=True, capture_output=True, timeout=600)
        snapshot_files = sorted((data_dir / "catalogs").glob("*.json"))
        upstream_count = len(snapshot_files)
        tools = sum(len(json.loads(path.read_text())["tools"]) for path in snapshot_files)
        cold, warm_first, snap = [], [], []
        for query in [q for _ in range(args.rounds) for q in queries]:  # interleaved: noise hits all alike
            cold.append(run_cold(config, work, logs, query))
            warm_first.append(run_warm(config, work, query))
            snap.append(run_snapshot(config, data_dir, logs, query))
        cpu = first_search_cpu(config, data_dir, queries, args.rounds)
        loads = load_cost(config, work, args.rounds)
    summary = {
        "official_servers": args.official,
        "upstreams": upstream_count,
        "tools": tools,
        "queries": len(queries),
        "rounds": args.rounds,
        "startup_delay_s": args.startup_delay,
        "without_snapshots": {
            "startup_s": median([r["startup"] for r in cold]),
            "first_useful_s": median([r["first_useful"] for r in cold]),
            "first_useful_iqr_s": quartiles([r["first_useful"] for r in cold]),
            "useful_answers": sum(r["first_useful"] is not None for r in cold),
            "answered_by": sorted({r["answered_by"] for r in cold}),
            "spawned": [r["spawned"] for r in cold],
        },
        "warm_in_memory": {
            "first_search_s": median(warm_first),
            "first_search_iqr_s": quartiles(warm_first),
            "repeated_search_s": median([r["repeat"] for r in cold]),
        },
        "with_snapshots": {
            "startup_s": median([r["startup"] for r in snap]),
            "first_useful_s": median([r["first_useful"] for r in snap]),
            "first_useful_iqr_s": quartiles([r["first_useful"] for r in snap]),
            "useful_answers": sum(r["first_useful"] is not None for r in snap),
            "spawned": [r["spawned"] for r in snap],
        },
    }
    warm = summary["warm_in_memory"]["first_search_s"]
    repeated = summary["warm_in_memory"]["repeated_search_s"]
    with_snap = summary["with_snapshots"]["first_useful_s"]
    summary["snapshot_vs_warm"] = (with_snap / warm) if with_snap and warm else None
    summary["first_search_cpu_s"] = cpu
    summary["load_all_s"] = {"with_snapshot_writes": loads["with"], "without": loads["without"]}
    summary["one_snapshot_write_s"] = loads["write"]
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    w, s = summary["without_snapshots"], summary["with_snapshots"]
    print(
        f"{upstream_count} {'official ' if args.official else ''}upstreams, {tools} tools, "
        f"{len(queries)} queries x {args.rounds} rounds "
        f"(medians, interquartile range in brackets; upstream start-up delay {args.startup_delay:g} s)"
    )
    rows = [
        ("", "without snapshots", "with snapshots", "warm in memory"),
        ("aggregator start-up", ms(w["startup_s"]), ms(s["startup_s"]), ""),
        (
            "first useful search",
            ms(w["first_useful_s"], w["first_useful_iqr_s"]),
            ms(s["first_useful_s"], s["first_useful_iqr_s"]),
            ms(warm, summary["warm_in_memory"]["first_search_iqr_s"]),
        ),
        ("  same query repeated", "", "", ms(repeated)),
        ("useful answers", str(w["useful_answers"]), str(s["useful_answers"]), ""),
        ("upstreams spawned (max)", str(max(w["spawned"])), str(max(s["spawned"])), ""),
    ]
    for row in rows:
        print(f"{row[0]:26}{row[1]:>30}{row[2]:>24}{row[3]:>24}")
    print(f"without snapshots the useful answer needed: {', '.join(w['answered_by'])}")
    print(
        f"first search, in-process CPU time: {ms(cpu['snapshot'])} from snapshots, {ms(cpu['warm'])} warm "
        f"(ratio {cpu['snapshot'] / cpu['warm']:.2f})"
    )
    print(
        f"starting and listing all {upstream_count} upstreams in-process: {ms(loads['with'])} writing snapshots, "
        f"{ms(loads['without'])} without; one snapshot write (in a worker thread) {ms(loads['write'])}"
    )
    ratio = summary["snapshot_vs_warm"]
    if ratio is not None:
        print(f"with snapshots / warm: {ratio:.2f} (target <= 1.10), spawned: {sum(s['spawned'])} (target 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
