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
from hypothesis import given
from hypothesis import strategies as st
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from aggregator.config import ConfigError, parse_config
from aggregator.proxy.relay import MAX_RELAYED_PER_CLIENT
from aggregator.proxy.routing import ResourceRouter, TaskRouter
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
from tests.test_routing import catalog
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

    def __init__(self, tag: str, *, hold: bool = False, roots: list[str] | None = None) -> None:
        self.tag = tag
        self.roots_given = roots or ["file:///mine"]
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
        return types.ElicitResult(action="accept", content={"response": self.tag, "interpretation": self.tag})

    async def roots(self, ctx: Any) -> types.ListRootsResult:
        self.rooted += 1
        return types.ListRootsResult(roots=[types.Root(uri=uri) for uri in self.roots_given])  # type: ignore[arg-type]

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
            assert text(elicited) == 'User response: action=accept, content={"response":"b","interpretation":"b"}'
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


async def test_each_client_gives_its_own_roots_to_its_own_filesystem_server(tmp_path: Path) -> None:
    """server-filesystem without a directory serves what its client's roots allow: per client, each
    client's roots (and their changes) decide for that client alone."""
    from tests.test_official_servers import TIMEOUTS, node_server

    dirs = {name: tmp_path / name for name in ("a", "b", "c")}
    for name, directory in dirs.items():
        directory.mkdir()
        (directory / "note.txt").write_text(f"in {name}")
    files = node_server("server-filesystem", timeouts=TIMEOUTS, sessions="per-client", expose="direct")
    config = write_config(tmp_path, {"files": files})
    a, b = Host("a", roots=[dirs["a"].as_uri()]), Host("b", roots=[dirs["b"].as_uri()])

    async def allowed(session: ClientSession, directory: Path) -> None:
        with anyio.fail_after(WAIT):  # the server asks for roots after its handshake, on its own time
            while str(directory) not in text(await session.call_tool("files__list_allowed_directories", {})):
                await anyio.sleep(0.2)

    async with two_clients(config, a, b) as (session_a, session_b):
        await allowed(session_a, dirs["a"])
        await allowed(session_b, dirs["b"])
        denied = await session_a.call_tool("files__read_text_file", {"path": str(dirs["b"] / "note.txt")})
        assert denied.is_error and "denied" in text(denied).lower()
        a.roots_given = [dirs["c"].as_uri()]
        await session_a.send_roots_list_changed()
        await allowed(session_a, dirs["c"])
        read = await session_a.call_tool("files__read_text_file", {"path": str(dirs["c"] / "note.txt")})
        assert text(read) == "in c"
        listed_b = text(await session_b.call_tool("files__list_allowed_directories", {}))
        assert str(dirs["b"]) in listed_b and str(dirs["a"]) not in listed_b and str(dirs["c"]) not in listed_b


# ---------------------------------------------------------------- 20.6: log messages


async def test_a_log_message_during_one_clients_call_reaches_only_that_client(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"rogue": rogue()})
    a, b = Host("a"), Host("b")
    async with two_clients(config, a, b) as (session_a, session_b):
        await session_b.call_tool("catalog_list_servers", {})  # b is a known, idle client
        await session_a.call_tool("catalog_call_tool", call("rogue", "log", text="secret of a", seconds=0))
        await session_b.call_tool("catalog_list_servers", {})  # anything for b would have arrived by now
        assert a.logs == ["secret of a"] and b.logs == []
        # both in flight on one shared session: the owner cannot be told, so nobody hears it
        async with anyio.create_task_group() as tg:
            tg.start_soon(session_b.call_tool, "catalog_call_tool", call("rogue", "log", text="of b", seconds=2))
            await anyio.sleep(0.5)
            await session_a.call_tool("catalog_call_tool", call("rogue", "log", text="of a", seconds=0.5))
        assert "of b" not in a.logs and "of a" not in b.logs


async def test_a_clients_logging_level_changes_only_its_own_upstream_sessions(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    config = write_config(tmp_path, {"rogue": rogue("--record", str(record), sessions="per-client")})
    async with two_clients(config, Host("a"), Host("b")) as (session_a, session_b):
        pids = [text(await s.call_tool("catalog_call_tool", call("rogue", "pid"))) for s in (session_a, session_b)]
        await session_a.set_logging_level("error")
        await session_b.call_tool("catalog_list_servers", {})
    noted = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(n["setLevel"], str(n["pid"])) for n in noted] == [("error", pids[0])]  # b's process never heard it


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


async def test_a_tasks_request_goes_to_the_tasks_creator_while_other_clients_calls_are_in_flight(
    tmp_path: Path,
) -> None:
    """One shared stdio session, calls of two clients in flight: the elicitation server-everything sends
    for a task (`_meta` related-task) still reaches exactly the client that created the task."""
    from tests.test_official_servers import TIMEOUTS, everything

    config = write_config(tmp_path, {"everything": {**everything(), "timeouts": TIMEOUTS, "expose": "direct"}})
    a, b = Host("a"), Host("b")
    async with two_clients(config, a, b) as (session_a, session_b), anyio.create_task_group() as tg:
        busy = {"name": "everything__trigger-long-running-operation", "arguments": {"duration": 6, "steps": 3}}
        tg.start_soon(raw_request, session_b, "tools/call", busy)  # b's call stays in flight meanwhile
        created = await raw_request(
            session_a,
            "tools/call",
            {
                "name": "everything__simulate-research-query",
                "arguments": {"topic": "bats", "ambiguous": True},
                "task": {"ttl": 60000},
            },
        )
        with anyio.fail_after(WAIT):
            result = await raw_request(session_a, "tasks/result", {"taskId": created["task"]["taskId"]})
        assert a.elicited and b.elicited == []
        assert "a" in json.dumps(result) and "elicitation unavailable" not in json.dumps(result)
        tg.cancel_scope.cancel()  # b's call has served its purpose


def test_the_same_task_id_minted_for_two_clients_stays_each_ones() -> None:
    """Sessions per client: one upstream may give two clients the same task id."""
    tasks = TaskRouter()
    a, b = object(), object()
    tasks.remember("up", {"task": {"taskId": "1"}}, a)
    tasks.remember("up", {"task": {"taskId": "1"}}, b)
    tasks.remember("other", {"task": {"taskId": "1"}}, a)
    assert tasks.server_for("1", a) == "other" and tasks.server_for("1", b) == "up"
    assert tasks.server_for("1", object()) is None and tasks.server_for("2", a) is None
    assert tasks.creators("1", "up") == [a, b] and tasks.creators("1", "other") == [a]
    for _ in range(20):  # bounded per id
        tasks.remember("up", {"task": {"taskId": "1"}}, object())
    assert len(tasks.creators("1", "up")) + len(tasks.creators("1", "other")) <= 8


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


@given(
    st.dictionaries(
        st.sampled_from(["fs", "git", "evil", "docs"]),
        st.tuples(st.sets(st.sampled_from(["x://1", "x://2", "y://1"])), st.sets(st.sampled_from(["x://{n}"]))),
        min_size=1,
    ),
    st.lists(
        st.tuples(st.sampled_from(["fs", "git", "evil", "docs"]), st.sampled_from(["x://1", "x://2", "y://1", "z://1"]))
    ),
)
def test_a_returned_link_never_takes_a_uri_from_the_upstreams_that_claim_it(
    claims: dict[str, tuple[set[str], set[str]]], links: list[tuple[str, str]]
) -> None:
    """Whatever links upstreams return, a listed or templated URI resolves to one of its claimants."""
    router = ResourceRouter(sorted(claims))
    router.rebuild({s: catalog(s, resources=sorted(r), templates=sorted(t)) for s, (r, t) in claims.items()})
    for server, uri in links:
        router.remember(server, {"content": [{"type": "resource_link", "uri": uri, "name": "l"}]})
    for uri in ("x://1", "x://2", "y://1", "z://1"):
        listing = [s for s, (r, _t) in claims.items() if uri in r]
        templating = [s for s, (_r, t) in claims.items() if t and uri.startswith("x://")]
        claimants = listing or templating
        last_link = next((s for s, u in reversed(links) if u == uri), None)
        expected = claimants if claimants else ([last_link] if last_link else [None])
        assert router.resolve(uri) in expected


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
            await anyio.sleep(0.5)  # more arrive meanwhile: all refused, none more reaches the client
            assert host.in_flight == MAX_RELAYED_PER_CLIENT
            host.release.set()
        # The bound is on requests in flight, not on the total: on a loaded machine some of the n
        # reach the aggregator only after the release, when there is room again, and are relayed.
        summary = flooded[0]
        assert summary["results"] == len(host.sampled) >= MAX_RELAYED_PER_CLIENT
        assert summary["results"] + summary["errors"] == n and summary["errors"] > 0
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


# ---------------------------------------------------------------- per-client sessions under faults


async def test_a_crash_of_one_clients_process_harms_nobody_else(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream(sessions="per-client")})
    async with two_clients(config, Host("a"), Host("b")) as (session_a, session_b):

        async def pid(session: ClientSession) -> str:
            return text(await session.call_tool("catalog_call_tool", call("kit", "pid")))

        pid_a, pid_b = await pid(session_a), await pid(session_b)
        crashed = await session_a.call_tool("catalog_call_tool", call("kit", "crash"))
        assert crashed.is_error and "session ended" in text(crashed)
        assert await pid(session_b) == pid_b  # b's process and the shared one never noticed
        servers = structured(await session_b.call_tool("catalog_list_servers", {}))["servers"]
        assert servers[0]["state"] == "ready"
        assert await pid(session_a) not in (pid_a, pid_b)  # a's next request opens a new process


async def test_a_client_session_that_cannot_start_is_a_clear_error(tmp_path: Path) -> None:
    marker = tmp_path / "started-once"
    script = tmp_path / "once.sh"  # the first start works (the shared session); every later one fails
    script.write_text(
        f'#!/bin/sh\nif [ -e "{marker}" ]; then echo "no second start" >&2; exit 1; fi\n'
        f'touch "{marker}"\nexec "{sys.executable}" "{ROOT / "examples" / "testkit.py"}"\n'
    )
    script.chmod(0o755)
    config = write_config(tmp_path, {"kit": {"command": str(script), "sessions": "per-client"}})
    async with aggregator_client(config) as session:
        refused = await session.call_tool("catalog_call_tool", call("kit", "echo", message="x"))
        assert refused.is_error and "could not start a session" in text(refused)
        listed = structured(await session.call_tool("catalog_list_tools", {"server": "kit"}))
        assert "echo" in {item["tool"] for item in listed["items"]}  # the shared session serves on


async def test_http_and_sse_upstreams_serve_each_client_on_its_own_session(tmp_path: Path) -> None:
    toolbox = ROOT / "examples" / "toolbox.py"
    for transport, path in (("streamable-http", "/mcp"), ("sse", "/sse")):
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, str(toolbox), transport, "--host", "127.0.0.1", "--port", str(port)],
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_port(port, proc)
            upstream = {"url": f"http://127.0.0.1:{port}{path}", "transport": "sse" if path == "/sse" else "http"}
            config = write_config(tmp_path, {"box": upstream})
            async with two_clients(config, Host("a"), Host("b")) as sessions:
                for tag, session in zip("ab", sessions, strict=True):
                    result = await session.call_tool("catalog_call_tool", call("box", "slugify", text=f"Hi {tag}!"))
                    assert text(result) == f"hi-{tag}", transport
        finally:
            proc.terminate()
            proc.wait(timeout=10)


async def test_a_clients_own_process_ends_with_the_aggregator(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream(sessions="per-client")})
    async with aggregator_client(config) as session:
        pid = int(text(await session.call_tool("catalog_call_tool", call("kit", "pid"))))
        assert alive(pid)
    with anyio.fail_after(WAIT):  # stdin closed: the aggregator stops, and every process it started
        while alive(pid):
            await anyio.sleep(0.05)
