"""Sign-in offered to the client while serving (URL-mode elicitation, MCP 2025-11-25).

A real `aggregator serve` (stdio, or HTTP with several real clients) in front of the real
authorization server and protected MCP server of `tests/oauth_server.py`. A client that declares
`elicitation: {url: {}}` gets error -32042 with the authorization URL, "opens" it with
`tests/oauth_browser.py` (an HTTP GET that follows the redirects back to the aggregator's loopback
listener), hears `notifications/elicitation/complete` and retries. Nothing of it reaches another
client; a client without the capability gets the `aggregator auth login NAME` message.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import mcp.types as types
import pytest
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from tests.conftest import aggregator_client, aggregator_env, write_config
from tests.test_oauth import BROWSER, AuthServer, server  # noqa: F401  (the fixture)
from tests.test_serve_http import http_aggregator

WAIT = 30
URL_ELICITATION_REQUIRED = -32042


class Host:
    """A client that can open links (`elicitation.url`), or not; records every notification it hears."""

    def __init__(self, opens_links: bool = True) -> None:
        self.opens_links = opens_links
        self.heard: list[Any] = []
        self.completed: list[str] = []
        self.complete = anyio.Event()

    async def elicitation(self, ctx: Any, params: Any) -> types.ElicitResult:
        return types.ElicitResult(action="decline")

    async def on_message(self, message: Any) -> None:
        self.heard.append(message)
        if isinstance(message, types.ElicitCompleteNotification):
            self.completed.append(message.params.elicitation_id)
            self.complete.set()

    def session_args(self) -> dict[str, Any]:
        callbacks: dict[str, Any] = {"message_handler": self.on_message}
        return callbacks | ({"elicitation_callback": self.elicitation} if self.opens_links else {})


def call(tool: str = "echo", **arguments: Any) -> dict[str, Any]:
    return {"server": "remote", "tool": tool, "arguments": arguments or {"text": "served"}}


async def link_of(session: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The one URL elicitation the call is refused with."""
    with pytest.raises(MCPError) as refused:
        await session.call_tool(tool, arguments)
    assert refused.value.code == URL_ELICITATION_REQUIRED, refused.value
    [link] = refused.value.data["elicitations"]  # type: ignore[index]
    assert link["mode"] == "url" and link["elicitationId"] and "remote" in link["message"]
    return dict(link)


async def open_link(url: str) -> None:
    """What the user's click does: GET the authorization URL, follow the redirects to the callback."""
    done = await anyio.run_process([*BROWSER.split(" "), url], check=False)
    assert done.returncode == 0, done.stderr


def redirect_port(url: str) -> int:
    redirect = parse_qs(urlsplit(url).query)["redirect_uri"][0]
    port = urlsplit(redirect).port
    assert port is not None and urlsplit(redirect).hostname == "127.0.0.1"
    return port


def remote(tmp_path: Path, protected: AuthServer, **extra: Any) -> tuple[Path, dict[str, str]]:
    """A config whose one upstream is the protected server, and the environment of its data dir."""
    config = write_config(tmp_path, {"remote": {"url": protected.url} | extra})
    return config, aggregator_env(AGGREGATOR_DATA_DIR=str(tmp_path / "data"))


def text(result: Any) -> str:
    return str(result.content[0].text)


async def test_a_client_that_opens_links_signs_in_through_one_and_retries(
    server: AuthServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    config, env = remote(tmp_path, server)
    env["AGGREGATOR_LOG_FILE"] = str(tmp_path / "a.log")
    host = Host()
    errlog = (tmp_path / "serve.err").open("w")
    async with aggregator_client(config, env=env, errlog=errlog, **host.session_args()) as client:
        # The first catalog load needs the sign-in: the link comes at once, nobody is waited for.
        with anyio.fail_after(WAIT):
            link = await link_of(client, "catalog_list_tools", {"server": "remote"})
        again = await link_of(client, "catalog_call_tool", call())  # asking again: the same sign-in
        assert (again["url"], again["elicitationId"]) == (link["url"], link["elicitationId"])
        assert server.stats()["authorization_code"] == 0

        await open_link(link["url"])
        with anyio.fail_after(WAIT):
            await host.complete.wait()
        assert host.completed == [link["elicitationId"]]
        answered = await client.call_tool("catalog_call_tool", call())
        assert not answered.is_error and text(answered) == "served"
        assert server.stats()["authorization_code"] == 1
    store = json.loads((tmp_path / "data" / "oauth-tokens.json").read_text())
    secret = store["remote"]["tokens"]["access_token"]
    assert secret not in (tmp_path / "serve.err").read_text() + (tmp_path / "a.log").read_text()


async def test_a_client_without_the_capability_gets_the_command(
    server: AuthServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    config, env = remote(tmp_path, server)
    host = Host(opens_links=False)
    async with aggregator_client(config, env=env, errlog=(tmp_path / "err").open("w"), **host.session_args()) as c:
        with anyio.fail_after(WAIT):
            refused = await c.call_tool("catalog_call_tool", call())
        assert refused.is_error and "sign-in needed: run `aggregator auth login remote`" in text(refused)
        assert not any(isinstance(m, types.ElicitCompleteNotification) for m in host.heard)


@asynccontextmanager
async def http_clients(config: Path, env: dict[str, str], *hosts: Host) -> AsyncIterator[tuple[str, list[Any]]]:
    """(the URL of a real HTTP aggregator, a handshake-era session to it for each host)."""
    with http_aggregator(config, env=env) as url:
        async with AsyncExitStack() as stack:
            sessions = []
            for host in hosts:
                http = await stack.enter_async_context(create_mcp_http_client())
                read, write = await stack.enter_async_context(streamable_http_client(url, http_client=http))
                session = await stack.enter_async_context(ClientSession(read, write, **host.session_args()))
                await session.initialize()
                sessions.append(session)
            yield url, sessions


async def test_several_clients_the_link_and_its_completion_reach_only_the_client_offered_them(
    server: AuthServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    config, env = remote(tmp_path, server)
    a, b, c = Host(), Host(), Host(opens_links=False)
    async with http_clients(config, env, a, b, c) as (url, (client_a, client_b, client_c)):
        with anyio.fail_after(WAIT):
            link = await link_of(client_a, "catalog_call_tool", call())
            busy = await client_b.call_tool("catalog_call_tool", call())  # another client: no link of A's
            plain = await client_c.call_tool("catalog_call_tool", call())
            async with Client(url, mode="auto", elicitation_callback=Host().elicitation) as modern:  # 2026-07-28
                later = await modern.call_tool("catalog_call_tool", call())  # no channel for the completion
        assert busy.is_error and "under way in another client" in text(busy) and "auth login remote" in text(busy)
        assert plain.is_error and "aggregator auth login remote" in text(plain)
        assert later.is_error and "aggregator auth login remote" in text(later)
        assert link["url"] not in text(busy) + text(plain) + text(later)

        await open_link(link["url"])
        with anyio.fail_after(WAIT):
            await a.complete.wait()
        for client in (client_a, client_b, client_c):
            answered = await client.call_tool("catalog_call_tool", call())
            assert text(answered) == "served", answered
        assert a.completed == [link["elicitationId"]] and b.completed == [] and c.completed == []
        heard_elsewhere = json.dumps([m.model_dump(mode="json") for m in [*b.heard, *c.heard]])
        assert link["url"] not in heard_elsewhere and link["elicitationId"] not in heard_elsewhere


async def test_a_direct_tool_known_from_a_snapshot_offers_the_sign_in(
    server: AuthServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    config, env = remote(tmp_path, server, expose="direct")
    for action in ("login", "logout"):  # the login lists it, so its snapshot is written; then forget the tokens
        argv = [sys.executable, "-m", "aggregator", "auth", action, "remote", "--config", str(config)]
        done = await anyio.run_process(argv, env={**env, "AGGREGATOR_BROWSER": BROWSER}, check=False)
        assert done.returncode == 0, done.stderr
    host = Host()
    async with aggregator_client(config, env=env, errlog=(tmp_path / "err").open("w"), **host.session_args()) as c:
        listed = await c.list_tools()
        assert "remote__echo" in [tool.name for tool in listed.tools]
        with anyio.fail_after(WAIT):
            link = await link_of(c, "remote__echo", {"text": "direct"})
        await open_link(link["url"])
        with anyio.fail_after(WAIT):
            await host.complete.wait()
        answered = await c.call_tool("remote__echo", {"text": "direct"})
        assert not answered.is_error and text(answered) == "direct"


@pytest.mark.server_args("--sse")
async def test_an_sse_upstream_signs_in_through_the_link_too(
    server: AuthServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    config, env = remote(tmp_path, server, url=server.url.replace("/mcp", "/sse"), transport="sse")
    host = Host()
    async with aggregator_client(config, env=env, errlog=(tmp_path / "err").open("w"), **host.session_args()) as c:
        with anyio.fail_after(WAIT):
            link = await link_of(c, "catalog_call_tool", call(text="over sse"))
            await open_link(link["url"])
            await host.complete.wait()
        assert text(await c.call_tool("catalog_call_tool", call(text="over sse"))) == "over sse"


async def test_a_sign_in_revoked_while_serving_is_offered_again(
    server: AuthServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    config, env = remote(tmp_path, server)
    host = Host()
    async with aggregator_client(config, env=env, errlog=(tmp_path / "err").open("w"), **host.session_args()) as c:
        for signed_in in (1, 2):
            with anyio.fail_after(WAIT):
                link = await link_of(c, "catalog_call_tool", call())  # first: never signed in; then: revoked
                await open_link(link["url"])
                while len(host.completed) < signed_in:
                    await anyio.sleep(0.05)
            assert host.completed[-1] == link["elicitationId"]
            assert text(await c.call_tool("catalog_call_tool", call())) == "served"
            listed = await c.call_tool("catalog_list_tools", {"server": "remote"})
            assert not listed.is_error, listed
            server.revoke()  # refused from now on, its refresh token too
    assert server.stats()["authorization_code"] == 2


# ---------------------------------------------------------------- the listener's owner and timeout


@asynccontextmanager
async def offers(protected: AuthServer, tmp_path: Path) -> AsyncIterator[tuple[Any, Any, Any, list[str]]]:
    """A running pool (in this process) whose one upstream is the protected server: (pool, its config, the
    `done` to offer with, and the elicitation ids it was told as complete)."""
    from aggregator.config import parse_config
    from aggregator.upstream.pool import UpstreamPool

    config = parse_config(json.dumps({"upstreams": {"remote": {"url": protected.url}}}), "c.yaml", environ={})
    told: list[str] = []

    async def done(elicitation_id: str) -> None:
        told.append(elicitation_id)

    async with UpstreamPool.running(config, tmp_path / "data") as pool:
        yield pool, config.upstreams["remote"], done, told


async def ended(pool: Any) -> None:
    with anyio.fail_after(10):
        while pool.sign_ins.pending("remote") is not None:
            await anyio.sleep(0.05)


async def test_a_sign_in_nobody_finishes_ends_frees_its_port_and_the_next_need_gets_a_new_link(
    server: AuthServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    from aggregator.upstream.oauth_signin import port_is_free

    async with offers(server, tmp_path) as (pool, upstream, done, told):
        pool.sign_ins.timeout = 1.0
        first = await pool.sign_ins.offer(upstream, "client-1", done)
        assert not isinstance(first, str) and first.url is not None
        port = redirect_port(first.url)
        assert not port_is_free(port)  # the listener waits for the browser
        await ended(pool)
        assert port_is_free(port) and not first.signed_in and first.error == "no answer from the browser within 1s"

        second = await pool.sign_ins.offer(upstream, "client-2", done)  # a new link, for whoever asks
        assert not isinstance(second, str) and second.url and second.elicitation_id != first.elicitation_id
        pool.client_gone("client-2")  # its client went away: the sign-in ends with it
        await ended(pool)
        assert port_is_free(redirect_port(second.url)) and second.error == "its client went away" and told == []


async def test_a_forged_callback_ends_the_offered_sign_in_and_tells_nobody(
    server: AuthServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with offers(server, tmp_path) as (pool, upstream, done, told):
        offer = await pool.sign_ins.offer(upstream, "client", done)
        assert not isinstance(offer, str) and offer.url is not None
        browser = await anyio.run_process([*BROWSER.split(" "), "--tamper-state", offer.url], check=False)
        assert browser.returncode == 0, browser.stderr
        await ended(pool)
        assert str(offer.error).startswith("sign-in failed: State parameter mismatch") and not offer.signed_in
        assert told == []
        assert server.stats()["authorization_code"] == 0 and pool.sign_ins.pending("remote") is None
        again = await pool.sign_ins.offer(upstream, "client", done)
        assert not isinstance(again, str) and again.elicitation_id != offer.elicitation_id


async def test_a_search_that_loads_offers_the_link_beside_the_upstream_to_that_client_alone(
    server: AuthServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    """`catalog_search_tools(load: true)` never fails because one upstream needs a sign-in: it lists it under
    `failed`, with the sign-in link for a client that opens links (not `aggregator auth login`, a command the
    user of that client may have no terminal for), and the command for a client that does not."""
    from tests.conftest import kit_upstream, structured

    config = write_config(tmp_path, {"remote": {"url": server.url}, "kit": kit_upstream()})
    env = aggregator_env(AGGREGATOR_DATA_DIR=str(tmp_path / "data"))
    search = {"query": "echo", "load": True}
    host, plain = Host(), Host(opens_links=False)
    async with (
        aggregator_client(config, env=env, errlog=(tmp_path / "err").open("w"), **plain.session_args()) as other,
    ):
        with anyio.fail_after(WAIT):
            found = structured(await other.call_tool("catalog_search_tools", search))
        [failed] = found["failed"]
        assert "aggregator auth login remote" in failed["message"] and "sign_in_url" not in failed
        assert {r["server"] for r in found["results"]} == {"kit"}  # the other upstream is searched all the same
    async with aggregator_client(config, env=env, errlog=(tmp_path / "err").open("w"), **host.session_args()) as c:
        with anyio.fail_after(WAIT):
            found = structured(await c.call_tool("catalog_search_tools", search))
        [failed] = found["failed"]
        assert failed["server"] == "remote" and "auth login" not in failed["message"]
        assert "sign_in_url" in failed["message"] and failed["sign_in_url"].startswith("http://127.0.0.1:")
        assert {r["server"] for r in found["results"]} == {"kit"}
        await open_link(failed["sign_in_url"])
        with anyio.fail_after(WAIT):
            await host.complete.wait()
        assert host.completed == [failed["elicitation_id"]]  # the completion names the link it was given
        again = structured(await c.call_tool("catalog_search_tools", search))
        assert "failed" not in again or again["failed"] == []
        assert ("remote", "echo") in {(r["server"], r["tool"]) for r in again["results"]}


async def test_a_search_link_reaches_only_the_client_that_searched(
    server: AuthServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Two clients that open links search at once through one HTTP aggregator: the first is offered the link;
    the second sees no link of it (a sign-in is under way elsewhere), and only the first hears the completion."""
    from tests.conftest import structured

    config, env = remote(tmp_path, server)
    a, b = Host(), Host()
    search = {"query": "echo", "load": True}
    async with http_clients(config, env, a, b) as (_url, (client_a, client_b)):
        with anyio.fail_after(WAIT):
            [offered] = structured(await client_a.call_tool("catalog_search_tools", search))["failed"]
            [other] = structured(await client_b.call_tool("catalog_search_tools", search))["failed"]
        assert offered["sign_in_url"] and "sign_in_url" not in other
        assert offered["sign_in_url"] not in json.dumps(other) and "under way in another client" in other["message"]
        await open_link(offered["sign_in_url"])
        with anyio.fail_after(WAIT):
            await a.complete.wait()
        await anyio.sleep(0.2)
        assert a.completed == [offered["elicitation_id"]] and b.completed == []
