"""An aggregator served in-process on a socket pair, with a line client: the raw path's test bench.

The server side is what `aggregator serve` runs for a line-based client (`wire_streams` with the
raw path's lanes, the SDK runner beside it) in front of real upstream subprocesses; the client
writes JSON-RPC lines and reads what comes back, so a test sees the exact answers and ids, and
can read the raw path's counters (`server.raw`).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from aggregator.config import load_config
from aggregator.downstream.stdio import StdioLimits, Wire, wire_streams
from aggregator.proxy.server import AggregatorServer
from aggregator.upstream.pool import UpstreamPool

SAMPLED = {"role": "assistant", "content": {"type": "text", "text": "sampled"}, "model": "test-model"}


class LineClient:
    """JSON-RPC lines over one end of a socket pair; answers the server's sampling requests itself."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setblocking(False)
        self._answers: dict[Any, MemoryObjectSendStream[dict[str, Any]]] = {}
        self.notifications: list[dict[str, Any]] = []
        self.server_requests: list[dict[str, Any]] = []
        self._next = 0
        self.answer_sampling = True

    async def send(self, message: dict[str, Any] | bytes) -> None:
        data = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
        view = memoryview(data)
        while view:
            await anyio.wait_writable(self.sock)
            with suppress(BlockingIOError):
                view = view[self.sock.send(view) :]

    async def read_forever(self) -> None:
        pending = b""
        while True:
            await anyio.wait_readable(self.sock)
            try:
                chunk = self.sock.recv(1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                await self._take(json.loads(line))

    async def _take(self, message: dict[str, Any]) -> None:
        if "method" in message and "id" in message:
            self.server_requests.append(message)
            if self.answer_sampling and message["method"] == "sampling/createMessage":
                await self.send({"jsonrpc": "2.0", "id": message["id"], "result": SAMPLED})
            return
        if "method" in message:
            self.notifications.append(message)
            return
        stream = self._answers.pop(message.get("id"), None)
        if stream is not None:
            stream.send_nowait(message)

    def expect(self, request_id: Any) -> anyio.abc.ObjectReceiveStream[dict[str, Any]]:
        send, receive = anyio.create_memory_object_stream[dict[str, Any]](1)
        self._answers[request_id] = send
        return receive

    async def request(
        self, method: str, params: dict[str, Any] | None = None, *, request_id: Any = None, timeout: float = 20
    ) -> dict[str, Any]:
        """Send a request and wait for its answer (the whole JSON-RPC response)."""
        if request_id is None:
            self._next += 1
            request_id = self._next
        answer = self.expect(request_id)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        with anyio.fail_after(timeout):
            return await answer.receive()

    async def call(self, name: str, arguments: dict[str, Any] | None = None, **params: Any) -> dict[str, Any]:
        return await self.request("tools/call", {"name": name, "arguments": arguments or {}, **params})

    async def initialize(self, capabilities: dict[str, Any] | None = None, version: str = "2025-11-25") -> None:
        init = {
            "protocolVersion": version,
            "capabilities": capabilities or {},
            "clientInfo": {"name": "t", "version": "1"},
        }
        await self.request("initialize", init, request_id="init")
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        await self.request("ping", request_id="ping")  # the handshake has settled when this is answered


@asynccontextmanager
async def raw_bench(
    config_path: Path,
    *,
    max_in_flight: int = 64,
    capabilities: dict[str, Any] | None = None,
    drain_seconds: float = 10.0,
) -> AsyncIterator[tuple[AggregatorServer, LineClient]]:
    """The aggregator of `config_path` serving one line client (initialized) over a socket pair."""
    async with raw_clients(
        config_path, 1, max_in_flight=max_in_flight, capabilities=capabilities, drain_seconds=drain_seconds
    ) as (
        server,
        clients,
    ):
        yield server, clients[0]


@asynccontextmanager
async def raw_clients(
    config_path: Path,
    count: int,
    *,
    max_in_flight: int = 64,
    capabilities: dict[str, Any] | None = None,
    drain_seconds: float = 10.0,
) -> AsyncIterator[tuple[AggregatorServer, list[LineClient]]]:
    """The aggregator of `config_path` serving `count` line clients at once, each on its own socket
    pair (as the service serves the clients of `aggregator connect`), all initialized."""
    config = load_config(config_path)
    async with AsyncExitStack() as stack, UpstreamPool.running(config) as pool:
        server = AggregatorServer(pool, data_dir=config_path.parent, max_result_bytes=config.max_result_bytes)
        async with server.running(), anyio.create_task_group() as tg:
            clients = []
            for _ in range(count):
                ours, theirs = socket.socketpair()
                stack.callback(theirs.close)
                stack.callback(ours.close)
                writer = os.dup(ours.fileno())
                stack.callback(os.close, writer)
                wire = Wire(ours.fileno(), writer, True, True)
                tg.start_soon(_serve, server, wire, StdioLimits(max_in_flight, drain_seconds))
                client = LineClient(theirs)
                tg.start_soon(client.read_forever)
                await client.initialize(capabilities if capabilities is not None else {"sampling": {}})
                clients.append(client)
            yield server, clients
            tg.cancel_scope.cancel()


async def _serve(server: AggregatorServer, wire: Wire, limits: StdioLimits) -> None:
    async with wire_streams(wire, limits, lanes=server.raw.lane) as (read, write):
        await server.lowlevel.run(read, write, server.lowlevel.create_initialization_options())
