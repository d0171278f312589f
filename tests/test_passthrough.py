"""Prompts, resources, `_meta`, instructions and direct tools through a real `aggregator serve` (DESIGN §2.6).

Upstreams are testkit subprocesses (stdlib only, fast); the official servers, server→client
requests and tasks are in test_passthrough_everything.py.
"""

from __future__ import annotations

import json
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client, ClientSession
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.server.connection import Connection
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from aggregator.config import parse_config
from aggregator.proxy.passthrough import Passthrough
from aggregator.proxy.relay import Clients
from aggregator.sdk import raw_request
from aggregator.upstream.pool import UpstreamPool
from aggregator.upstream.session import RELAYABLE_CAPABILITIES, Via
from tests.conftest import aggregator_client, aggregator_env, kit_upstream, structured, write_config
from tests.test_serve_http import http_aggregator


async def test_prompts_and_resources_of_two_upstreams(tmp_path: Path) -> None:
    # both list testkit://readme and testkit://status: reads go to the upstream first by name
    config = write_config(tmp_path, {"zkit": kit_upstream("--tag", "z"), "akit": kit_upstream("--tag", "a")})
    async with aggregator_client(config) as session:
        assert (await session.list_prompts()).prompts == []  # answers at once and starts nothing
        servers = structured(await session.call_tool("catalog_list_servers", {}))["servers"]
        assert {s["state"] for s in servers} == {"configured"}

        await session.call_tool("catalog_search_tools", {"query": "echo", "load": True})
        prompts = {p.name: p for p in (await session.list_prompts()).prompts}
        assert set(prompts) == {"akit__greet", "akit__review_code", "zkit__greet", "zkit__review_code"}
        assert [a.name for a in prompts["zkit__review_code"].arguments or []] == ["code", "language"]

        got = await session.get_prompt("zkit__greet", {"name": "Ada"})
        assert got.messages[0].content.text == "Say hello to Ada in one friendly sentence."  # type: ignore[union-attr]
        with pytest.raises(MCPError) as missing:
            await session.get_prompt("zkit__greet", {})
        assert "Missing required argument" in missing.value.message  # the upstream's own error, untouched
        with pytest.raises(MCPError, match="unknown prompt"):
            await session.get_prompt("greet", {})

        resources = (await session.list_resources()).resources
        owners = [(str(r.uri), (r.meta or {}).get("aggregator/upstream")) for r in resources]
        assert ("testkit://status", "zkit") in owners and ("testkit://status", "akit") in owners
        status = json.loads((await session.read_resource("testkit://status")).contents[0].text)  # type: ignore[union-attr]
        apid = (await session.call_tool("catalog_call_tool", {"server": "akit", "tool": "pid"})).content[0].text  # type: ignore[union-attr]
        assert str(status["pid"]) == apid

        templates = {t.uri_template for t in (await session.list_resource_templates()).resource_templates}
        assert templates == {"testkit://items/{item_id}", "testkit://logs/{date}/{level}"}
        item = await session.read_resource("testkit://items/7")
        assert item.contents[0].text == "item 7"  # type: ignore[union-attr]
        with pytest.raises(MCPError) as unknown:
            await session.read_resource("nowhere://x")
        assert unknown.value.code == -32002


async def test_prompts_list_changed_when_an_upstream_first_lists(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream()})
    heard: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ServerNotification | types.PromptListChangedNotification):
            heard.append(getattr(message, "method", ""))

    async with aggregator_client(config, message_handler=on_message) as session:
        await session.call_tool("catalog_list_tools", {"server": "kit"})
        with anyio.fail_after(20):
            while not {"notifications/prompts/list_changed", "notifications/resources/list_changed"} <= set(heard):
                await anyio.sleep(0.05)


async def test_request_meta_keys_reach_the_upstream_beside_our_progress_token(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream(expose="direct")})
    async with aggregator_client(config) as session:
        # a direct tool called before any tools/list: the aggregator starts the direct upstream to find it
        direct = await raw_request(session, "tools/call", {"name": "kit__meta", "_meta": {"trace": "t-1", "x/y": [1]}})
        meta = direct["structuredContent"]["meta"]
        assert meta["trace"] == "t-1" and meta["x/y"] == [1] and "progressToken" in meta
        via_catalog = await raw_request(
            session,
            "tools/call",
            {"name": "catalog_call_tool", "arguments": {"server": "kit", "tool": "meta"}, "_meta": {"k": "v"}},
        )
        assert via_catalog["structuredContent"]["meta"]["k"] == "v"


async def test_instructions_say_what_is_exposed(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream(expose="direct"), "hidden": kit_upstream()})
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "aggregator", "serve", "--config", str(config)], env=aggregator_env()
    )
    async with Client(params, mode="legacy") as client:
        text = client.session.initialize_result.instructions  # type: ignore[union-attr]
        assert "The tools of hidden are not listed one by one" in text
        assert "The tools of kit are listed directly" in text
        await client.call_tool("catalog_list_tools", {"server": "kit"})
        servers = structured(await client.call_tool("catalog_list_servers", {}))["servers"]
        said = {s["name"]: s["instructions"] for s in servers}
        assert said == {"kit": "Scriptable MCP test server; see the tool descriptions.", "hidden": None}


async def test_modern_client_gets_prompts_and_resources(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream(start="eager")})
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "aggregator", "serve", "--config", str(config)], env=aggregator_env()
    )
    async with Client(params, mode="auto") as client:
        await client.call_tool("catalog_list_tools", {"server": "kit"})
        names = {p.name for p in (await client.list_prompts()).prompts}
        assert "kit__greet" in names
        got = await client.get_prompt("kit__greet", {"name": "Grace"})
        assert "Grace" in got.messages[0].content.text  # type: ignore[union-attr]
        read = await client.read_resource("testkit://readme")
        assert read.contents[0].text.startswith("# testkit")  # type: ignore[union-attr]


async def test_requests_no_client_can_answer_get_config_roots_or_a_clear_error() -> None:
    config = parse_config(
        'upstreams: {kit: {command: x, roots: ["${APP}", "https://example.com/r"]}, bare: {command: y}}',
        "/cfg/aggregator.yaml",
        environ={"APP": "/srv/app"},
    )
    assert config.upstreams["kit"].roots == ["/srv/app", "https://example.com/r"]
    async with UpstreamPool.running(config) as pool:
        relay = Passthrough(pool, Clients(), InMemorySubscriptionBus()).relay
        assert pool.downstream is relay
        roots = await relay.relay_request("kit", "roots/list", None, Via())
        assert roots == {
            "roots": [{"uri": "file:///srv/app", "name": "app"}, {"uri": "https://example.com/r", "name": "r"}]
        }
        assert await relay.relay_request("bare", "ping", None, Via()) == {}
        for method in ("roots/list", "sampling/createMessage"):
            with pytest.raises(MCPError, match="cannot tell which client") as refused:
                await relay.relay_request("bare", method, {}, Via())
            assert refused.value.code == types.INVALID_REQUEST
        # before any client is known, an upstream is declared everything the aggregator can relay
        declared = relay.client_capabilities()
        assert declared.sampling is not None and declared.roots is not None and declared.elicitation is not None


def ask(server: str, method: str, params: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """catalog_call_tool arguments for testkit's `ask`: the upstream sends `method` to its client."""
    return {"server": server, "tool": "ask", "arguments": {"method": method, "params": params or {}, **extra}}


SAMPLE = {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 5}


async def test_upstream_requests_reach_the_calling_client_or_fail_clearly(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream()})
    asked: list[str] = []

    async def sampling(ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append(params.messages[0].content.text)  # type: ignore[union-attr]
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="ok"), model="m")

    async def roots(ctx: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri="file:///work")])  # type: ignore[arg-type]

    async with aggregator_client(config, sampling_callback=sampling, list_roots_callback=roots) as session:
        sampled = structured(await session.call_tool("catalog_call_tool", ask("kit", "sampling/createMessage", SAMPLE)))
        assert sampled["result"]["content"]["text"] == "ok" and asked == ["hi"]
        listed = structured(await session.call_tool("catalog_call_tool", ask("kit", "roots/list")))
        assert listed["result"]["roots"] == [{"uri": "file:///work"}]
        # elicitation was not declared: the upstream hears a clear JSON-RPC error, the client nothing
        refused = structured(await session.call_tool("catalog_call_tool", ask("kit", "elicitation/create", {})))
        assert refused["error"]["code"] == types.INVALID_REQUEST
        assert "did not declare elicitation" in refused["error"]["message"]
        unknown = structured(await session.call_tool("catalog_call_tool", ask("kit", "no/such/method")))
        assert unknown["error"]["code"] == types.METHOD_NOT_FOUND  # the client's own answer, relayed


async def test_relayed_request_is_cancelled_with_the_upstream_and_bounded_by_the_timeout(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream(timeouts={"call": 3})})
    cancelled = anyio.Event()

    async def sampling(ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        try:
            await anyio.sleep(300)
        finally:
            cancelled.set()
        raise AssertionError("never answered")

    async with aggregator_client(config, sampling_callback=sampling) as session:
        # the upstream gives up on its request: the client's handler is cancelled too
        result = await session.call_tool(
            "catalog_call_tool", ask("kit", "sampling/createMessage", SAMPLE, cancel_after=1)
        )
        assert result.content[0].text == "cancelled"  # type: ignore[union-attr]
        with anyio.fail_after(20):
            await cancelled.wait()
        # the upstream waits forever: the call timeout bounds both the relay and the call
        cancelled = anyio.Event()
        with anyio.fail_after(30):
            timed_out = await session.call_tool("catalog_call_tool", ask("kit", "sampling/createMessage", SAMPLE))
            await cancelled.wait()
        assert timed_out.is_error


async def test_modern_client_cannot_be_asked_and_the_upstream_hears_why(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream()})
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "aggregator", "serve", "--config", str(config)], env=aggregator_env()
    )
    async with Client(params, mode="auto") as client:
        result = await client.call_tool("catalog_call_tool", ask("kit", "sampling/createMessage", SAMPLE))
        assert "2026-07-28" in result.structured_content["error"]["message"]  # type: ignore[index]


async def test_two_http_clients_never_answer_each_others_requests(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream()})
    in_a, release_a = anyio.Event(), anyio.Event()

    def sampler(tag: str) -> Any:
        async def sampling(ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
            if tag == "a":
                in_a.set()
                await release_a.wait()
            return types.CreateMessageResult(
                role="assistant", content=types.TextContent(type="text", text=f"from {tag}"), model="m"
            )

        return sampling

    with http_aggregator(config) as url:
        async with AsyncExitStack() as stack:
            sessions = {}
            for tag in ("a", "b"):
                http = await stack.enter_async_context(create_mcp_http_client())
                read, write = await stack.enter_async_context(streamable_http_client(url, http_client=http))
                sessions[tag] = await stack.enter_async_context(
                    ClientSession(read, write, sampling_callback=sampler(tag))
                )
                await sessions[tag].initialize()

            async def sample(tag: str) -> dict[str, Any]:
                return structured(
                    await sessions[tag].call_tool("catalog_call_tool", ask("kit", "sampling/createMessage", SAMPLE))
                )

            with anyio.fail_after(60):
                assert (await sample("b"))["result"]["content"]["text"] == "from b"  # one call in flight: its client
                answers: dict[str, Any] = {}

                async def run_a() -> None:
                    answers["a"] = await sample("a")

                async with anyio.create_task_group() as tg:
                    tg.start_soon(run_a)
                    await in_a.wait()  # a's call is in flight, its sampling request waits in a's hands
                    answers["b"] = await sample("b")  # b's request cannot be told from a's: refused
                    release_a.set()
            assert answers["a"]["result"]["content"]["text"] == "from a"
            assert "cannot tell which client" in answers["b"]["error"]["message"]


def test_upstreams_are_declared_the_union_of_initialized_clients() -> None:
    clients = Clients()
    connections = []

    def connect(version: str, caps: dict[str, Any] | None) -> None:
        connection = Connection(object(), protocol_version=version)  # type: ignore[arg-type]  # never sends here
        if caps is not None:
            connection.client_capabilities = types.ClientCapabilities.model_validate(caps)
        connections.append(connection)  # the registry holds clients weakly
        clients.track(SimpleNamespace(session=SimpleNamespace(_connection=connection)))  # type: ignore[arg-type]

    assert clients.capabilities() == RELAYABLE_CAPABILITIES  # nobody yet: all the aggregator can relay
    connect("2025-11-25", None)  # mid-handshake: not known yet
    assert clients.capabilities() == RELAYABLE_CAPABILITIES
    connect("2025-11-25", {"sampling": {}})
    connect("2025-06-18", {"elicitation": {"form": {}}, "roots": {"listChanged": True}})
    connect("2026-07-28", {"sampling": {}, "experimental": {"x": {}}})  # cannot be asked: adds nothing
    union = clients.capabilities().model_dump(by_alias=True, exclude_none=True)
    assert union == {"sampling": {}, "elicitation": {"form": {}}, "roots": {"listChanged": True}}
    assert len(clients.legacy()) == 3


async def test_a_misbehaving_upstreams_requests_get_errors_and_harm_nothing(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream()})

    async def sampling(ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="ok"), model="m")

    async with aggregator_client(config, sampling_callback=sampling) as session:
        garbage = [
            ("sampling/createMessage", {"messages": "not a list"}),  # the client's own validation answers
            ("sampling/createMessage", {"maxTokens": -1, "messages": [{"role": "robot"}]}),
            ("roots/list", {}),  # not declared by this client
            ("elicitation/create", {"mode": "url", "url": 5}),
            ("tools/call", {"name": "x"}),  # a client method, sent the wrong way round
        ]
        for method, params in garbage:
            answer = structured(await session.call_tool("catalog_call_tool", ask("kit", method, params)))
            assert set(answer) == {"error"} and isinstance(answer["error"]["code"], int), (method, answer)
        burst: list[dict[str, Any]] = []

        async def one() -> None:
            burst.append(
                structured(await session.call_tool("catalog_call_tool", ask("kit", "sampling/createMessage", SAMPLE)))
            )

        async with anyio.create_task_group() as tg:  # many requests of one client at once: all its own
            for _ in range(20):
                tg.start_soon(one)
        assert [b["result"]["content"]["text"] for b in burst] == ["ok"] * 20
        echo = await session.call_tool(
            "catalog_call_tool", {"server": "kit", "tool": "echo", "arguments": {"message": "alive"}}
        )
        assert echo.content[0].text == "alive"  # type: ignore[union-attr]


async def test_both_eras_over_http_get_prompts_and_resources(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream(start="eager")})
    with http_aggregator(config) as url:
        for mode in ("legacy", "auto"):  # auto: the 2026-07-28 era
            async with Client(url, mode=mode) as client:  # type: ignore[arg-type]
                await client.call_tool("catalog_list_tools", {"server": "kit"})
                got = await client.get_prompt("kit__greet", {"name": mode})
                assert mode in got.messages[0].content.text  # type: ignore[union-attr]
                read = await client.read_resource("testkit://items/9")
                assert read.contents[0].text == "item 9"  # type: ignore[union-attr]
