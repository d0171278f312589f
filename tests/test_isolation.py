"""Nothing of one client reaches another (issue 19.2, issue 20 items 5-9, 11, 16; docs/isolation.md).

Every test runs a real `aggregator serve` (HTTP with two real clients, or stdio) in front of real
upstream processes: testkit, tests/rogue_upstream.py (a hostile server), server-everything and the
conformance suite's reference server when `.ci/install-servers` / `.ci/install-conformance` ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from aggregator.config import ConfigError, parse_config
from aggregator.proxy.relay import MAX_RELAYED_PER_CLIENT
from aggregator.sdk import raw_request
from tests.conftest import (
    ROOT,
    aggregator_client,
    alive,
    free_port,
    kit_upstream,
    structured,
    wait_for_port,
    write_config,
)
from tests.test_serve_http import http_aggregator

WAIT = 60
ROGUE = Path(__file__).with_name("rogue_upstream.py")
CONFORMANCE = ROOT / ".ci" / "conformance"
SAMPLE = {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 5}


def rogue(*flags: str, **extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(ROGUE), *flags], **extra}


def call(server: str, tool: str, **arguments: Any) -> dict[str, Any]:
    return {"server": server, "tool": tool, "arguments": arguments}


class Host:
    """One client: answers sampling and elicitation (optionally held until released) and records all it hears."""

    def __init__(self, tag: str, *, hold: bool = False) -> None:
        self.tag = tag
        self.hold = hold
        self.release = anyio.Event()
        self.asked = anyio.Event()
        self.sampled: list[str] = []
        self.elicited: list[str] = []
        self.logs: list[Any] = []
        self.rooted = 0
        self.in_flight = self.most_in_flight = 0

    async def sampling(self, ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        self.sampled.append(params.messages[0].content.text)  # type: ignore[union-attr]
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            self.asked.set()
            if self.hold:
                await self.release.wait()
        finally:
            self.in_flight -= 1
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text=f"from {self.tag}"), model="m"
        )

    async def elicitation(self, ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.elicited.append(params.message)
        return types.ElicitResult(action="accept", content={"response": self.tag})

    async def roots(self, ctx: Any) -> types.ListRootsResult:
        self.rooted += 1
        return types.ListRootsResult(roots=[types.Root(uri="file:///mine")])  # type: ignore[arg-type]

    async def on_message(self, message: Any) -> None:
        if isinstance(message, types.LoggingMessageNotification):
            self.logs.append(message.params.data)


async def connect(stack: AsyncExitStack, url: str, host: Host) -> ClientSession:
    """An initialized handshake-era HTTP client session declaring sampling, elicitation and roots."""
    http = await stack.enter_async_context(create_mcp_http_client())
    read, write = await stack.enter_async_context(streamable_http_client(url, http_client=http))
    session = await stack.enter_async_context(
        ClientSession(
            read,
            write,
            sampling_callback=host.sampling,
            elicitation_callback=host.elicitation,
            list_roots_callback=host.roots,
            message_handler=host.on_message,
        )
    )
    await session.initialize()
    return session


@asynccontextmanager
async def two_clients(config: Path, a: Host, b: Host) -> AsyncIterator[tuple[ClientSession, ClientSession]]:
    with http_aggregator(config) as url:
        async with AsyncExitStack() as stack:
            yield await connect(stack, url, a), await connect(stack, url, b)


@contextmanager
def reference_server() -> Iterator[str]:
    """The conformance suite's reference server (HTTP, 127.0.0.1 only), as the conformance lane runs it."""
    tsx = CONFORMANCE / "node_modules" / ".bin" / "tsx"
    if not (tsx.exists() and (CONFORMANCE / "everything-server.ts").exists()):
        pytest.skip(f"needs the conformance suite's reference server; not found under {CONFORMANCE}")
    port = free_port()
    env = {**os.environ, "PORT": str(port), "PATH": f"{tsx.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen(
        [str(tsx), "everything-server.ts"],
        cwd=CONFORMANCE,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for_port(port, proc, timeout=WAIT)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=15)


def text(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


# ---------------------------------------------------------------- 19.2: a stuck call blocks nobody


async def test_a_stuck_call_never_blocks_another_clients_sampling_and_elicitation(tmp_path: Path) -> None:
    """The conformance scenarios tools-call-sampling/-elicitation through the aggregator, while another
    client's call to the same upstream is stuck (its client never answers its sampling request)."""
    with reference_server() as ref:
        config = write_config(tmp_path, {"ref": {"url": ref, "expose": "direct"}})
        a, b = Host("a", hold=True), Host("b")
        async with two_clients(config, a, b) as (session_a, session_b), anyio.create_task_group() as tg:
            stuck: list[Any] = []

            async def run_a() -> None:
                stuck.append(await session_a.call_tool("ref__test_sampling", {"prompt": "prompt of a"}))

            tg.start_soon(run_a)
            with anyio.fail_after(WAIT):
                await a.asked.wait()  # a's call is in flight and stays there: a holds its sampling request
                sampled = await session_b.call_tool("ref__test_sampling", {"prompt": "prompt of b"})
                elicited = await session_b.call_tool("ref__test_elicitation", {"message": "question for b"})
                enums = await session_b.call_tool("ref__test_elicitation_sep1330_enums", {})
            # (the reference server checks a sampling result against a wrong schema, and says so, even
            # directly: the scenario only asks that the request reached the client and the tool answered)
            assert not sampled.is_error and "cannot tell" not in text(sampled)
            assert text(elicited) == 'User response: action=accept, content={"response":"b"}'
            assert "action=accept" in text(enums)
            assert b.sampled == ["prompt of b"] and b.elicited[0] == "question for b"
            assert a.sampled == ["prompt of a"] and a.elicited == []  # a never heard b's requests
            a.release.set()
        assert not stuck[0].is_error and "cannot tell" not in text(stuck[0])


async def test_stdio_upstream_with_per_client_sessions_runs_one_process_per_client(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream(sessions="per-client")})
    a, b = Host("a", hold=True), Host("b")
    ask = call("kit", "ask", method="sampling/createMessage", params=SAMPLE)
    async with two_clients(config, a, b) as (session_a, session_b):
        pid_a = text(await session_a.call_tool("catalog_call_tool", call("kit", "pid")))
        async with anyio.create_task_group() as tg:
            tg.start_soon(session_a.call_tool, "catalog_call_tool", ask)
            with anyio.fail_after(WAIT):
                await a.asked.wait()
                answer = structured(await session_b.call_tool("catalog_call_tool", ask))
            assert answer["result"]["content"]["text"] == "from b"  # shared, this was "cannot tell which client"
            assert a.sampled == ["hi"] and b.sampled == ["hi"]
            a.release.set()
        pid_b = text(await session_b.call_tool("catalog_call_tool", call("kit", "pid")))
        assert pid_a != pid_b
    # both clients are gone (and the aggregator with them): so are their processes
    assert not alive(int(pid_a)) and not alive(int(pid_b))


async def test_a_clients_own_session_ends_when_the_client_disconnects(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream(sessions="per-client")})
    with http_aggregator(config) as url:
        async with AsyncExitStack() as stack:
            session = await connect(stack, url, Host("a"))
            pid = int(text(await session.call_tool("catalog_call_tool", call("kit", "pid"))))
            assert alive(pid)
        with anyio.fail_after(WAIT):  # the client closed its session (DELETE): its process stops
            while alive(pid):
                await anyio.sleep(0.05)


# ---------------------------------------------------------------- 20.6: log messages


async def test_a_log_message_during_one_clients_call_reaches_only_that_client(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"rogue": rogue()})
    a, b = Host("a"), Host("b")
    async with two_clients(config, a, b) as (session_a, session_b):
        await session_b.call_tool("catalog_list_servers", {})  # b is a known, idle client
        await session_a.call_tool("catalog_call_tool", call("rogue", "log", text="secret of a", seconds=0.5))
        await session_b.call_tool("catalog_list_servers", {})  # anything for b would have arrived by now
        assert a.logs == ["secret of a"] and b.logs == []
        # both in flight on one shared session: the owner cannot be told, so nobody hears it
        async with anyio.create_task_group() as tg:
            tg.start_soon(session_b.call_tool, "catalog_call_tool", call("rogue", "log", text="of b", seconds=2))
            await anyio.sleep(0.5)
            await session_a.call_tool("catalog_call_tool", call("rogue", "log", text="of a", seconds=0.5))
        assert "of b" not in a.logs and "of a" not in b.logs


# ---------------------------------------------------------------- 20.5: tasks


async def test_tasks_belong_to_the_client_that_created_them(tmp_path: Path) -> None:
    from tests.test_official_servers import TIMEOUTS, everything

    config = write_config(tmp_path, {"everything": {**everything(), "timeouts": TIMEOUTS, "expose": "direct"}})
    async with two_clients(config, Host("a"), Host("b")) as (session_a, session_b):
        created = await raw_request(
            session_a,
            "tools/call",
            {"name": "everything__simulate-research-query", "arguments": {"topic": "bats"}, "task": {"ttl": 60000}},
        )
        task_id = created["task"]["taskId"]
        assert task_id in {t["taskId"] for t in (await raw_request(session_a, "tasks/list", None))["tasks"]}
        assert task_id not in {t["taskId"] for t in (await raw_request(session_b, "tasks/list", None))["tasks"]}
        for method in ("tasks/get", "tasks/result", "tasks/cancel"):
            with pytest.raises(MCPError, match="unknown task") as refused:
                await raw_request(session_b, method, {"taskId": task_id})
            assert refused.value.code == types.INVALID_PARAMS
        assert (await raw_request(session_a, "tasks/get", {"taskId": task_id}))["taskId"] == task_id
        await raw_request(session_a, "tasks/cancel", {"taskId": task_id})


# ---------------------------------------------------------------- 20.7: requests outside a call


async def test_a_request_outside_a_call_is_never_answered_by_a_handshake_era_client(tmp_path: Path) -> None:
    record = tmp_path / "later.jsonl"
    config = write_config(tmp_path, {"rogue": rogue("--record", str(record))})
    legacy = Host("legacy")
    with http_aggregator(config) as url:
        async with AsyncExitStack() as stack:
            session = await connect(stack, url, legacy)
            await session.call_tool("catalog_list_servers", {})
            async with Client(url, mode="auto") as modern:  # a 2026-07-28 client
                await modern.call_tool("catalog_call_tool", call("rogue", "later", method="roots/list", delay=0.5))
                with anyio.fail_after(WAIT):
                    while not record.exists() or not record.read_text():
                        await anyio.sleep(0.05)
            outcome = json.loads(record.read_text().splitlines()[0])
            assert "cannot tell which client" in outcome["error"]["message"]
            assert legacy.rooted == 0


# ---------------------------------------------------------------- 20.8: resource links


async def test_a_resource_link_of_another_upstream_never_reroutes_a_listed_uri(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"fs": kit_upstream(), "evil": rogue()})
    async with aggregator_client(config) as session:
        await session.call_tool("catalog_search_tools", {"query": "link", "load": True})
        for uri in ("testkit://readme", "testkit://items/3", "rogue://only-mine"):
            await session.call_tool("catalog_call_tool", call("evil", "link", uri=uri))
        readme = await session.read_resource("testkit://readme")  # fs lists it
        assert readme.contents[0].text.startswith("# testkit")  # type: ignore[union-attr]
        item = await session.read_resource("testkit://items/3")  # fs templates it
        assert item.contents[0].text == "item 3"  # type: ignore[union-attr]
        mine = await session.read_resource("rogue://only-mine")  # nobody else claims it: evil's link is readable
        assert mine.contents[0].text == "from rogue"  # type: ignore[union-attr]


# ---------------------------------------------------------------- 20.9 and 20.11: what is relayed, how much


async def test_only_requests_a_server_may_send_are_relayed(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream()})
    host = Host("a")
    async with aggregator_client(config, sampling_callback=host.sampling, message_handler=host.on_message) as session:
        for method in ("tools/call", "x/evil", "initialize", "resources/read"):
            answer = structured(await session.call_tool("catalog_call_tool", call("kit", "ask", method=method)))
            assert answer["error"]["code"] == types.METHOD_NOT_FOUND
            assert "not a request a server may send" in answer["error"]["message"], method
        pinged = structured(await session.call_tool("catalog_call_tool", call("kit", "ask", method="ping")))
        assert pinged == {"result": {}}
        assert host.sampled == []


async def test_relayed_requests_in_flight_are_bounded_per_client(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"rogue": rogue()})
    host = Host("a", hold=True)
    n = 300
    async with aggregator_client(config, sampling_callback=host.sampling) as session:
        async with anyio.create_task_group() as tg:
            flooded: list[Any] = []

            async def flood() -> None:
                args = call("rogue", "flood", n=n, method="sampling/createMessage", params=SAMPLE)
                flooded.append(structured(await session.call_tool("catalog_call_tool", args)))

            tg.start_soon(flood)
            with anyio.fail_after(WAIT):
                while host.in_flight < MAX_RELAYED_PER_CLIENT:
                    await anyio.sleep(0.05)
            await anyio.sleep(0.5)  # the rest were refused by now, and none more reached the client
            assert host.in_flight == MAX_RELAYED_PER_CLIENT
            host.release.set()
        summary = flooded[0]
        assert summary["results"] == len(host.sampled) == MAX_RELAYED_PER_CLIENT
        assert summary["errors"] == n - MAX_RELAYED_PER_CLIENT
        assert summary["messages"] == [
            f"sampling/createMessage: the client already has {MAX_RELAYED_PER_CLIENT} requests to answer; retry later"
        ]
        assert host.most_in_flight == MAX_RELAYED_PER_CLIENT


# ---------------------------------------------------------------- 20.16: reload


async def test_a_reload_lets_every_kind_of_request_in_flight_finish(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"rogue": rogue(), "kit": kit_upstream()})
    async with aggregator_client(config) as session:
        await session.call_tool("catalog_list_tools", {"server": "rogue"})
        async with anyio.create_task_group() as tg:
            got: list[Any] = []

            async def get_prompt() -> None:
                got.append(await session.get_prompt("rogue__slow", {"seconds": "3"}))

            tg.start_soon(get_prompt)
            await anyio.sleep(1)
            write_config(tmp_path, {"kit": kit_upstream()})  # the upstream of the prompt in flight is removed
        assert got[0].messages[0].content.text == "slow prompt"  # type: ignore[union-attr]
        with anyio.fail_after(WAIT):  # and it is gone once done
            while "rogue" in {
                s["name"] for s in structured(await session.call_tool("catalog_list_servers", {}))["servers"]
            }:
                await anyio.sleep(0.2)


# ---------------------------------------------------------------- the `sessions:` key


def test_sessions_default_per_client_for_http_and_sse_shared_for_stdio() -> None:
    config = parse_config(
        """
        upstreams:
          web: {url: "http://127.0.0.1:1/mcp"}
          old: {url: "http://127.0.0.1:1/sse", transport: sse}
          one: {url: "http://127.0.0.1:1/mcp", sessions: shared}
          cli: {command: x}
          own: {command: x, sessions: per-client}
        """,
        "/cfg/aggregator.yaml",
    )
    per_client = {name: upstream.per_client_sessions for name, upstream in config.upstreams.items()}
    assert per_client == {"cli": False, "old": True, "one": False, "own": True, "web": True}
    with pytest.raises(ConfigError) as bad:
        parse_config("upstreams: {a: {command: x, sessions: each}}", "/cfg/aggregator.yaml")
    assert bad.value.key == "upstreams.a.sessions" and "sessions: per-client" in bad.value.fix
