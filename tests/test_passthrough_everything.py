"""The whole protocol through the aggregator, with the official reference servers behind it (DESIGN §2.6).

server-everything exercises every feature: prompts, resources (listed, templated, linked from a
tool result), completions, logging, sampling, elicitation, roots and tasks; server-filesystem
started without a directory takes its allowed directories from the client's roots. Each result is
compared with what the same server answers a direct client. Skipped unless `.ci/install-servers`
has installed the servers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from aggregator.sdk import raw_request
from tests.conftest import ROOT, aggregator_client, aggregator_env, structured, write_config
from tests.test_official_servers import NODE_DIR, TIMEOUTS, call, direct_session, everything, node_server
from tests.test_serve_http import http_aggregator

WAIT = 60  # generous: npx-launched node servers on two busy cores


def everything_config(tmp_path: Path, **extra: Any) -> Path:
    return write_config(tmp_path, {"everything": {**everything(), "timeouts": TIMEOUTS, **extra}})


def text(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


class Host:
    """A client that answers sampling, elicitation and roots requests, and records them."""

    def __init__(self, tag: str = "host", roots: list[str] | None = None) -> None:
        self.tag = tag
        self.roots = roots or ["file:///tmp"]
        self.sampled: list[str] = []
        self.elicited: list[types.ElicitRequestParams] = []
        self.logs: list[types.LoggingMessageNotificationParams] = []

    async def sampling(self, ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        self.sampled.append(params.messages[0].content.text)  # type: ignore[union-attr]
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text=f"answer from {self.tag}"), model="test"
        )

    async def elicitation(self, ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.elicited.append(params)
        if isinstance(params, types.ElicitRequestURLParams):
            return types.ElicitResult(action="accept")
        return types.ElicitResult(action="accept", content={"name": f"name from {self.tag}"})

    async def list_roots(self, ctx: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=uri) for uri in self.roots])  # type: ignore[arg-type]

    async def logging(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(params)

    def callbacks(self) -> dict[str, Any]:
        return {
            "sampling_callback": self.sampling,
            "elicitation_callback": self.elicitation,
            "list_roots_callback": self.list_roots,
            "logging_callback": self.logging,
        }


async def test_prompts_resources_completions_logging_instructions(tmp_path: Path) -> None:
    host = Host()
    async with (
        aggregator_client(everything_config(tmp_path), **host.callbacks()) as session,
        direct_session(node_server("server-everything", "stdio")) as upstream,
    ):
        await session.call_tool("catalog_list_tools", {"server": "everything"})
        # prompts: every prompt of the server, named <server>__<prompt>, answered as the server answers
        direct_prompts = (await upstream.list_prompts()).prompts
        prompts = (await session.list_prompts()).prompts
        assert sorted(p.name for p in prompts) == sorted(f"everything__{p.name}" for p in direct_prompts)
        args = {"city": "Paris", "state": "FR"}
        got = await session.get_prompt("everything__args-prompt", args)
        assert got.messages == (await upstream.get_prompt("args-prompt", args)).messages

        # resources: a listed one, a templated one (blob) and the link a tool returned
        listed = (await session.list_resources()).resources
        assert {str(r.uri) for r in listed} == {str(r.uri) for r in (await upstream.list_resources()).resources}
        first = str(listed[0].uri)
        assert (await session.read_resource(first)).contents == (await upstream.read_resource(first)).contents
        templates = {t.uri_template for t in (await session.list_resource_templates()).resource_templates}
        assert "demo://resource/dynamic/blob/{resourceId}" in templates
        blob = (await session.read_resource("demo://resource/dynamic/blob/3")).contents[0]
        assert isinstance(blob, types.BlobResourceContents) and blob.blob
        gz = await call(
            session, "everything", "gzip-file-as-resource", name="n.gz", data="data:,hello", outputType="resourceLink"
        )
        link = next(block for block in gz.content if block.type == "resource_link")
        read = (await session.read_resource(link.uri)).contents[0]
        assert isinstance(read, types.BlobResourceContents) and read.mime_type == "application/gzip"

        # completion routes by the prompt reference
        ref = types.PromptReference(type="ref/prompt", name="everything__completable-prompt")
        completed = await session.complete(ref, {"name": "department", "value": "E"})
        direct_ref = types.PromptReference(type="ref/prompt", name="completable-prompt")
        assert (
            completed.completion.values
            == (await upstream.complete(direct_ref, {"name": "department", "value": "E"})).completion.values
        )
        template = types.ResourceTemplateReference(type="ref/resource", uri="demo://resource/dynamic/text/{resourceId}")
        argument = {"name": "resourceId", "value": "1"}
        assert (await session.complete(template, argument)).completion == (
            await upstream.complete(template, argument)
        ).completion

        # logging: the level reaches the upstream; its messages reach us named after it
        await session.set_logging_level("debug")
        await call(session, "everything", "toggle-simulated-logging")
        with anyio.fail_after(WAIT):
            while len([m for m in host.logs if m.data != host.logs[0].data]) < 1:
                await anyio.sleep(0.1)
        assert all(m.logger and m.logger.split("/")[0] == "everything" for m in host.logs)
        await call(session, "everything", "toggle-simulated-logging")

        # instructions, as the server gave them
        servers = structured(await session.call_tool("catalog_list_servers", {}))["servers"]
        assert servers[0]["instructions"] == upstream.initialize_result.instructions  # type: ignore[union-attr]


async def test_resource_subscription_updates_reach_the_subscriber(tmp_path: Path) -> None:
    updated: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updated.append(str(message.params.uri))

    async with aggregator_client(everything_config(tmp_path), message_handler=on_message) as session:
        await session.call_tool("catalog_list_tools", {"server": "everything"})
        uri = str((await session.list_resources()).resources[0].uri)
        await session.subscribe_resource(uri)
        await call(session, "everything", "toggle-subscriber-updates")
        with anyio.fail_after(WAIT):
            while uri not in updated:
                await anyio.sleep(0.1)
        await session.unsubscribe_resource(uri)
        await call(session, "everything", "toggle-subscriber-updates")


async def test_sampling_elicitation_and_roots_reach_the_client(tmp_path: Path) -> None:
    host = Host(roots=["file:///srv/project"])
    async with aggregator_client(everything_config(tmp_path), **host.callbacks()) as session:
        listed = structured(await session.call_tool("catalog_list_tools", {"server": "everything", "limit": 200}))
        names = {item["tool"] for item in listed["items"]}
        assert {"trigger-sampling-request", "trigger-elicitation-request", "get-roots-list"} <= names  # 17 of 17

        sampled = await call(session, "everything", "trigger-sampling-request", prompt="tell a joke", maxTokens=20)
        assert not sampled.is_error and "answer from host" in text(sampled)
        assert host.sampled == ["Resource trigger-sampling-request context: tell a joke"]

        elicited = await call(session, "everything", "trigger-elicitation-request")
        assert "name from host" in text(elicited)
        assert host.elicited[-1].mode == "form"

        url = await call(
            session,
            "everything",
            "trigger-url-elicitation",
            url="https://example.com/x",
            message="go",
            elicitationId="e1",
        )
        assert not url.is_error
        assert isinstance(host.elicited[-1], types.ElicitRequestURLParams)

        roots = await call(session, "everything", "get-roots-list")
        assert "file:///srv/project" in text(roots)


async def test_task_required_tool_runs_and_cancels(tmp_path: Path) -> None:
    async with aggregator_client(everything_config(tmp_path, expose="direct")) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert tools["everything__simulate-research-query"].execution.task_support == "required"  # type: ignore[union-attr]

        # through catalog_call_tool: created, polled to completion, result fetched
        created = await raw_request(
            session,
            "tools/call",
            {
                "name": "catalog_call_tool",
                "arguments": {
                    "server": "everything",
                    "tool": "simulate-research-query",
                    "arguments": {"topic": "owls"},
                },
                "task": {"ttl": 60000},
            },
        )
        task_id = created["task"]["taskId"]
        with anyio.fail_after(WAIT):
            while (status := await raw_request(session, "tasks/get", {"taskId": task_id}))["status"] == "working":
                await anyio.sleep(0.3)
        assert status["status"] == "completed"
        result = await raw_request(session, "tasks/result", {"taskId": task_id})
        assert "owls" in result["content"][0]["text"]
        listed = await raw_request(session, "tasks/list", None)
        assert task_id in {task["taskId"] for task in listed["tasks"]}

        # as a direct tool, and cancelled
        created = await raw_request(
            session,
            "tools/call",
            {"name": "everything__simulate-research-query", "arguments": {"topic": "bats"}, "task": {"ttl": 60000}},
        )
        cancelled = await raw_request(session, "tasks/cancel", {"taskId": created["task"]["taskId"]})
        assert cancelled["status"] == "cancelled"


async def test_filesystem_allows_what_the_client_roots_allow(tmp_path: Path) -> None:
    inside, later = tmp_path / "inside", tmp_path / "later"
    for directory in (inside, later):
        directory.mkdir()
        (directory / "note.txt").write_text(f"in {directory.name}")
    host = Host(roots=[inside.as_uri()])
    config = write_config(tmp_path, {"files": node_server("server-filesystem", timeouts=TIMEOUTS)})  # no directory
    async with aggregator_client(config, **host.callbacks()) as session:
        # the server asks for roots after its handshake, on its own time (directly connected, too)
        with anyio.fail_after(WAIT):
            while str(inside) not in text(await call(session, "files", "list_allowed_directories")):
                await anyio.sleep(0.2)
        read = await call(session, "files", "read_text_file", path=str(inside / "note.txt"))
        assert not read.is_error and text(read) == "in inside"
        denied = await call(session, "files", "read_text_file", path=str(later / "note.txt"))
        assert denied.is_error and "denied" in text(denied).lower()

        host.roots = [later.as_uri()]
        await session.send_roots_list_changed()
        with anyio.fail_after(WAIT):
            while str(later) not in text(await call(session, "files", "list_allowed_directories")):
                await anyio.sleep(0.2)
        assert text(await call(session, "files", "read_text_file", path=str(later / "note.txt"))) == "in later"


async def test_two_http_clients_each_answer_their_own_sampling(tmp_path: Path) -> None:
    hosts = {tag: Host(tag) for tag in ("a", "b", "plain")}
    with http_aggregator(everything_config(tmp_path)) as url:
        async with AsyncExitStack() as stack:
            sessions: dict[str, ClientSession] = {}
            for tag, host in hosts.items():
                http = await stack.enter_async_context(create_mcp_http_client())
                read, write = await stack.enter_async_context(streamable_http_client(url, http_client=http))
                callbacks = host.callbacks() if tag != "plain" else {}  # "plain" declares nothing
                sessions[tag] = await stack.enter_async_context(ClientSession(read, write, **callbacks))
                await sessions[tag].initialize()

            async def sample(tag: str, i: int) -> str:
                return text(await call(sessions[tag], "everything", "trigger-sampling-request", prompt=f"{tag}-{i}"))

            with anyio.fail_after(WAIT * 3):
                # one after the other, all connected: each request reaches the client whose call it serves
                for i in range(2):
                    for tag in ("a", "b"):
                        assert f"answer from {tag}" in await sample(tag, i)
                assert "did not declare sampling" in await sample("plain", 0)  # a clear error instead

                # at the same time: answered by the right client, or refused; never the other client's answer
                answers: list[tuple[str, str]] = []

                async def run(tag: str, i: int) -> None:
                    answers.append((tag, await sample(tag, 10 + i)))

                async with anyio.create_task_group() as tg:
                    for i in range(3):
                        tg.start_soon(run, "a", i)
                        tg.start_soon(run, "b", i)
        for tag, answer in answers:
            assert "answer from" not in answer or f"answer from {tag}" in answer, answer
        for tag in ("a", "b"):
            assert all(prompt.split(": ")[-1].startswith(f"{tag}-") for prompt in hosts[tag].sampled)
        assert hosts["plain"].sampled == []


HTTP_UPSTREAM_SCRIPT = """
import json, os, signal, socket, subprocess, sys, time
import anyio
import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

node_dir, config = sys.argv[1], sys.argv[2]
# its own process group: npx leaves node running when only npx itself is ended
server = subprocess.Popen(["npx", "--no", "mcp-server-everything", "streamableHttp"], cwd=node_dir,
                          env={**os.environ, "PORT": "3917"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          start_new_session=True)
for _ in range(600):
    try:
        socket.create_connection(("127.0.0.1", 3917), timeout=0.2).close()
        break
    except OSError:
        time.sleep(0.1)

async def sampling(ctx, params):
    content = types.TextContent(type="text", text="sampled over http")
    return types.CreateMessageResult(role="assistant", content=content, model="m")

async def roots(ctx):
    return types.ListRootsResult(roots=[types.Root(uri="file:///over/http")])

async def main():
    params = StdioServerParameters(  # the whole environment: the test session's private user dirs
        command=sys.executable, args=["-m", "aggregator", "serve", "--config", config], env=dict(os.environ)
    )
    async with stdio_client(params) as (r, w), ClientSession(
        r, w, sampling_callback=sampling, list_roots_callback=roots
    ) as session:
        await session.initialize()
        for tool, args in (("trigger-sampling-request", {"prompt": "x", "maxTokens": 5}), ("get-roots-list", {})):
            result = await session.call_tool("catalog_call_tool", {"server": "ev", "tool": tool, "arguments": args})
            print(json.dumps(result.content[0].text))

try:
    anyio.run(main)
finally:
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(10)
"""


def test_requests_of_an_http_upstream_reach_the_client(tmp_path: Path) -> None:
    """server-everything over streamable HTTP, inside a private network namespace (it binds every interface)."""
    everything()  # skips when the npm servers are not installed
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare -n (a private network namespace) is not permitted here")
    config = write_config(tmp_path, {"ev": {"url": "http://127.0.0.1:3917/mcp", "timeouts": TIMEOUTS}})
    script = tmp_path / "drive.py"
    script.write_text(HTTP_UPSTREAM_SCRIPT)
    inner = f"ip link set lo up; exec {sys.executable} {script} {NODE_DIR} {config}"
    done = subprocess.run(
        ["unshare", "-n", "sh", "-c", inner],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env=aggregator_env(),
    )
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(answers) == 2, done.stderr[-2000:]
    assert "sampled over http" in answers[0] and "file:///over/http" in answers[1]
