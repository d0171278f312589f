"""Hypothesis against the downstream wire: anything a client sends over stdio or HTTP, and any
arguments to any of the aggregator's own tools, gets an answer, never a traceback or a hang.

One long-lived `aggregator serve` per transport for the whole module (not one per example):
the properties are about a session surviving whatever came before, too.
"""

from __future__ import annotations

import itertools
import json
import queue
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.conftest import aggregator_env, kit_upstream, rpc, spawn_raw_aggregator, write_config
from tests.test_http_limits import HEADERS, open_session
from tests.test_serve_http import http_aggregator_process

REPLY_SECONDS = 30  # generous: a missing answer fails the property, it does not hang the suite
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_ids = itertools.count(1_000_000)

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
METHODS = [
    "ping",
    "initialize",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "completion/complete",
    "logging/setLevel",
    "notifications/initialized",
    "notifications/cancelled",
    "notifications/progress",
    "no/such/method",
]  # not subscriptions/listen: it is answered only when the session ends, by design
ID_KINDS = ["int", "str", "float", "null", "bool", "object", "array", "missing"]


@st.composite
def client_messages(draw: st.DrawFn) -> tuple[bytes, Any]:
    """A line a client might send, and the id its answer must carry (None: no answer is owed by id)."""
    shape = draw(st.sampled_from(["jsonrpc", "jsonrpc", "jsonrpc", "json", "bytes"]))
    if shape == "bytes":
        return draw(st.binary(max_size=200)).replace(b"\n", b" "), None
    if shape == "json":
        return json.dumps(draw(json_values)).encode(), None
    message: dict[str, Any] = {}
    if draw(st.booleans()) or draw(st.booleans()):
        message["jsonrpc"] = draw(st.sampled_from(["2.0", "2.0", "2.0", "1.0", 2]))
    kind = draw(st.sampled_from(ID_KINDS))
    serial = next(_ids)
    id_value: Any = {
        "int": serial,
        "str": f"fz-{serial}",
        "float": serial + 0.5,
        "null": None,
        "bool": True,
        "object": {"n": serial},
        "array": [serial],
    }.get(kind)
    if kind != "missing":
        message["id"] = id_value
    if draw(st.integers(0, 9)):
        message["method"] = draw(st.sampled_from(METHODS) | st.text(max_size=12))
    if draw(st.booleans()):
        message["params"] = draw(json_values)
    if draw(st.integers(0, 9)) == 0:
        message[draw(st.sampled_from(["result", "error"]))] = draw(json_values)
    is_response = "method" not in message and ("result" in message or "error" in message)
    owed = kind in ("int", "str", "float") and not is_response
    return json.dumps(message).encode(), (id_value if owed else None)


class StdioPeer:
    """A raw JSON-RPC client of one aggregator process; a thread files every answer by id."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.answers: dict[str, queue.Queue[Any]] = {}
        self.lock = threading.Lock()
        self.bad_lines: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _box(self, request_id: Any) -> queue.Queue[Any]:
        with self.lock:
            return self.answers.setdefault(json.dumps(request_id), queue.Queue())

    def _read(self) -> None:
        assert self.proc.stdout
        for line in self.proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                self.bad_lines.append(line)  # stdout must carry JSON-RPC only
                continue
            for item in message if isinstance(message, list) else [message]:
                if isinstance(item, dict) and item.get("id") is not None:
                    self._box(item["id"]).put(item)

    def send(self, line: bytes) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def answer(self, request_id: Any) -> dict[str, Any]:
        try:
            return dict(self._box(request_id).get(timeout=REPLY_SECONDS))
        except queue.Empty:
            raise AssertionError(f"no answer for id {request_id!r} within {REPLY_SECONDS}s") from None

    def alive(self) -> None:
        """The session still answers (and everything sent before has been read)."""
        ping = f"ping-{next(_ids)}"
        self.send(json.dumps({"jsonrpc": "2.0", "id": ping, "method": "ping"}).encode())
        assert self.answer(ping)["result"] == {}


@pytest.fixture(scope="module")
def stdio_peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StdioPeer]:
    directory = tmp_path_factory.mktemp("fuzz-stdio")
    quiet_kit = kit_upstream(tools={"deny": ["slow", "crash", "set_tools", "big"]})
    config = write_config(directory, {"kit": quiet_kit})
    errors = (directory / "stderr.log").open("wb")
    proc = spawn_raw_aggregator(config, stderr=errors, AGGREGATOR_DATA_DIR=str(directory / "data"))
    rpc(proc, 1, "tools/call", {"name": "catalog_list_tools", "arguments": {"server": "kit"}})  # load kit
    peer = StdioPeer(proc)
    yield peer
    assert proc.stdin
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    errors.close()
    log = (directory / "stderr.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-4000:]
    assert peer.bad_lines == []


@FUZZ
@given(client_messages())
@example((b'{"jsonrpc": "2.0", "id": 1000298, "method": "ping", "params": [], "result": {}}', 1000298))
@example((b'{"jsonrpc": "2.0", "id": "fz-e", "method": "x", "error": {"code": 1, "message": "m"}}', "fz-e"))
def test_stdio_answers_every_request_and_survives_anything(stdio_peer: StdioPeer, sent: tuple[bytes, Any]) -> None:
    line, owed = sent
    stdio_peer.send(line)
    if owed is not None:
        assert set(stdio_peer.answer(owed)) >= {"jsonrpc", "id"}
    stdio_peer.alive()


def own_tools(peer: StdioPeer) -> list[dict[str, Any]]:
    listing = f"list-{next(_ids)}"
    peer.send(json.dumps({"jsonrpc": "2.0", "id": listing, "method": "tools/list"}).encode())
    return list(peer.answer(listing)["result"]["tools"])


OWN_TOOLS = [
    "catalog_list_servers",
    "catalog_list_tools",
    "catalog_describe_tool",
    "catalog_search_tools",
    "catalog_call_tool",
    "apropos-search",
    "who-references",
    "search_create_index",
    "search_add_document",
    "search_index",
]


def test_the_fuzzed_tool_list_is_the_served_one(stdio_peer: StdioPeer) -> None:
    assert sorted(tool["name"] for tool in own_tools(stdio_peer)) == sorted(OWN_TOOLS)


NAMES = ["kit", "KIT", "nope", "aggregator", "echo", "add", "default", "", "x" * 70]


@st.composite
def tool_calls(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A tool and arguments: the schema's keys with values of any JSON type, plus strays."""
    tool = draw(st.sampled_from(OWN_TOOLS))
    keys = [
        "server",
        "tool",
        "arguments",
        "query",
        "limit",
        "offset",
        "load",
        "pattern",
        "package",
        "type",
        "name",
        "index_name",
        "backend",
        "tokenizer_config",
        "doc_id",
        "content",
        "metadata",
        "k",
    ]
    values = (
        json_values
        | st.sampled_from(NAMES)
        | st.integers(-5, 10**12)
        | st.text(max_size=300)
        | st.sampled_from(["function", "tool", "macro", "memory", "sqlite", '+a -b "c d"'])
    )
    arguments = draw(st.dictionaries(st.sampled_from(keys) | st.text(max_size=6), values, max_size=5))
    return tool, arguments


@FUZZ
@given(tool_calls())
def test_every_tool_answers_any_arguments_with_a_result(
    stdio_peer: StdioPeer, call: tuple[str, dict[str, Any]]
) -> None:
    tool, arguments = call
    request_id = next(_ids)
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }
    stdio_peer.send(json.dumps(body).encode())
    answer = stdio_peer.answer(request_id)
    assert "result" in answer, answer  # bad arguments are the tool's answer (isError), never a protocol error
    assert isinstance(answer["result"]["content"], list)
    text = " ".join(block.get("text", "") for block in answer["result"]["content"])
    assert "internal error" not in text.lower(), text


# ---------------------------------------------------------------- HTTP


class HttpPeer:
    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx2.Client(timeout=REPLY_SECONDS)
        self.session = open_session(self.http, url)

    def alive(self) -> None:
        ping = {"jsonrpc": "2.0", "id": "alive", "method": "ping"}
        answered = self.http.post(self.url, json=ping, headers={**HEADERS, "mcp-session-id": self.session})
        assert answered.status_code == 200 and '"alive"' in answered.text


@pytest.fixture(scope="module")
def http_peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpPeer]:
    directory = tmp_path_factory.mktemp("fuzz-http")
    config = write_config(directory, {"kit": kit_upstream(tools={"deny": ["slow", "crash", "set_tools", "big"]})})
    with http_aggregator_process(config, env=aggregator_env(AGGREGATOR_DATA_DIR=str(directory / "data"))) as (
        url,
        proc,
    ):
        peer = HttpPeer(url)
        yield peer
        peer.http.close()
        proc.terminate()
        proc.wait(timeout=15)
        assert proc.stderr
        log = proc.stderr.read().decode(errors="replace")
    assert "Traceback" not in log, log[-4000:]


@FUZZ
@given(
    client_messages(),
    st.sampled_from(["session", "none", "garbage"]),
    st.sampled_from(["application/json", "text/plain", ""]),
)
def test_http_answers_anything_without_a_server_error(
    http_peer: HttpPeer, sent: tuple[bytes, Any], session: str, content_type: str
) -> None:
    line, owed = sent
    headers = {**HEADERS, "Content-Type": content_type}
    if session != "none":
        headers["mcp-session-id"] = http_peer.session if session == "session" else "f" * 32
    answered = http_peer.http.post(http_peer.url, content=line, headers=headers)
    assert answered.status_code < 500, (answered.status_code, answered.text[:500])
    if owed is not None and answered.status_code == 200 and session == "session" and content_type:
        assert json.dumps(owed) in answered.text, answered.text[:500]
    http_peer.alive()
