"""Catalog snapshots on disk (DESIGN §3): format, validation, atomic writes, and real restarts.

The end-to-end tests restart a real `aggregator serve` over stdio and count the
upstream processes it spawned through testkit's `--spawn-log` (one line per start).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import ClientSession

from aggregator.catalog.model import Catalog, clean_prompt, clean_resource, clean_resource_template, clean_tool
from aggregator.catalog.snapshot import FORMAT, VERSION, SnapshotDir, SnapshotError, decode, encode, fingerprint
from aggregator.catalog.store import CatalogStore
from aggregator.config import AggregatorConfig, ConfigError, parse_config
from aggregator.files import write_atomically
from aggregator.upstream.pool import UpstreamPool
from tests.conftest import aggregator_client, aggregator_env, kit_upstream, structured, write_config

DAY = 86400.0


def config_of(upstreams: dict[str, Any], **top: Any) -> AggregatorConfig:
    return parse_config(json.dumps({"upstreams": upstreams, **top}), "test.yaml")


def spawns(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def wait_for(predicate: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def warnings(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(1 for record in caplog.records if record.levelname == "WARNING" and text in record.getMessage())


def sample_catalog(server: str = "kit", listed_at: float | None = None) -> Catalog:
    tools = (
        clean_tool(server, {"name": "echo", "description": "Echo it.", "inputSchema": {"type": "object"}}),
        clean_tool(server, {"name": "zap", "inputSchema": {"properties": {"x": {"type": "string"}}}}),
    )
    return Catalog(
        server,
        tools=tools,
        prompts=(clean_prompt(server, {"name": "greet", "arguments": [{"name": "who", "required": True}]}),),
        resources=(clean_resource(server, {"name": "readme", "uri": "file:///readme", "mimeType": "text/plain"}),),
        resource_templates=(clean_resource_template(server, {"name": "row", "uriTemplate": "db://{table}/{id}"}),),
        loaded_at=listed_at if listed_at is not None else time.time(),
        server_info={"name": "kit-server", "version": "1.2.3"},
        instructions="Use echo to echo.",
    )


def snapshot_file(directory: Path, name: str) -> Path:
    """The snapshot file of upstream `name` in `directory` (its name carries the definition's fingerprint)."""
    found = sorted(directory.glob(f"{name}.*.json"))
    return found[0] if found else directory / f"{name}.unwritten.json"


def test_two_definitions_of_one_name_keep_a_snapshot_each(tmp_path: Path) -> None:
    """Two configs that give the name `kit` to different servers no longer overwrite each other's snapshot."""
    snapshots = SnapshotDir(tmp_path)
    first = fingerprint(config_of({"kit": {"command": "one"}}).upstreams["kit"])
    second = fingerprint(config_of({"kit": {"command": "two"}}).upstreams["kit"])
    (tmp_path / "catalogs").mkdir()
    (tmp_path / "catalogs" / "kit.json").write_text("{}")  # an unkeyed file of an older version
    snapshots.write(sample_catalog(), first)
    snapshots.write(sample_catalog(), second)
    assert snapshots.read("kit", first, DAY, lambda _: False).catalog is not None
    assert snapshots.read("kit", second, DAY, lambda _: False).catalog is not None
    assert sorted(p.name for p in (tmp_path / "catalogs").iterdir()) == sorted(
        [snapshots.path("kit", first).name, snapshots.path("kit", second).name]
    )
    third = fingerprint(config_of({"kit": {"command": "three"}}).upstreams["kit"])
    assert snapshots.read("kit", third, DAY, lambda _: False).stale == "definition changed"
    old = time.time() - 31 * DAY
    os.utime(snapshots.path("kit", first), (old, old))  # unused for longer than DEFAULT_MAX_AGE
    snapshots.write(sample_catalog(), second)
    assert not snapshots.path("kit", first).exists() and snapshots.path("kit", second).exists()


# ---------------------------------------------------------------- format


def test_encode_decode_round_trip_keeps_everything_and_reapplies_the_filter() -> None:
    catalog = sample_catalog()
    document = json.loads(json.dumps(encode(catalog, "sha256:x")))
    back, digest = decode(document, "kit", hide=lambda name: name == "zap")
    assert digest == "sha256:x" and back.is_snapshot and back.loaded_at == catalog.loaded_at
    assert [t.wire for t in back.tools] == [t.wire for t in catalog.tools]
    assert [t.name for t in back.exposed_tools] == ["echo"] and back.tool("zap").hidden  # type: ignore[union-attr]
    assert (back.prompts, back.resources, back.resource_templates) == (
        catalog.prompts,
        catalog.resources,
        catalog.resource_templates,
    )
    assert (back.server_info, back.instructions) == (catalog.server_info, catalog.instructions)


def test_fingerprint_covers_the_definition_but_never_secret_values() -> None:
    def fp(**entry: Any) -> str:
        base = {"command": "npx", "args": ["-y", "srv"], "env": {"TOKEN": "s3cret"}}
        return fingerprint(config_of({"x": {**base, **entry}}).upstreams["x"])

    same = fp()
    assert fp(env={"TOKEN": "other-secret"}) == same  # values are not part of it
    assert fp(description="new words", tools={"deny": ["a*"]}, timeouts={"call": 5}) == same  # metadata is not
    assert fp(args=["-y", "srv", "--flag"]) != same
    assert fp(command="uvx") != same
    assert fp(env={"TOKEN": "s3cret", "EXTRA": "1"}) != same  # a new env var name is
    http = config_of({"h": {"url": "http://127.0.0.1:1/mcp", "headers": {"Authorization": "Bearer abc"}}})
    http2 = config_of({"h": {"url": "http://127.0.0.1:1/mcp", "headers": {"Authorization": "Bearer xyz"}}})
    assert fingerprint(http.upstreams["h"]) == fingerprint(http2.upstreams["h"])


def test_config_keys_snapshots_and_snapshot_max_age() -> None:
    config = config_of(
        {
            "a": {"command": "x", "snapshot_max_age": 3600},
            "b": {"command": "x", "snapshots": False},
            "c": {"command": "x", "snapshot_max_age": "2d"},
            "d": {"command": "x"},
        },
        defaults={"snapshot_max_age": "12h", "snapshots": True},
    )
    ups = config.upstreams
    assert [(u.snapshots, u.snapshot_max_age) for u in ups.values()] == [
        (True, 3600.0),
        (False, 43200.0),
        (True, 172800.0),
        (True, 43200.0),
    ]
    assert config_of({"d": {"command": "x"}}).upstreams["d"].snapshot_max_age == 30 * DAY
    weeks = config_of({"d": {"command": "x", "snapshot_max_age": "1.5w"}}).upstreams["d"]
    assert weeks.snapshot_max_age == 1.5 * 7 * DAY
    bad_values = [{"snapshot_max_age": -1}, {"snapshot_max_age": "soon"}, {"snapshot_max_age": True}]
    for bad in [*bad_values, {"snapshots": "maybe"}]:
        with pytest.raises(ConfigError) as caught:
            config_of({"d": {"command": "x", **bad}})
        assert next(iter(bad)) in str(caught.value) and "Fix:" in str(caught.value)


def test_written_file_holds_no_secret_value(tmp_path: Path) -> None:
    upstream = config_of({"kit": {"command": "srv", "env": {"API_KEY": "sk-very-secret"}}}).upstreams["kit"]
    path = SnapshotDir(tmp_path).write(sample_catalog(), fingerprint(upstream))
    assert path is not None and path == SnapshotDir(tmp_path).path("kit", fingerprint(upstream))
    text = path.read_text()
    assert "sk-very-secret" not in text and "API_KEY" not in text
    assert json.loads(text)["format"] == FORMAT and json.loads(text)["version"] == VERSION


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{not json",
        b'{"format": "aggregator-catalog-snapshot", "version": 1, "server": "kit"',  # truncated
        b"\xff\xfe\x00garbage",
        b"[]",
        b'{"format": "something-else"}',
        b'{"format": "aggregator-catalog-snapshot", "version": 99}',
        b"[" * 100_000,  # deep nesting
    ],
    ids=["empty", "bad-json", "truncated", "binary", "list", "foreign", "future-version", "deep"],
)
def test_bad_files_are_ignored_with_one_warning(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    snapshots = SnapshotDir(tmp_path)
    snapshots.directory.mkdir(parents=True)
    snapshots.path("kit", "sha256:x").write_bytes(content)
    outcome = snapshots.read("kit", "sha256:x", DAY, lambda _: False)
    assert outcome.catalog is None and outcome.problem
    assert warnings(caplog, "snapshot ignored") == 1


def test_semantically_bad_documents_are_ignored(tmp_path: Path) -> None:
    good = encode(sample_catalog(), "sha256:x")
    broken = [
        {**good, "server": "other"},
        {**good, "fingerprint": 3},
        {**good, "listed_at": "yesterday"},
        {**good, "tools": {"echo": {}}},
        {**good, "tools": [{"name": "t", "inputSchema": {"type": "string"}}]},
        {**good, "tools": [{"nameless": True}]},
        {**good, "server_info": "kit"},
        {**good, "instructions": ["no"]},
    ]
    snapshots = SnapshotDir(tmp_path)
    for document in broken:
        write_atomically(snapshots.path("kit", "sha256:x"), json.dumps(document).encode())
        outcome = snapshots.read("kit", "sha256:x", DAY, lambda _: False)
        assert outcome.catalog is None and outcome.problem, document


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
_KEYS = ["format", "version", "server", "fingerprint", "listed_at", "server_info", "instructions", "tools"]
_KEYS += ["prompts", "resources", "resource_templates"]


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(_KEYS), value=_JSON, entry=_JSON, garbage=_JSON)
def test_fuzzed_documents_decode_or_raise_snapshot_error(key: str, value: Any, entry: Any, garbage: Any) -> None:
    """Whatever a snapshot file holds, reading it gives a catalog or a SnapshotError, nothing else."""
    document = encode(sample_catalog(), "sha256:x")
    for candidate in (garbage, {**document, key: value}, {**document, "tools": [entry]}, {**document, key: [entry]}):
        try:
            catalog, _ = decode(candidate, "kit", hide=lambda name: name.startswith("z"))
        except SnapshotError:
            continue
        assert catalog.is_snapshot and all(tool.input_schema.get("type") == "object" for tool in catalog.tools)


def test_unreadable_changed_and_old_snapshots_are_not_used(tmp_path: Path) -> None:
    snapshots = SnapshotDir(tmp_path)
    assert snapshots.read("kit", "sha256:x", DAY, lambda _: False).catalog is None  # missing: no problem
    assert snapshots.read("kit", "sha256:x", DAY, lambda _: False).problem is None
    snapshots.path("kit", "sha256:x").mkdir(parents=True)  # a directory where the file should be
    assert snapshots.read("kit", "sha256:x", DAY, lambda _: False).problem
    snapshots.path("kit", "sha256:x").rmdir()
    snapshots.write(sample_catalog(listed_at=time.time() - 3 * DAY), "sha256:x")
    assert snapshots.read("kit", "sha256:x", 4 * DAY, lambda _: False).catalog is not None
    assert snapshots.read("kit", "sha256:x", 2 * DAY, lambda _: False).stale  # too old
    assert snapshots.read("kit", "sha256:y", 4 * DAY, lambda _: False).stale == "definition changed"


def test_unwritable_data_dir_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    not_a_dir = tmp_path / "data"
    not_a_dir.write_text("a file where the data dir should be")
    snapshots = SnapshotDir(not_a_dir)
    assert snapshots.write(sample_catalog("a"), "sha256:x") is None
    assert snapshots.write(sample_catalog("b"), "sha256:x") is None
    assert warnings(caplog, "cannot be written") == 1


_WRITER = """
import json, sys
from pathlib import Path
from aggregator.files import write_atomically
path, tag = Path(sys.argv[1]), sys.argv[2]
for i in range(300):
    write_atomically(path, json.dumps({"tag": tag, "i": i, "pad": tag * (1000 + i * 37)}).encode())
"""


def test_concurrent_writers_never_leave_a_torn_file(tmp_path: Path) -> None:
    path = snapshot_file(tmp_path / "catalogs", "kit")
    writers = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), tag], env=aggregator_env()) for tag in ("a", "b")
    ]
    reads = 0
    while any(w.poll() is None for w in writers):
        if path.exists():
            document = json.loads(path.read_bytes())  # every read sees one whole file
            assert document["pad"] == document["tag"] * (1000 + document["i"] * 37)
            reads += 1
    assert all(w.wait() == 0 for w in writers)
    assert reads > 0
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind


# ---------------------------------------------------------------- store


def test_store_prefers_live_and_falls_back_to_the_snapshot() -> None:
    store = CatalogStore(snapshot_servers={"kit"})
    events: list[tuple[str, str | None]] = []
    store.subscribe(lambda server, catalog: events.append((server, catalog.origin if catalog else None)))
    store.seed(sample_catalog(listed_at=time.time() - DAY))
    assert store.get("kit").is_snapshot and store.live("kit") is None  # type: ignore[union-attr]
    live = sample_catalog()
    store.put(live)
    assert store.get("kit") is live and store.live("kit") is live
    assert store.snapshot("kit").loaded_at == live.loaded_at  # type: ignore[union-attr]
    store.drop("kit")  # stopped or crashed: the last live listing stays searchable, as a snapshot
    assert store.get("kit").is_snapshot and store.get("kit").loaded_at == live.loaded_at  # type: ignore[union-attr]
    store.forget("kit")
    assert store.get("kit") is None and store.snapshot("kit") is None
    assert events == [("kit", "snapshot"), ("kit", "live"), ("kit", "snapshot"), ("kit", None)]


def test_store_without_snapshots_drops_as_before() -> None:
    store = CatalogStore()
    store.put(sample_catalog())
    store.drop("kit")
    assert store.get("kit") is None and store.loaded() == {}


# ---------------------------------------------------------------- pool, in-process


async def test_pool_writes_seeds_and_replaces_snapshots(tmp_path: Path) -> None:
    log = tmp_path / "spawn.log"
    config = config_of({"kit": kit_upstream("--spawn-log", str(log)), "off": kit_upstream(snapshots=False)})
    async with UpstreamPool.running(config, tmp_path / "data") as pool:
        await pool.start_all()
        await pool.flush_snapshots()
        first = pool.store.live("kit")
    path = snapshot_file(tmp_path / "data" / "catalogs", "kit")
    assert path.exists() and not snapshot_file(tmp_path / "data" / "catalogs", "off").exists()
    assert spawns(log) == 1

    async with UpstreamPool.running(config, tmp_path / "data") as pool:
        seeded = await pool.ensure_catalog("kit")  # served from the snapshot: nothing starts
        assert seeded.is_snapshot and first is not None and seeded.loaded_at == first.loaded_at
        assert [t.name for t in seeded.tools] == [t.name for t in first.tools]
        assert seeded.instructions == first.instructions and seeded.server_info == first.server_info
        assert pool.status("kit").snapshot_tool_count == len(first.exposed_tools)
        assert pool.status("kit").state == "configured" and pool.store.get("off") is None
        assert spawns(log) == 1
        live = await pool.ensure_live_catalog("kit")
        assert not live.is_snapshot and spawns(log) == 2
        await pool.flush_snapshots()
    assert json.loads(path.read_text())["listed_at"] == live.loaded_at


async def test_an_eager_upstream_starts_even_with_a_snapshot(tmp_path: Path) -> None:
    log = tmp_path / "spawn.log"
    config = config_of({"kit": kit_upstream("--spawn-log", str(log), start="eager")})
    for expected in (1, 2):
        async with UpstreamPool.running(config, tmp_path / "data") as pool:
            await anyio.to_thread.run_sync(wait_for, lambda: pool.store.live("kit") is not None, "the eager start")
            await pool.flush_snapshots()
        assert spawns(log) == expected


async def test_a_snapshot_write_does_not_hold_up_a_load(tmp_path: Path) -> None:
    """The write runs in a worker thread: the load returns before the file exists if the disk is slow."""
    config = config_of({"kit": kit_upstream()})
    async with UpstreamPool.running(config, tmp_path / "data") as pool:
        assert pool.snapshots is not None
        release = anyio.Event()
        original = pool.snapshots.write

        def slow_write(catalog: Catalog, digest: str) -> Path | None:
            anyio.from_thread.run(release.wait)
            return original(catalog, digest)

        pool.snapshots.write = slow_write  # type: ignore[method-assign]
        catalog = await pool.ensure_live_catalog("kit")  # returns while the write is blocked
        assert not catalog.is_snapshot and not snapshot_file(tmp_path / "data" / "catalogs", "kit").exists()
        release.set()
        await pool.flush_snapshots()
        assert snapshot_file(tmp_path / "data" / "catalogs", "kit").exists()


# ---------------------------------------------------------------- real restarts over stdio


async def call(session: ClientSession, name: str, /, **arguments: Any) -> Any:
    return await session.call_tool(name, arguments)


def restart_config(tmp_path: Path, b_args: tuple[str, ...] = ()) -> tuple[Path, dict[str, Path]]:
    logs = {name: tmp_path / f"{name}.spawns" for name in ("alpha", "beta", "direct")}
    upstreams = {
        "alpha": kit_upstream("--tag", "alpha", "--spawn-log", str(logs["alpha"])),
        "beta": kit_upstream("--tag", "beta", "--tools", "3", "--spawn-log", str(logs["beta"]), *b_args),
        "direct": kit_upstream("--tag", "direct", "--spawn-log", str(logs["direct"]), expose="direct"),
    }
    return write_config(tmp_path, upstreams), logs


def total_spawns(logs: dict[str, Path]) -> int:
    return sum(spawns(log) for log in logs.values())


async def warm_up(config: Path, data: Path, logs: dict[str, Path]) -> None:
    """A first aggregator loads every upstream (search with load: true), which writes the snapshots."""
    async with aggregator_client(config, "--data-dir", str(data)) as session:
        payload = structured(await call(session, "catalog_search_tools", query="echo", load=True))
        assert "failed" not in payload
    wait_for(lambda: all(snapshot_file(data / "catalogs", name).exists() for name in logs), "snapshot files")


async def test_a_restarted_aggregator_answers_from_snapshots_without_spawning(tmp_path: Path) -> None:
    config, logs = restart_config(tmp_path)
    data = tmp_path / "data"
    await warm_up(config, data, logs)
    assert total_spawns(logs) == 3
    before = json.loads(snapshot_file(data / "catalogs", "alpha").read_text())["listed_at"]

    async with aggregator_client(config, "--data-dir", str(data)) as session:
        listed = {tool.name for tool in (await session.list_tools()).tools}
        assert "direct__echo" in listed  # a direct upstream's tools are listed from its snapshot

        results = structured(await call(session, "catalog_search_tools", query="add two numbers"))["results"]
        top = results[0]
        assert top["tool"] == "add" and top["catalog_loaded"] is False and top["snapshot_age_s"] >= 0
        assert all(item["tool"] is not None for item in results)  # tool-level, not server-level

        servers = structured(await call(session, "catalog_list_servers"))["servers"]
        assert all(s["state"] == "configured" and s["catalog_loaded"] is False for s in servers)
        assert all(s["tool_count"] and "snapshot_age_s" in s for s in servers)

        page = structured(await call(session, "catalog_list_tools", server="beta"))
        assert "noop_003" in [item["tool"] for item in page["items"]] and page["catalog_loaded"] is False

        described = structured(await call(session, "catalog_describe_tool", server="alpha", tool="add"))
        assert described["required"] == ["a", "b"] and described["catalog_loaded"] is False

        apropos = (await call(session, "apropos-search", pattern="noop_00")).content[0].text
        assert "beta::noop_001 [TOOL]" in apropos and "From snapshots (not started yet): alpha" in apropos
        refs = (await call(session, "who-references", name="message")).content[0].text
        assert "alpha::echo [GENERIC-FUNCTION]" in refs and "From snapshots" in refs

        assert total_spawns(logs) == 3  # nothing spawned by any of that

        result = await call(session, "catalog_call_tool", server="alpha", tool="echo", arguments={"message": "hi"})
        assert not result.is_error and result.content[0].text == "hi"
        assert (spawns(logs["alpha"]), spawns(logs["beta"]), spawns(logs["direct"])) == (2, 1, 1)

        results = structured(await call(session, "catalog_search_tools", query="add two numbers"))["results"]
        alpha = next(item for item in results if item["server"] == "alpha")
        assert alpha["catalog_loaded"] is True and "snapshot_age_s" not in alpha
        wait_for(
            lambda: json.loads(snapshot_file(data / "catalogs", "alpha").read_text())["listed_at"] > before,
            "the live listing to replace alpha's snapshot",
        )


async def test_an_edited_upstream_loses_only_its_own_snapshot(tmp_path: Path) -> None:
    config, logs = restart_config(tmp_path)
    data = tmp_path / "data"
    await warm_up(config, data, logs)
    config, logs = restart_config(tmp_path, b_args=("--page-size", "2"))  # beta's args changed
    errlog = (tmp_path / "stderr.log").open("w")
    async with aggregator_client(config, "--data-dir", str(data), errlog=errlog) as session:
        servers = {s["name"]: s for s in structured(await call(session, "catalog_list_servers"))["servers"]}
        assert servers["beta"]["tool_count"] is None and "snapshot_age_s" not in servers["beta"]
        assert servers["alpha"]["tool_count"] and servers["direct"]["tool_count"]
        results = structured(await call(session, "catalog_search_tools", query="beta testkit noop", limit=50))
        beta = [item for item in results["results"] if item["server"] == "beta"]
        assert beta and all(item["tool"] is None for item in beta)  # server-level until started again
        assert total_spawns(logs) == 3


async def test_a_tool_gone_from_the_live_server_is_unknown_after_the_live_load(tmp_path: Path) -> None:
    config, logs = restart_config(tmp_path)
    data = tmp_path / "data"
    await warm_up(config, data, logs)
    # The snapshot of an earlier run lists a tool the server no longer offers.
    path = snapshot_file(data / "catalogs", "alpha")
    document = json.loads(path.read_text())
    document["tools"].append({"name": "retired", "description": "Gone since.", "inputSchema": {"type": "object"}})
    path.write_text(json.dumps(document))
    async with aggregator_client(config, "--data-dir", str(data)) as session:
        described = structured(await call(session, "catalog_describe_tool", server="alpha", tool="retired"))
        assert described["catalog_loaded"] is False  # the snapshot still says so; nothing started
        assert spawns(logs["alpha"]) == 1
        result = await call(session, "catalog_call_tool", server="alpha", tool="retired", arguments={})
        error = structured(result)["error"]
        assert result.is_error and error["reason"] == "unknown_tool"
        assert "no longer has tool 'retired'" in error["message"] and "search again" in error["message"]
        assert spawns(logs["alpha"]) == 2  # the live load proved it absent
        again = structured(await call(session, "catalog_describe_tool", server="alpha", tool="retired"))
        assert again["error"]["reason"] == "unknown_tool"


async def test_corrupt_snapshot_is_ignored_once_then_rewritten(tmp_path: Path) -> None:
    config, logs = restart_config(tmp_path)
    data = tmp_path / "data"
    await warm_up(config, data, logs)
    path = snapshot_file(data / "catalogs", "alpha")
    path.write_bytes(path.read_bytes()[:100])  # truncated, as by a crash of some other writer
    stderr = tmp_path / "stderr.log"
    with stderr.open("w") as errlog:
        async with aggregator_client(config, "--data-dir", str(data), errlog=errlog) as session:
            servers = {s["name"]: s for s in structured(await call(session, "catalog_list_servers"))["servers"]}
            assert servers["alpha"]["tool_count"] is None and servers["beta"]["tool_count"]
            await call(session, "catalog_list_tools", server="alpha")  # a load rewrites it
            wait_for(lambda: _valid_json(path), "alpha's snapshot to be rewritten")
    assert stderr.read_text().count("snapshot ignored") == 1


def _valid_json(path: Path) -> bool:
    try:
        return bool(json.loads(path.read_text())["tools"])
    except (ValueError, KeyError):
        return False


async def test_unwritable_data_dir_logs_one_warning_and_works_as_before(tmp_path: Path) -> None:
    config, _ = restart_config(tmp_path)
    data = tmp_path / "data"
    data.write_text("not a directory")
    stderr = tmp_path / "stderr.log"
    with stderr.open("w") as errlog:
        async with aggregator_client(config, "--data-dir", str(data), errlog=errlog) as session:
            payload = structured(await call(session, "catalog_search_tools", query="add two numbers", load=True))
            assert payload["results"][0]["tool"] == "add" and "failed" not in payload
            result = await call(session, "catalog_call_tool", server="beta", tool="echo", arguments={"message": "x"})
            assert not result.is_error
    assert stderr.read_text().count("cannot be written") == 1


def test_two_concurrent_refreshes_leave_valid_snapshots(tmp_path: Path) -> None:
    config, logs = restart_config(tmp_path)
    data = tmp_path / "data"
    command = [sys.executable, "-m", "aggregator", "refresh", "--config", str(config), "--data-dir", str(data)]
    procs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=aggregator_env())
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    assert all(b"refreshed 3 of 3 snapshots" in out for out, _ in outputs)
    assert total_spawns(logs) == 6
    snapshots = SnapshotDir(data)
    parsed = config_of(json.loads(config.read_text())["upstreams"])
    for name, upstream in parsed.upstreams.items():
        assert snapshots.read(name, fingerprint(upstream), DAY, lambda _: False).catalog is not None
    assert sorted(p.name.split(".")[0] for p in (data / "catalogs").iterdir()) == ["alpha", "beta", "direct"]


def test_refresh_names_and_list_upstreams_columns(tmp_path: Path) -> None:
    config, logs = restart_config(tmp_path)
    data = tmp_path / "data"
    env = aggregator_env(AGGREGATOR_DATA_DIR=str(data))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        base = [sys.executable, "-m", "aggregator", *args, "--config", str(config)]
        return subprocess.run(base, capture_output=True, text=True, env=env, timeout=120)

    unknown = run("refresh", "nope")
    assert unknown.returncode == 2 and "no upstream named nope" in unknown.stderr
    done = run("refresh", "ALPHA")
    assert done.returncode == 0 and "alpha" in done.stdout and "written: alpha." in done.stdout
    assert (spawns(logs["alpha"]), spawns(logs["beta"])) == (1, 0)
    listing = json.loads(run("list-upstreams", "--json").stdout)
    rows = {row["name"]: row for row in listing["upstreams"]}
    assert rows["alpha"]["snapshot_tools"] and rows["alpha"]["snapshot_age"] is not None
    assert rows["beta"]["snapshot_tools"] is None
    table = run("list-upstreams").stdout
    assert "snapshot" in table.splitlines()[1] and "tools, " in table
    searched = run("search", "add two numbers", "--limit", "3")
    assert searched.returncode == 0
    assert searched.stdout.splitlines()[2].split()[2:4] == ["alpha", "add"]  # the top row, from the snapshot
    assert "(from catalog snapshots, not started yet: alpha)" in searched.stdout
    assert (spawns(logs["alpha"]), spawns(logs["beta"])) == (1, 0)  # listing and searching start nothing
