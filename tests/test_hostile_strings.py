"""Strings from outside made safe where they enter (issue 20, item 10): a lone surrogate or invalid
UTF-8 from an upstream never ends `aggregator serve`, and every caller gets an answer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from hypothesis import given
from hypothesis import strategies as st
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage

from aggregator.safetext import SurrogateEscapes, has_surrogates, printable, scrub
from aggregator.upstream.server_messages import parse_upstream_line
from aggregator.wire import encode
from tests.conftest import (
    EXAMPLES,
    aggregator_client,
    free_port,
    kit_upstream,
    structured,
    wait_for_port,
    write_config,
)
from tests.test_serve_http import http_aggregator

CUT = "cut emoji \ud83d here"  # the high half of 😀 alone, as a memory file cut mid-emoji holds it


def _hostile_kit(tmp_path: Path) -> Path:
    tools, prompts = tmp_path / "tools.json", tmp_path / "prompts.json"
    tools.write_text(json.dumps([{"name": "cut", "description": CUT, "inputSchema": {"type": "object"}}]))
    prompts.write_text(json.dumps([{"name": "cut", "description": CUT, "arguments": []}]))
    flags = ("--extra-tools", str(tools), "--extra-prompts", str(prompts))
    return write_config(tmp_path, {"kit": kit_upstream(*flags, expose="direct")})


REPLY_LINE = '{"jsonrpc":"2.0","id":ID,"result":{"content":[{"type":"text","text":"a \\ud800 b"}]}}'
REPLY_BYTES = '{"jsonrpc":"2.0","id":ID,"result":{"content":[{"type":"text","text":"bad \\u00ff"}]}}'


async def _everything_answers(session: ClientSession) -> None:
    tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert tools["kit__cut"].description == "cut emoji \ufffd here"
    listed = structured(await session.call_tool("catalog_list_tools", {"server": "kit", "limit": 200}))
    assert any(item["tool"] == "cut" and "\ufffd" in item["summary"] for item in listed["items"])
    reply = await session.call_tool("kit__reply", {"line": REPLY_LINE})
    assert reply.content[0].text == "a \ufffd b"
    prompts = {prompt.name: prompt for prompt in (await session.list_prompts()).prompts}
    assert prompts["kit__cut"].description == "cut emoji \ufffd here"
    got = await session.get_prompt("kit__cut", {})
    assert got.messages[0].content.text == "cut emoji \ufffd here"
    echo = await session.call_tool("kit__echo", {"message": "still here"})
    assert echo.content[0].text == "still here"  # the session and the upstream lived


async def test_a_lone_surrogate_from_an_upstream_never_ends_stdio_serve(tmp_path: Path) -> None:
    async with aggregator_client(_hostile_kit(tmp_path)) as session:
        await _everything_answers(session)


async def test_a_lone_surrogate_from_an_upstream_is_answered_over_http(tmp_path: Path) -> None:
    with http_aggregator(_hostile_kit(tmp_path)) as url:
        async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            await _everything_answers(session)


async def test_a_lone_surrogate_from_an_http_upstream_is_answered_at_once(tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen([sys.executable, str(EXAMPLES / "testkit.py"), "--http", str(port)])
    try:
        wait_for_port(port, server)
        web = {"url": f"http://127.0.0.1:{port}/mcp", "timeouts": {"call": 300}}
        async with aggregator_client(write_config(tmp_path, {"web": web})) as session:
            with anyio.fail_after(60):  # a hang guard: the SDK's parser refused the line, the call waited 300 s
                arguments = {"line": REPLY_LINE}
                reply = await session.call_tool(
                    "catalog_call_tool", {"server": "web", "tool": "reply", "arguments": arguments}
                )
            assert reply.content[0].text == "a \ufffd b", reply
    finally:
        server.kill()
        server.wait()


@given(
    st.lists(st.sampled_from(["a", "\\", '\\"', "\\ud83d", "\\ude00", "\\ud800", "\\\\", "\\n"]), max_size=12),
    st.data(),
)
def test_streamed_surrogate_escapes_are_fixed_wherever_chunks_split(parts: list[str], data: st.DataObject) -> None:
    body = ('"' + "".join(parts) + '"').encode()
    try:
        expected = scrub(json.loads(body))
    except ValueError:
        return  # not a JSON string (an unfinished escape): nothing to compare
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=4)))
    escapes = SurrogateEscapes()
    pieces = [body[lo:hi] for lo, hi in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    out = b"".join(escapes.feed(piece) for piece in pieces) + escapes.flush()
    assert json.loads(out) == expected


def test_invalid_utf8_from_an_upstream_is_replaced_not_dropped() -> None:
    line = REPLY_BYTES.replace("ID", "7").replace("\\u00ff", "\xff").encode("latin-1")
    message = parse_upstream_line(line)
    assert isinstance(message, SessionMessage)
    assert message.message.result["content"][0]["text"] == "bad \ufffd"  # type: ignore[union-attr]
    request = b'{"jsonrpc":"2.0","id":3,"method":"sampling/createMessage","params":{"x":"\\udc00"}}'
    parsed = parse_upstream_line(request)
    assert isinstance(parsed, SessionMessage) and parsed.message.params == {"x": "\ufffd"}  # type: ignore[union-attr]


def test_an_answer_that_cannot_be_serialised_becomes_an_error_for_its_id() -> None:
    answer = types.JSONRPCResponse(jsonrpc="2.0", id=9, result={"text": "a\ud800"})
    line = json.loads(encode(SessionMessage(answer)))
    assert line["id"] == 9 and line["error"]["code"] == types.INTERNAL_ERROR
    notice = types.JSONRPCNotification(jsonrpc="2.0", method="x", params={"text": "a\ud800"})
    assert encode(SessionMessage(notice)) == b""  # dropped, nothing half-written


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=30,
)


@given(JSONISH)
def test_scrub_leaves_no_surrogate_and_changes_nothing_else(value: Any) -> None:
    clean = scrub(value)
    text = json.dumps(clean, ensure_ascii=False)
    text.encode("utf-8")  # would raise on a surrogate left anywhere
    if not has_surrogates(json.dumps(value, ensure_ascii=False)):
        assert clean is value
    assert not has_surrogates(printable(json.dumps(value, ensure_ascii=False)))


def test_scrub_and_printable_are_linear_on_megabyte_inputs() -> None:
    deep: Any = "\ud800"
    for _ in range(5000):  # deeper than any recursion limit
        deep = [deep]
    clean = scrub(deep)
    for _ in range(5000):
        clean = clean[0]
    assert clean == "\ufffd"
    wide = {"k": ["\ud800x" * 200_000, "ok" * 500_000]}
    assert scrub(wide)["k"][0].count("\ufffd") == 200_000
    assert printable("\x1b]52;c;AAAA\x07" * 100_000).count("\\u001b") == 100_000


async def test_the_official_memory_server_with_a_cut_emoji_in_its_file(tmp_path: Path) -> None:
    """The finding as it was seen: server-memory's file holds an emoji cut in half."""
    from tests.test_official_servers import TIMEOUTS, _node_installed, node_server

    _node_installed()
    memory = tmp_path / "memory.jsonl"
    entity = {"type": "entity", "name": "Ada", "entityType": "person", "observations": [CUT]}
    memory.write_text(json.dumps(entity) + "\n")  # json.dumps writes the half as \ud83d
    upstream = node_server("server-memory", env={"MEMORY_FILE_PATH": str(memory)}, timeouts=TIMEOUTS)
    async with aggregator_client(write_config(tmp_path, {"memory": upstream})) as session:
        request = {"server": "memory", "tool": "read_graph", "arguments": {}}
        graph = await session.call_tool("catalog_call_tool", request)
        assert not graph.is_error and "Ada" in graph.content[0].text
        again = await session.call_tool(
            "catalog_call_tool", {**request, "tool": "search_nodes", "arguments": {"query": "Ada"}}
        )
        assert not again.is_error  # the session lived


def test_a_lone_surrogate_escaped_in_a_config_file_is_replaced(tmp_path: Path) -> None:
    from aggregator.config import load_config

    yaml = tmp_path / "aggregator.yaml"
    yaml.write_text('upstreams:\n  a:\n    command: x\n    description: "cut \\ud83d"\n')
    assert load_config(yaml, environ={}).upstreams["a"].description == "cut \ufffd"
    json_config = tmp_path / "mcp.json"
    json_config.write_text('{"mcpServers": {"a": {"command": "x", "args": ["\\udc00"]}}}')
    assert load_config(json_config, environ={}).upstreams["a"].args == ["\ufffd"]
