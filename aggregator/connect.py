"""`aggregator connect`: a client's stdio carried to the per-user aggregator service.

What an MCP client runs instead of `aggregator serve`. It attaches to the service for
this user and config (`aggregator.runtime`), starting it detached when none runs (a lock
file makes two racing `connect`s start exactly one), then copies newline-delimited
JSON-RPC both ways. Standard library only, no SDK import: it starts in tens of
milliseconds and holds a few MB.

Each direction has its own thread, so a full pipe one way never stalls the other
(the service stops reading when its in-flight bound is reached and waits for us to
take its answers). EOF passes both ways: the client's EOF half-closes the socket, the
service answers what is left and closes; the service's close ends this process.

If the service goes away while the client is still talking (stopped, killed,
restarted), requests it had not answered get a JSON-RPC error at once, and the client's
next message starts or finds a service again: the client's `initialize` and
`notifications/initialized` are replayed first (the replayed answer is not passed on),
so the client carries on in a new session without knowing. Nothing is resent that may
already have run.
"""

from __future__ import annotations

import _socket  # not `socket`: its enum conversions cost ~15 ms of start-up
import fcntl
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from aggregator.runtime import ServiceFiles, connect_target, private_dir, service_files, service_running, try_connect

READ_CHUNK = 1 << 16
START_TIMEOUT = 30.0  # seconds for a new service to accept: importing the SDK and reading the config
DRAIN_TIMEOUT = 60.0  # after the client's EOF, for the service to answer what is left and close
SERVICE_GONE = -32000
REPLAY_ID = "aggregator-connect-replay"


class ConnectError(Exception):
    """The service could not be reached or started; the message says why and where its log is."""


USAGE = """\
usage: aggregator connect [--config FILE] [--data-dir DIR] [--log-level LEVEL] [--start-timeout SECONDS]

What an MCP client runs instead of `aggregator serve`: attaches to this user's aggregator
service for the config (starting it when none runs) and carries stdio to it.
  --config FILE            the config file, found as `serve` finds it when not given
  --data-dir DIR           where indexes and snapshots live (as for serve)
  --log-level LEVEL        the service's log level when this starts it (default info)
  --start-timeout SECONDS  how long to wait for a new service to accept (default 30)
The service logs to a file: `aggregator service logs`. `--log-file` is accepted and ignored.
"""
OPTIONS = ("--config", "--data-dir", "--log-level", "--log-file", "--start-timeout")


def parse_args(argv: Sequence[str]) -> dict[str, str]:
    """`--name value` and `--name=value` for OPTIONS (argparse costs ~10 ms of start-up); SystemExit on misuse."""
    found: dict[str, str] = {}
    words = list(argv)
    while words:
        word = words.pop(0)
        if word in ("-h", "--help"):
            sys.stdout.write(USAGE)
            raise SystemExit(0)
        name, has_value, value = word.partition("=")
        if name not in OPTIONS:
            raise SystemExit(f"aggregator connect: unrecognized argument {word!r}\n{USAGE}")
        if not has_value:
            if not words:
                raise SystemExit(f"aggregator connect: {name} needs a value")
            value = words.pop(0)
        found[name[2:]] = value
    return found


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        timeout = float(args.get("start-timeout", START_TIMEOUT))
    except ValueError:
        raise SystemExit("aggregator connect: --start-timeout needs a number of seconds") from None
    config, data_dir = connect_target(args.get("config"), args.get("data-dir"), os.environ, os.getcwd())
    files = service_files(config, data_dir)
    opener = ServiceOpener(files, config, data_dir, args.get("log-level"), timeout)
    try:
        first = opener.open()
    except ConnectError as exc:
        _say(str(exc))
        return 1
    return Bridge(opener.open, first).run()


def _say(message: str) -> None:
    """One line on stderr (the client shows it in its MCP log); never on stdout."""
    try:  # noqa: SIM105 - contextlib costs start-up time here
        os.write(2, f"aggregator connect: {message}\n".encode(errors="replace"))
    except OSError:
        pass


# ---------------------------------------------------------------- finding or starting the service


class ServiceOpener:
    """Connects to the service's socket, starting the service first when nothing listens."""

    def __init__(
        self, files: ServiceFiles, config: str | None, data_dir: str | None, log_level: str | None, timeout: float
    ) -> None:
        self.files, self.config, self.data_dir = files, config, data_dir
        self.log_level, self.timeout = log_level, timeout

    def open(self) -> _socket.socket:
        sock = try_connect(self.files.socket)
        if sock is not None:
            return sock
        try:
            private_dir(self.files.directory)
        except OSError as exc:
            raise ConnectError(f"cannot use the runtime directory: {exc}") from None
        with _locked(self.files.start_lock, self.timeout):  # one starter at a time; the others find its service
            sock = try_connect(self.files.socket)
            return sock if sock is not None else self._start()

    def _start(self) -> _socket.socket:
        import subprocess  # only on this path: ~10 ms of imports a warm attach does not pay

        command = [sys.executable, "-m", "aggregator", "serve", "--transport", "socket"]
        command += ["--log-file", str(self.files.log), "--log-level", self.log_level or "info"]
        if self.config:
            command += ["--config", self.config]
        if self.data_dir:
            command += ["--data-dir", self.data_dir]
        with open(self.files.log, "ab") as log:
            os.chmod(self.files.log, 0o600)
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,  # what goes wrong before logging is set up (a config error) lands in the log too
                start_new_session=True,  # not in the client's process group: its end must not end the service
                close_fds=True,
            )
        deadline = time.monotonic() + self.timeout
        while True:
            sock = try_connect(self.files.socket)
            if sock is not None:
                return sock
            code = process.poll()
            if code is not None and not service_running(self.files.pid):
                raise ConnectError(f"the service exited with code {code} while starting{self._log_tail()}")
            if time.monotonic() > deadline:
                raise ConnectError(f"the service did not start within {self.timeout:g}s{self._log_tail()}")
            time.sleep(0.01)

    def _log_tail(self) -> str:
        try:
            with open(self.files.log, errors="replace") as fh:
                lines = fh.read().splitlines()[-5:]
        except OSError:
            lines = []
        tail = "".join(f"\n  {line}" for line in lines)
        return f"; its log is {self.files.log}{tail}"


class _locked:
    """An exclusive `flock` on `path`, waited for at most `timeout` seconds; released by the kernel if we die."""

    def __init__(self, path: str, timeout: float) -> None:
        self.path, self.timeout = path, timeout
        self.fd = -1

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise ConnectError(f"another connect held {self.path} for {self.timeout:g}s") from None
                time.sleep(0.01)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # closing releases the lock


# ---------------------------------------------------------------- carrying messages


def _lines(read: Callable[[], bytes]) -> Iterator[bytes]:
    """Complete lines (newline kept) from successive chunks; a final unterminated line as it is."""
    buffer = b""
    while True:
        chunk = read()
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


def _request_id(message: dict[str, Any]) -> Any:
    key = message.get("id")
    return key if isinstance(key, (int, str)) and not isinstance(key, bool) else None


class Bridge:
    """The two pumps between our stdio and the service, and what survives the service going away."""

    def __init__(self, opener: Callable[[], _socket.socket], first: _socket.socket) -> None:
        self.opener = opener
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
        self.swallow: set[Any] = set()  # ids of replayed requests whose answers the client must not see
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
                    self._attach(self.opener(), replay=True)
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

    def _attach(self, sock: _socket.socket, *, replay: bool) -> None:
        """Make `sock` the connection (conn_lock held, or during construction) and start its reader."""
        self.generation += 1
        self.sock = sock
        if replay:
            self._replay(sock)
        threading.Thread(target=self._pump, args=(sock, self.generation), daemon=True).start()

    def _replay(self, sock: _socket.socket) -> None:
        """Open the new session as the client opened the old one: initialize (answer dropped), initialized."""
        with self.state_lock:
            initialize, initialized, answered = self.initialize, self.initialized, self.init_answered
        if initialize is None or not answered:
            return  # a modern client (no handshake), or one still waiting: its own initialize goes (again)
        message = _messages(initialize)[0]
        replay_id = f"{REPLAY_ID}-{self.generation}"
        with self.state_lock:
            self.swallow.add(replay_id)
        lines = json.dumps({**message, "id": replay_id}).encode() + b"\n" + (initialized or b"")
        sock.sendall(lines)

    def _pump(self, sock: _socket.socket, generation: int) -> None:
        try:
            for line in _lines(lambda: _recv(sock)):
                if self._to_client(line):
                    _write_stdout(line, self.out_lock)
        except OSError:  # our stdout is gone: the client ended
            os._exit(0)
        if self.stdin_closed:
            self.done.set()
            return
        self._lost(generation)

    def _to_client(self, line: bytes) -> bool:
        """Settle the answers in `line`; False when it answers a replayed request the client never sent."""
        for message in _messages(line):
            if "method" in message:
                continue
            key = _request_id(message)
            with self.state_lock:
                if key in self.swallow:
                    self.swallow.discard(key)
                    return False
                self.pending.pop(key, None)
                if key is not None and key == self.init_id:
                    self.init_answered = True
        return True

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
                self.swallow.clear()
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


def _recv(sock: _socket.socket) -> bytes:
    try:
        return sock.recv(READ_CHUNK)
    except OSError:
        return b""


def _write_stdout(data: bytes, lock: threading.Lock) -> None:
    with lock:
        view = memoryview(data)
        while view:
            view = view[os.write(1, view) :]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
