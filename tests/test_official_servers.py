"""The aggregator in front of official MCP servers installed from the public registries.

A real `aggregator serve` subprocess, driven over stdio as a host would drive it, fronts
`@modelcontextprotocol/server-everything`, `-filesystem` and `-memory` (npm) and `mcp-server-time`
and `mcp-server-git` (PyPI, in a venv of their own). `.ci/install-servers` puts them under
`.ci/servers/`; where it could not (no node, no registry), the tests that need them skip.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.conftest import (
    ROOT,
    aggregator_client,
    rpc,
    shared_data,
    spawn_raw_aggregator,
    structured,
    write_config,
)

SERVERS = ROOT / ".ci" / "servers"
NODE_DIR = SERVERS / "node"
NODE_PKGS = NODE_DIR / "node_modules" / "@modelcontextprotocol"
PY_BIN = SERVERS / "py" / "bin"
HOW = "run .ci/install-servers (needs network access to the registries)"
TIMEOUTS = {"connect": 30}  # generous: several servers start at once on 2 busy cores

# server-everything registers these only for clients declaring roots, sampling or elicitation
# (INDEX.json); the aggregator declares to its upstreams what its client declared, and the host's
# test client here declares none.
EVERYTHING_CAPABILITY_TOOLS = {
    "get-roots-list",
    "trigger-elicitation-request",
    "trigger-url-elicitation",
    "trigger-sampling-request",
}


def _node_installed() -> None:
    if shutil.which("node") is None or shutil.which("npx") is None:
        pytest.skip("node/npx not on PATH: the official npm MCP servers cannot run here")
    if not (NODE_DIR / ".installed").is_file():
        pytest.skip(f"official npm MCP servers not installed in {NODE_DIR}: {HOW}")


def _py_installed() -> None:
    if not (SERVERS / "py" / ".installed").is_file():
        pytest.skip(f"official PyPI MCP servers not installed in {SERVERS / 'py'}: {HOW}")


def everything() -> dict[str, Any]:
    """server-everything launched as users do, through npx (here from the local install, offline)."""
    _node_installed()
    return {"command": "npx", "args": ["--no", "mcp-server-everything", "stdio"], "cwd": str(NODE_DIR)}


def node_server(package: str, *args: str, **extra: Any) -> dict[str, Any]:
    _node_installed()
    return {"command": "node", "args": [str(NODE_PKGS / package / "dist" / "index.js"), *args], **extra}


def py_server(command: str, *args: str) -> dict[str, Any]:
    _py_installed()
    return {"command": str(PY_BIN / command), "args": list(args)}


def catalog_names(file: str) -> set[str]:
    return {tool["name"] for tool in json.loads(shared_data("catalogs", file).read_text())["tools"]}


async def call(session: ClientSession, server: str, tool: str, /, **arguments: Any) -> types.CallToolResult:
    return await session.call_tool("catalog_call_tool", {"server": server, "tool": tool, "arguments": arguments})


@asynccontextmanager
async def direct_session(entry: dict[str, Any]) -> AsyncIterator[ClientSession]:
    """A client talking to the upstream itself, without the aggregator: the reference."""
    params = StdioServerParameters(command=entry["command"], args=entry["args"], cwd=entry.get("cwd"))
    with open("/dev/null", "w") as devnull:
        async with stdio_client(params, errlog=devnull) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session


async def list_all(session: ClientSession, method: str, key: str) -> list[Any]:
    items: list[Any] = []
    cursor: str | None = None
    while True:
        page = await getattr(session, method)(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        items += getattr(page, key)
        cursor = page.next_cursor
        if not cursor:
            return items


ENTRY_LINE = re.compile(r"^  (?P<package>[^:]+)::(?P<name>.+) \[(?P<type>[A-Z-]+)\](?P<hidden> \(hidden\))?$")


def entries(text: str) -> list[tuple[str, str, str]]:
    """(package, NAME, TYPE) of each entry line of an apropos-search / who-references answer."""
    return [(m["package"], m["name"], m["type"]) for line in text.splitlines() if (m := ENTRY_LINE.match(line))]


async def search(session: ClientSession, query: str, **extra: Any) -> dict[str, Any]:
    return structured(await session.call_tool("catalog_search_tools", {"query": query, "load": True, **extra}))


def ranked(found: dict[str, Any]) -> list[tuple[str, str]]:
    return [(hit["server"], hit["tool"]) for hit in found["results"]]


async def test_server_everything_through_the_catalog(tmp_path: Path) -> None:
    entry = everything()
    config = write_config(tmp_path, {"everything": {**entry, "timeouts": TIMEOUTS}})
    reference = node_server("server-everything", "stdio")
    async with aggregator_client(config) as session, direct_session(reference) as upstream:
        # the tool list: the published catalog, give or take the capability-dependent extras,
        # and exactly what the server answers a client declaring no capabilities
        listed = structured(await session.call_tool("catalog_list_tools", {"server": "everything", "limit": 200}))
        names = {item["tool"] for item in listed["items"]}
        published = catalog_names("server-everything.json")
        assert (
            published - EVERYTHING_CAPABILITY_TOOLS
            <= names
            <= catalog_names("server-everything.full-capabilities.json")
        )
        assert names == {tool.name for tool in await list_all(upstream, "list_tools", "tools")}
        assert listed["total"] == len(names) and listed["truncated"] is False

        echo = await call(session, "everything", "echo", message="hello from the host")
        assert not echo.is_error and echo.content[0].text == "Echo: hello from the host"
        total = await call(session, "everything", "get-sum", a=2, b=3.5)
        assert not total.is_error and "5.5" in total.content[0].text

        # content and structuredContent pass through untouched: what the server itself answers
        for tool, arguments in [
            ("get-tiny-image", {}),
            ("get-structured-content", {"location": "Chicago"}),
            ("get-annotated-message", {"messageType": "success", "includeImage": True}),  # annotations
            ("get-resource-links", {"count": 2}),  # resource_link blocks
            ("get-sum", {"a": "not a number", "b": 1}),  # the upstream's own isError result
        ]:
            proxied = await call(session, "everything", tool, **arguments)
            direct = await upstream.call_tool(tool, arguments)
            assert proxied.model_dump() == direct.model_dump(), tool
        embedded = await call(session, "everything", "get-resource-reference", resourceType="Blob", resourceId=2)
        assert [block.type for block in embedded.content] == ["text", "resource", "text"]
        assert str(embedded.content[1].resource.uri) == "demo://resource/dynamic/blob/2"
        assert embedded.content[1].resource.blob  # base64 text, timestamped by the server
        image = await call(session, "everything", "get-tiny-image")
        blocks = [block for block in image.content if block.type == "image"]
        assert len(blocks) == 1 and blocks[0].mime_type == "image/png"
        assert blocks[0].data.startswith("iVBORw0KGgo")  # base64 of the PNG signature
        weather = await call(session, "everything", "get-structured-content", location="Chicago")
        assert weather.structured_content == {"temperature": 36, "conditions": "Light rain / drizzle", "humidity": 82}
        described = structured(
            await session.call_tool("catalog_describe_tool", {"server": "everything", "tool": "get-structured-content"})
        )
        assert described["required"] == ["location"]
        assert set(described["output_schema"]["properties"]) == {"temperature", "conditions", "humidity"}
        describe_args = {"server": "everything", "tool": "simulate-research-query"}
        task_only = structured(await session.call_tool("catalog_describe_tool", describe_args))
        assert task_only["execution"]["taskSupport"] == "required"  # the model can see it needs task support

        # progress notifications of the upstream reach the host's progress callback
        seen: list[tuple[float, float | None]] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append((progress, total))

        long_run = await session.call_tool(
            "catalog_call_tool",
            {
                "server": "everything",
                "tool": "trigger-long-running-operation",
                "arguments": {"duration": 1, "steps": 4},
            },
            progress_callback=on_progress,
        )
        assert not long_run.is_error and "completed" in long_run.content[0].text
        with anyio.fail_after(2):  # progress callbacks run in their own tasks
            while len(seen) < 4:
                await anyio.sleep(0.02)
        assert sorted(seen) == [(1, 4), (2, 4), (3, 4), (4, 4)]

        # prompts, resources and templates are in apropos-search, complete: the server's own lists
        for kind, method, key in [
            ("PROMPT", "list_prompts", "prompts"),
            ("RESOURCE", "list_resources", "resources"),
            ("RESOURCE-TEMPLATE", "list_resource_templates", "resource_templates"),
        ]:
            answer = await session.call_tool(
                "apropos-search", {"pattern": "", "package": "everything", "type": kind.lower()}
            )
            assert not answer.is_error
            found = entries(answer.content[0].text)
            expected = {item.name for item in await list_all(upstream, method, key)}
            assert expected, kind
            assert sorted(found, key=lambda e: e[1].casefold()) == found
            assert {name for _, name, _ in found} == expected and len(found) == len(expected), kind
            assert {(package, kind_) for package, _, kind_ in found} == {("everything", kind)}
        prompts = entries((await session.call_tool("apropos-search", {"pattern": "prompt"})).content[0].text)
        assert ("everything", "simple-prompt", "PROMPT") in prompts

        # who-references: a parameter name of a tool, where it is used
        refs = (await session.call_tool("who-references", {"name": "LOCATION", "package": "everything"})).content[0]
        assert entries(refs.text) == [("everything", "get-structured-content", "TOOL")]
        assert "    at properties.location" in refs.text

        # the search finds the sensible tool for natural queries
        for query, tool in [
            ("sum of two numbers", "get-sum"),
            ("echo a message back", "echo"),
            ("return a small image", "get-tiny-image"),
            ("a long running operation that reports progress", "trigger-long-running-operation"),
        ]:
            found = await search(session, query, limit=3)
            assert ranked(found)[0] == ("everything", tool), (query, found)
            assert not found.get("failed")


async def test_filesystem_and_memory_servers(tmp_path: Path) -> None:
    allowed = tmp_path / "files"
    allowed.mkdir()
    (allowed / "hello.txt").write_text("hello from a file\n")
    config = write_config(
        tmp_path,
        {
            "filesystem": node_server("server-filesystem", str(allowed), timeouts=TIMEOUTS),
            "memory": node_server(
                "server-memory", env={"MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")}, timeouts=TIMEOUTS
            ),
        },
    )
    async with aggregator_client(config) as session:
        listed = structured(await session.call_tool("catalog_list_tools", {"server": "filesystem", "limit": 200}))
        assert {item["tool"] for item in listed["items"]} == catalog_names("server-filesystem.json")

        dirs = await call(session, "filesystem", "list_allowed_directories")
        assert not dirs.is_error and str(allowed.resolve()) in dirs.content[0].text
        read = await call(session, "filesystem", "read_text_file", path=str(allowed / "hello.txt"))
        assert not read.is_error and read.content[0].text == "hello from a file\n"
        outside = await call(session, "filesystem", "read_text_file", path="/etc/hostname")
        assert outside.is_error and outside.structured_content is None  # the upstream's refusal, as it is

        memory_tools = structured(await session.call_tool("catalog_list_tools", {"server": "memory", "limit": 200}))
        assert {item["tool"] for item in memory_tools["items"]} == catalog_names("server-memory.json")
        entity = {"name": "Ada", "entityType": "person", "observations": ["wrote the first program"]}
        created = await call(session, "memory", "create_entities", entities=[entity])
        assert not created.is_error, created
        found = await call(session, "memory", "search_nodes", query="program")
        assert not found.is_error and "Ada" in found.content[0].text
        assert "Ada" in (tmp_path / "memory.jsonl").read_text()


def git_repo(directory: Path) -> Path:
    """A one-commit git repository for mcp-server-git (in tmp_path, never the work tree)."""
    repo = directory / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=T", "-c", "user.email=t@example.invalid"]
    (repo / "a.txt").write_text("a\n")
    for args in (["init", "-q"], ["add", "a.txt"], ["commit", "-q", "-m", "first commit of the fixture"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    return repo


async def test_time_and_git_servers_from_pypi(tmp_path: Path) -> None:
    repo = git_repo(tmp_path)
    config = write_config(
        tmp_path,
        {
            "time": {**py_server("mcp-server-time", "--local-timezone", "UTC"), "timeouts": TIMEOUTS},
            "git": {**py_server("mcp-server-git", "--repository", str(repo)), "timeouts": TIMEOUTS},
        },
    )
    async with aggregator_client(config) as session:
        now = await call(session, "time", "get_current_time", timezone="Asia/Tokyo")
        assert not now.is_error, now
        assert now.structured_content["timezone"] == "Asia/Tokyo"
        assert now.structured_content["datetime"].endswith("+09:00")
        converted = await call(
            session, "time", "convert_time", source_timezone="Europe/Paris", time="14:30", target_timezone="Asia/Tokyo"
        )
        assert not converted.is_error, converted
        target = converted.structured_content["target"]
        assert target["timezone"] == "Asia/Tokyo" and target["datetime"][11:16] in {"21:30", "22:30"}  # DST or not
        bad = await call(session, "time", "get_current_time", timezone="Mars/Olympus_Mons")
        assert bad.is_error  # the upstream's own error, passed through

        found = await search(session, "convert a time between time zones")
        assert ranked(found)[0] == ("time", "convert_time"), found

        log = await call(session, "git", "git_log", repo_path=str(repo), max_count=5)
        assert not log.is_error and "first commit of the fixture" in log.content[0].text
        refs = (await session.call_tool("who-references", {"name": "repo_path"})).content[0].text
        assert {name for _, name, _ in entries(refs)} == catalog_names("mcp-server-git.json")


async def test_search_across_all_official_servers(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        {
            "everything": {**everything(), "timeouts": TIMEOUTS},
            "filesystem": node_server("server-filesystem", str(tmp_path), timeouts=TIMEOUTS),
            "memory": node_server(
                "server-memory", env={"MEMORY_FILE_PATH": str(tmp_path / "m.jsonl")}, timeouts=TIMEOUTS
            ),
            "time": {**py_server("mcp-server-time", "--local-timezone", "UTC"), "timeouts": TIMEOUTS},
            "git": {**py_server("mcp-server-git", "--repository", str(git_repo(tmp_path))), "timeouts": TIMEOUTS},
        },
    )
    async with aggregator_client(config) as session:
        found = await search(session, "convert a time between time zones")
        assert not found.get("failed"), found
        assert ranked(found)[0] == ("time", "convert_time")
        servers = structured(await session.call_tool("catalog_list_servers", {}))["servers"]
        assert {s["name"]: s["state"] for s in servers} == dict.fromkeys(
            ["everything", "filesystem", "git", "memory", "time"], "ready"
        )
        for query, top in [
            ("sum of two numbers", ("everything", "get-sum")),
            ("what time is it in Tokyo", ("time", "get_current_time")),
            ("read the contents of a text file", ("filesystem", "read_text_file")),
            ("create entities in the knowledge graph", ("memory", "create_entities")),
        ]:
            assert top in ranked(await search(session, query, limit=3)), query


# ---- shutdown: no process of any of these servers is left behind -------------------------------


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return fields[0], int(fields[1]), int(fields[19])


def _descendants(root: int) -> dict[int, tuple[int, str]]:
    """Every live descendant of `root`: pid → (start time, command line)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) and stat[0] != "Z":
            children.setdefault(stat[1], []).append(int(entry.name))
    found: dict[int, tuple[int, str]] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        stat = _stat(pid)
        if stat:
            found[pid] = (stat[2], cmdline)
            todo += children.get(pid, [])
    return found


def _still_running(pid: int, start_time: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z" and stat[2] == start_time  # same process, not a reused pid


@pytest.mark.parametrize("how", ["eof", "sigterm"])
def test_shutdown_leaves_no_server_process_behind(tmp_path: Path, how: str) -> None:
    """Every process of the real servers, npx's `npm exec` → `sh -c` → node chain included, is gone.

    These servers also exit on their own when their stdin closes, so this guards the real-world
    case; that the whole process group is ended even when a child ignores EOF is proven by
    test_serve_stdio's grandchild test.
    """
    upstreams = {"everything": {**everything(), "timeouts": TIMEOUTS}}  # npx → node
    upstreams["filesystem"] = node_server("server-filesystem", str(tmp_path), timeouts=TIMEOUTS)
    upstreams["time"] = {**py_server("mcp-server-time"), "timeouts": TIMEOUTS}
    config = write_config(tmp_path, upstreams)
    proc = spawn_raw_aggregator(config)
    try:
        loaded = rpc(proc, 2, "tools/call", {"name": "catalog_search_tools", "arguments": {"query": "x", "load": True}})
        assert not loaded["result"].get("isError") and not loaded["result"]["structuredContent"].get("failed"), loaded
        echo = rpc(
            proc,
            3,
            "tools/call",
            {
                "name": "catalog_call_tool",
                "arguments": {"server": "everything", "tool": "echo", "arguments": {"message": "x"}},
            },
        )
        assert echo["result"]["content"][0]["text"] == "Echo: x"

        spawned = _descendants(proc.pid)
        commands = " | ".join(cmdline for _, cmdline in spawned.values())
        # npx shows as "npm exec", then `sh -c`, then node: three processes for one upstream
        for part in ("npm exec", "sh -c 'mcp-server-everything'", "node ", "server-filesystem", "mcp-server-time"):
            assert part in commands, (part, commands)

        if how == "eof":
            assert proc.stdin
            proc.stdin.close()
        else:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 5
    left = spawned
    while left and time.monotonic() < deadline:
        left = {pid: info for pid, info in left.items() if _still_running(pid, info[0])}
        time.sleep(0.05)
    assert not left, f"left behind: {left}"
