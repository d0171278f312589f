"""`aggregator connect --relay`: the client's messages carried to and from the service, and what survives
the service going away (see `aggregator.downstream.connect`, which imports this only for `--relay`).

One thread per direction, so a full pipe one way never stalls the other (the service stops
reading when its in-flight bound is reached and waits for us to take its answers). EOF passes
both ways: the client's EOF half-closes the socket, the service answers what is left and
closes. If the service goes away while the client is still talking, requests it had not
answered get a JSON-RPC error at once, and the client's next message starts or finds a
service again: the client's `initialize` (its answer awaited and dropped) and
`notifications/initialized` are replayed first, so the client carries on in a new session.
Nothing is resent that may already have run.
"""

from __future__ import annotations

import _socket
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from aggregator.downstream.connect import READ_CHUNK, START_TIMEOUT, ConnectError, ServiceGone, _recv, _say

DRAIN_TIMEOUT = 60.0  # after the client's EOF, for the service to answer what is left and close
SERVICE_GONE = -32000
REPLAY_ID = "aggregator-connect-replay"


def _lines(read: Callable[[], bytes], early: bytes = b"") -> Iterator[bytes]:
    """Complete lines (newline kept) from `early` and successive chunks; a final unterminated line as it is."""
    buffer = b""
    while True:
        chunk, early = early or read(), b""
        if not chunk:
            if buffer:
                yield buffer
            return
        buffer += chunk
        if b"\n" not in chunk:
            continue
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            yield line + b"\n"


def _messages(line: bytes) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a line (a batch is several); nothing for what is not JSON."""
    try:
        data = json.loads(line)
    except ValueError:
        return []
    items = data if isinstance(data, list) else [data]
    return [item for item in items if isinstance(item, dict)]


SLOW = object()  # _service_head could not tell: parse the whole line
_HEAD = b'{"jsonrpc":"2.0",'


def _service_head(line: bytes) -> Any:
    """What the service's line is, read from its head alone (pydantic's field order), so an answer of
    megabytes is not parsed: the id of a response, None for a request or notification, or SLOW."""
    if not line.startswith(_HEAD):
        return SLOW
    rest = line[len(_HEAD) : len(_HEAD) + 200]
    if rest.startswith(b'"method"'):
        return None
    if not rest.startswith(b'"id":'):
        return SLOW
    end = rest.find(b",", 5)
    after = rest[end + 1 :] if end > 0 else b""
    if after.startswith(b'"method"'):
        return None
    if not after.startswith((b'"result"', b'"error"')):
        return SLOW
    try:
        key = json.loads(rest[5:end])
    except ValueError:  # a string id with a comma in it: the cut was wrong
        return SLOW
    return key if _request_id({"id": key}) is not None else SLOW


def _request_id(message: dict[str, Any]) -> Any:
    key = message.get("id")
    return key if isinstance(key, (int, str)) and not isinstance(key, bool) else None


class Bridge:
    """The two pumps between our stdio and the service, and what survives the service going away."""

    def __init__(
        self, opener: Callable[[], _socket.socket], first: _socket.socket, timeout: float = START_TIMEOUT
    ) -> None:
        self.opener, self.timeout = opener, timeout
        self.conn_lock = threading.Lock()  # swapping the connection
        self.state_lock = threading.Lock()  # the bookkeeping below: quick operations only
        self.out_lock = threading.Lock()  # whole lines on stdout
        self.sock: _socket.socket | None = None
        self.generation = 0
        self.pending: dict[Any, str] = {}  # requests the service has not answered: id -> method
        self.initialize: bytes | None = None  # the client's initialize line, replayed on a new service
        self.initialized: bytes | None = None
        self.init_id: Any = None
        self.init_answered = False
        self.stdin_closed = False
        self.done = threading.Event()
        self._attach(first, replay=False)

    def run(self) -> int:
        for line in _lines(lambda: _read(0)):
            self._from_client(line)
        self.stdin_closed = True
        with self.conn_lock:
            sock = self.sock
            if sock is None:
                return 0
            try:
                sock.shutdown(_socket.SHUT_WR)  # the service answers what it has and closes
            except OSError:
                return 0
        self.done.wait(DRAIN_TIMEOUT)
        return 0

    # client -> service

    def _from_client(self, line: bytes) -> None:
        requests = self._note_client(line)
        with self.conn_lock:
            if self.sock is None:
                try:
                    self._reattach()
                except (ConnectError, OSError) as exc:
                    _say(f"the service went away and cannot be started again: {exc}")
                    self._answer_gone(requests, "the aggregator service is gone and could not be started again")
                    os._exit(1)
            sock, generation = self.sock, self.generation
        assert sock is not None
        try:
            sock.sendall(line)
        except OSError:  # _lost answers these requests, or sends an unanswered initialize again
            self._lost(generation)

    def _note_client(self, line: bytes) -> list[Any]:
        """Track the requests in `line`; remember the handshake. Returns the ids of its requests."""
        ids = []
        for message in _messages(line):
            method, key = message.get("method"), _request_id(message)
            if not isinstance(method, str):
                continue
            with self.state_lock:
                if key is not None:
                    self.pending[key] = method
                    ids.append(key)
                if method == "initialize" and key is not None:
                    self.initialize, self.init_id, self.init_answered, self.initialized = line, key, False, None
                elif method == "notifications/initialized":
                    self.initialized = line
        return ids

    # service -> client

    def _reattach(self) -> None:
        """Attach a new service's connection, the handshake replayed (conn_lock held).

        A service may still be dying as we reach it (SIGKILLed, its listener can outlast the
        connections it served by a moment; see `ServiceOpener._connect`): a connection reset or
        closed before the replay's answer is dropped and a service sought again, until the start
        timeout. Nothing of the client's has been sent on it yet, only our replayed initialize.
        """
        deadline = time.monotonic() + self.timeout
        while True:
            sock = self.opener()
            try:
                self._attach(sock, replay=True)
                return
            except TimeoutError:  # a service that does not answer: not one going away
                sock.close()
                raise
            except (ServiceGone, OSError) as exc:
                sock.close()
                if time.monotonic() > deadline:
                    raise ServiceGone(f"every service reached for {self.timeout:g}s went away: {exc}") from exc
                time.sleep(0.01)  # a dying service finishes; or the one we started binds its socket

    def _attach(self, sock: _socket.socket, *, replay: bool) -> None:
        """Make `sock` the connection (conn_lock held, or during construction) and start its reader."""
        early = self._replay(sock, self.generation + 1) if replay else b""
        self.generation += 1
        self.sock = sock
        threading.Thread(target=self._pump, args=(sock, self.generation, early), daemon=True).start()

    def _replay(self, sock: _socket.socket, generation: int) -> bytes:
        """Open the new session as the client opened the old one: initialize, its answer awaited and dropped
        (the server takes nothing else before it), then initialized. Returns bytes read past that answer."""
        with self.state_lock:
            initialize, initialized, answered = self.initialize, self.initialized, self.init_answered
        if initialize is None or not answered:
            return b""  # a modern client (no handshake), or one still waiting: its own initialize goes (again)
        replay_id = f"{REPLAY_ID}-{generation}"
        sock.sendall(json.dumps({**_messages(initialize)[0], "id": replay_id}).encode() + b"\n")
        buffer = b""
        sock.settimeout(START_TIMEOUT)
        try:
            while True:
                chunk = sock.recv(READ_CHUNK)
                if not chunk:
                    raise ServiceGone("the new service closed the connection during the handshake")
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if replay_id in [_request_id(message) for message in _messages(line)]:
                        sock.sendall(initialized or b"")
                        return buffer
                    _write_stdout(line + b"\n", self.out_lock)  # a notification of the new session
        finally:
            sock.settimeout(None)

    def _pump(self, sock: _socket.socket, generation: int, early: bytes = b"") -> None:
        try:
            for line in _lines(lambda: _recv(sock), early):
                self._to_client(line)
                _write_stdout(line, self.out_lock)
        except OSError:  # our stdout is gone: the client ended
            os._exit(0)
        if self.stdin_closed:
            self.done.set()
            return
        self._lost(generation)

    def _to_client(self, line: bytes) -> None:
        """Settle the requests that `line` answers."""
        head = _service_head(line)
        messages = _messages(line) if head is SLOW else [] if head is None else [{"id": head}]
        for message in messages:
            key = None if "method" in message else _request_id(message)
            if key is None:
                continue
            with self.state_lock:
                self.pending.pop(key, None)
                if key == self.init_id:
                    self.init_answered = True

    def _lost(self, generation: int) -> None:
        """The connection of `generation` ended under a client still talking: answer what it never will."""
        with self.conn_lock:
            if generation != self.generation or self.sock is None:
                return
            self.sock.close()
            self.sock = None
            with self.state_lock:
                waiting_init = self.init_id if self.initialize is not None and not self.init_answered else None
                lost = [key for key in self.pending if key != waiting_init]
                for key in lost:
                    del self.pending[key]
            _say("the aggregator service went away; the next message starts or finds a new one")
            self._answer_gone(lost, "the aggregator service stopped before answering; the request was not retried")
            if waiting_init is not None and self.initialize is not None:
                try:  # the client waits for this answer and may send nothing until it comes
                    self._attach(self.opener(), replay=False)
                    assert self.sock is not None
                    self.sock.sendall(self.initialize)
                except (ConnectError, OSError) as exc:
                    _say(f"cannot reach a new service: {exc}")
                    self._answer_gone([waiting_init], "the aggregator service could not be started again")
                    os._exit(1)

    def _answer_gone(self, ids: list[Any], message: str) -> None:
        for key in ids:
            error = {"jsonrpc": "2.0", "id": key, "error": {"code": SERVICE_GONE, "message": message}}
            try:
                _write_stdout(json.dumps(error).encode() + b"\n", self.out_lock)
            except OSError:
                os._exit(0)


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, READ_CHUNK)
    except OSError:
        return b""


def _write_stdout(data: bytes, lock: threading.Lock) -> None:
    with lock:
        view = memoryview(data)
        while view:
            view = view[os.write(1, view) :]
