"""The example upstream servers start, list what they offer and answer calls correctly.

toolbox and notes are driven through the mcp SDK client (stdio, streamable HTTP, SSE); testkit through
the SDK client where its behaviour is protocol-clean and through raw JSON-RPC over a pipe where it is
deliberately not (malformed listings, crashes, cancellation, hangs).
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import EXAMPLES, alive, free_port, wait_for_port

TOOLBOX = str(EXAMPLES / "toolbox.py")
NOTES = str(EXAMPLES / "notes.py")
TESTKIT = str(EXAMPLES / "testkit.py")
TESTKIT_CORE = {
    "echo",
    "add",
    "image",
    "structured",
    "fail",
    "slow",
    "crash",
    "stderr",
    "big",
    "set_tools",
    "pid",
    "ask",
    "meta",
    "reply",
}


@asynccontextmanager
async def stdio_session(script: str, *args: str, **session_kwargs: Any) -> AsyncIterator[ClientSession]:
    """An initialized SDK session to `script` over stdio (entered and left in the calling task)."""
    params = StdioServerParameters(command=sys.executable, args=[script, *args])
    with open(os.devnull, "w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write, **session_kwargs) as session,
        ):
            await session.initialize()
            yield session


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


class RawServer:
    """A testkit child spoken to in raw newline-delimited JSON-RPC (no SDK validation in the way)."""

    def __init__(self, *flags: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, TESTKIT, *flags],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, so a group kill spares pytest
        )
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()
        self._next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.messages.put(json.loads(line))

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: dict[str, Any] | None = None) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        return self._next_id

    def receive(self, timeout: float = 5.0) -> dict[str, Any]:
        return self.messages.get(timeout=timeout)

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a request and return its response, skipping notifications."""
        request_id = self.request(method, params)
        while True:
            message = self.receive()
            if message.get("id") == request_id:
                return message

    def initialize(self) -> dict[str, Any]:
        client = {"name": "raw-test", "version": "0"}
        params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client}
        response = self.call("initialize", params)
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return response

    def drain(self) -> list[dict[str, Any]]:
        """Every message received so far and not yet consumed."""
        drained = []
        while not self.messages.empty():
            drained.append(self.messages.get_nowait())
        return drained

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def raw_servers() -> Any:
    """Start RawServers through this factory; each is killed (with its group) after the test."""
    started: list[RawServer] = []

    def start(*flags: str) -> RawServer:
        server = RawServer(*flags)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


# ---- client config snippets ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "key"),
    [
        ("claude_desktop_config.json", "mcpServers"),
        (".mcp.json", "mcpServers"),
        (".cursor/mcp.json", "mcpServers"),
        (".vscode/mcp.json", "servers"),
    ],
)
def test_client_snippets_start_the_aggregator(path: str, key: str) -> None:
    config = json.loads((EXAMPLES / "clients" / path).read_text())
    assert list(config) == [key]
    entry = config[key]["aggregator"]
    assert entry["command"] == "aggregator"
    assert entry["args"][:2] == ["serve", "--config"]
    assert entry["args"][2].endswith("aggregator.yaml")
    if key == "servers":
        assert entry["type"] == "stdio"  # VS Code wants the type on every entry


# ---- toolbox ----------------------------------------------------------------------------------


async def test_toolbox_stdio_lists_tools_and_computes() -> None:
    async with stdio_session(TOOLBOX) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert 18 <= len(tools) <= 25
        assert all(tool.description and tool.input_schema.get("type") == "object" for tool in tools.values())
        assert tools["convert_timezone"].annotations is not None
        assert tools["convert_timezone"].annotations.read_only_hint is True
        assert [name for name, tool in tools.items() if tool.output_schema] == ["number_statistics"]

        converted = await session.call_tool(
            "convert_timezone",
            {"time": "2025-07-01T12:00:00", "from_zone": "Europe/Paris", "to_zone": "America/New_York"},
        )
        assert json.loads(text_of(converted))["iso"] == "2025-07-01T06:00:00-04:00"

        assert text_of(await session.call_tool("calculate", {"expression": "2 * (3 + 4) ** 2"})) == "98"
        refused = await session.call_tool("calculate", {"expression": "__import__('os').getcwd()"})
        assert refused.is_error

        stats = await session.call_tool("number_statistics", {"numbers": [2, 4, 4, 4, 5, 5, 7, 9]})
        assert stats.structured_content is not None
        assert stats.structured_content["mean"] == 5.0
        assert stats.structured_content["median"] == 4.5
        assert stats.structured_content["count"] == 8

        boiling = await session.call_tool("convert_units", {"value": 212, "from_unit": "F", "to_unit": "C"})
        assert text_of(boiling) == "212 F = 100 C"
        as_json = await session.call_tool("yaml_to_json", {"yaml_text": "a: [1, two]\nwhen: 2025-01-02"})
        assert json.loads(text_of(as_json)) == {"a": [1, "two"], "when": "2025-01-02"}
        assert text_of(await session.call_tool("hash_text", {"text": "abc", "algorithm": "md5"})) == (
            "900150983cd24fb0d6963f7d28e17f72"
        )


async def test_toolbox_over_streamable_http_and_sse() -> None:
    for transport, path in (("streamable-http", "/mcp"), ("sse", "/sse")):
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, TOOLBOX, transport, "--host", "127.0.0.1", "--port", str(port)],
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_port(port, proc)
            url = f"http://127.0.0.1:{port}{path}"
            client = streamable_http_client(url) if transport == "streamable-http" else sse_client(url)
            async with client as streams, ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                assert len((await session.list_tools()).tools) >= 18
                result = await session.call_tool("slugify", {"text": "Hello, World!"})
                assert text_of(result) == "hello-world", transport
        finally:
            proc.terminate()
            proc.wait(timeout=10)


# ---- notes ------------------------------------------------------------------------------------


async def test_notes_offers_tools_prompts_resources_and_templates() -> None:
    async with stdio_session(NOTES) as session:
        tool_names = {tool.name for tool in (await session.list_tools()).tools}
        assert {"add_note", "list_notes", "get_note", "delete_note"} <= tool_names
        prompts = {prompt.name: prompt for prompt in (await session.list_prompts()).prompts}
        assert {arg.name for arg in prompts["draft_note"].arguments or []} == {"title", "tone"}
        assert {str(r.uri) for r in (await session.list_resources()).resources} >= {"notes://index"}
        templates = (await session.list_resource_templates()).resource_templates
        assert [t.uri_template for t in templates] == ["notes://{note_id}"]

        added = json.loads(text_of(await session.call_tool("add_note", {"title": "Plan", "body": "Ship it"})))
        note = await session.read_resource(f"notes://{added['id']}")
        assert "Ship it" in note.contents[0].text  # type: ignore[union-attr]
        deleted = await session.call_tool("delete_note", {"note_id": added["id"]})
        assert not deleted.is_error
        assert (await session.call_tool("get_note", {"note_id": added["id"]})).is_error


# ---- testkit through the SDK client -----------------------------------------------------------


async def test_testkit_paginates_and_lists_prompts_and_resources() -> None:
    async with stdio_session(TESTKIT, "--page-size", "4", "--tools", "3", "--tag", "pg") as session:
        names: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            names += [tool.name for tool in page.tools]
            pages += 1
            cursor = page.next_cursor
            if cursor is None:
                break
        assert pages == 5  # 14 core tools + 3 noop tools, 4 per page
        assert set(names) == TESTKIT_CORE | {f"noop_00{i}" for i in range(1, 4)}
        assert len((await session.list_prompts()).prompts) == 2
        assert len((await session.list_resources()).resources) == 2
        assert len((await session.list_resource_templates()).resource_templates) == 2
        assert text_of(await session.call_tool("noop_003", {"message": "hi"})) == "hi"


async def test_testkit_tool_results() -> None:
    async with stdio_session(TESTKIT) as session:
        assert session.initialize_result is not None
        assert session.initialize_result.server_info.name == "testkit"
        assert text_of(await session.call_tool("echo", {"message": "héllo"})) == "héllo"

        added = await session.call_tool("add", {"a": 2, "b": 3.5})
        assert text_of(added) == "5.5" and added.structured_content == {"sum": 5.5}

        image = await session.call_tool("image", {})
        block = image.content[0]
        assert isinstance(block, types.ImageContent) and block.mime_type == "image/png"
        assert base64.b64decode(block.data).startswith(b"\x89PNG\r\n\x1a\n")

        structured = await session.call_tool("structured", {})
        assert structured.structured_content == json.loads(text_of(structured))

        failed = await session.call_tool("fail", {"message": "nope"})
        assert failed.is_error and text_of(failed) == "nope"

        assert len(text_of(await session.call_tool("big", {"n": 100_000}))) == 100_000
        assert int(text_of(await session.call_tool("pid", {}))) > 1


async def test_testkit_progress_and_concurrent_calls() -> None:
    progress: list[tuple[float, float | None]] = []

    async def on_progress(value: float, total: float | None, _message: str | None) -> None:
        progress.append((value, total))

    async with stdio_session(TESTKIT) as session:
        slow_done = anyio.Event()
        order: list[str] = []

        async def slow() -> None:
            result = await session.call_tool("slow", {"seconds": 1.0, "steps": 3}, progress_callback=on_progress)
            order.append(text_of(result))
            slow_done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            await anyio.sleep(0.1)
            order.append(text_of(await session.call_tool("echo", {"message": "quick"})))
        with anyio.fail_after(2):
            while len(progress) < 3:  # progress callbacks run in their own tasks
                await anyio.sleep(0.01)
        assert order[0] == "quick" and order[1].startswith("slept")
        assert sorted(progress) == [(1, 3), (2, 3), (3, 3)]


async def test_testkit_set_tools_sends_list_changed() -> None:
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(getattr(message, "root", message), types.ToolListChangedNotification):
            changed.set()

    async with stdio_session(TESTKIT, message_handler=on_message) as session:
        assert session.initialize_result is not None
        assert session.initialize_result.capabilities.tools is not None
        assert session.initialize_result.capabilities.tools.list_changed is True
        await session.call_tool("set_tools", {"names": ["alpha", "beta"]})
        with anyio.fail_after(5):
            await changed.wait()
        names = {tool.name for tool in (await session.list_tools()).tools}
        assert {"alpha", "beta"} <= names
        assert text_of(await session.call_tool("alpha", {"message": "a"})) == "a"


# ---- testkit in raw JSON-RPC ------------------------------------------------------------------


def test_testkit_handshake_versions_and_unknown_methods(raw_servers: Any) -> None:
    server = raw_servers("--tag", "raw")
    response = server.initialize()
    assert response["result"]["protocolVersion"] == "2025-06-18"
    assert response["result"]["serverInfo"]["name"] == "testkit-raw"
    assert server.call("server/discover")["error"]["code"] == -32601
    assert server.call("no/such/method")["error"]["code"] == -32601
    assert server.call("ping")["result"] == {}
    assert server.call("tools/call", {"name": "nope", "arguments": {}})["error"]["code"] == -32602

    newer = raw_servers()
    versioned = newer.call("initialize", {"protocolVersion": "2099-01-01", "capabilities": {}})
    assert versioned["result"]["protocolVersion"] == "2025-11-25"


def test_testkit_malformed_listing(raw_servers: Any) -> None:
    server = raw_servers("--malformed")
    server.initialize()
    tools = server.call("tools/list")["result"]["tools"]
    good = [tool for tool in tools if tool.get("name") in TESTKIT_CORE]
    assert len(good) == len(TESTKIT_CORE)
    broken = [tool for tool in tools if tool.get("name") not in TESTKIT_CORE]
    assert len(broken) == 3
    assert any("name" not in tool for tool in broken)
    assert any(isinstance(tool.get("inputSchema"), str) for tool in broken)
    schemas = [tool.get("inputSchema") for tool in broken]
    assert any(isinstance(schema, dict) and "type" not in schema for schema in schemas)


def test_testkit_crash_exits_with_code_3(raw_servers: Any) -> None:
    server = raw_servers()
    server.initialize()
    server.request("tools/call", {"name": "crash", "arguments": {}})
    assert server.proc.wait(timeout=5) == 3
    assert server.proc.stderr is not None
    assert b"crash" in server.proc.stderr.read()
    assert server.messages.empty()  # no answer to the crashing call


def test_testkit_cancellation_drops_result_unless_ignored(raw_servers: Any) -> None:
    for flags, expect_result in (((), False), (("--ignore-cancel",), True)):
        server = raw_servers(*flags)
        server.initialize()
        call_id = server.request("tools/call", {"name": "slow", "arguments": {"seconds": 0.3}})
        server.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": call_id}})
        server.call("ping")
        time.sleep(0.5)
        late = [m for m in server.drain() if m.get("id") == call_id]
        assert bool(late) is expect_result, flags


def test_testkit_start_flags(raw_servers: Any, tmp_path: Path) -> None:
    spawn_log = tmp_path / "spawns.log"
    failing = raw_servers("--exit-at-start", "--spawn-log", str(spawn_log))
    assert failing.proc.wait(timeout=5) == 1

    hanging = raw_servers("--hang-initialize", "--spawn-log", str(spawn_log))
    hanging.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})
    assert hanging.call("ping")["result"] == {}  # answered, while initialize never is
    time.sleep(0.2)
    assert hanging.messages.empty()
    assert len(spawn_log.read_text().splitlines()) == 2


def test_testkit_grandchild_shares_the_process_group(raw_servers: Any, tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    server = raw_servers("--spawn-grandchild", "--pid-file", str(pid_file))
    server.initialize()
    grandchild = int(pid_file.read_text())
    try:
        assert os.getpgid(grandchild) == os.getpgid(server.proc.pid) == server.proc.pid
        assert server.proc.stdin is not None
        server.proc.stdin.close()  # EOF: testkit exits, the grandchild lives on
        assert server.proc.wait(timeout=5) == 0
        assert alive(grandchild)
    finally:
        os.killpg(server.proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(grandchild)


def test_testkit_exits_on_eof_despite_running_calls(raw_servers: Any) -> None:
    server = raw_servers()
    server.initialize()
    server.request("tools/call", {"name": "slow", "arguments": {"seconds": 30}})
    assert server.proc.stdin is not None
    server.proc.stdin.close()
    assert server.proc.wait(timeout=5) == 0


@pytest.mark.skipif(
    importlib.util.find_spec("aggregator.examples") is None,
    reason="examples/ is not installed as aggregator.examples yet",
)
def test_examples_run_as_modules() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "aggregator.examples.testkit", "--exit-at-start"],
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 1 and b"exit-at-start" in done.stderr
    assert time.monotonic() - started < 5
    helped = subprocess.run(
        [sys.executable, "-m", "aggregator.examples.toolbox", "--help"], capture_output=True, timeout=60
    )
    assert helped.returncode == 0 and b"streamable-http" in helped.stdout
