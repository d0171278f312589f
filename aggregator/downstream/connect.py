"""`aggregator connect`: a client's stdio handed to the per-user aggregator service.

What an MCP client runs instead of `aggregator serve`. It attaches to the service for
this user and config (`aggregator.downstream.runtime`), starting it detached when none runs (a lock
file makes two racing `connect`s start exactly one). Standard library only, no SDK
import: it starts in a few milliseconds more than Python itself and holds a few MB.

By default it then hands its own stdin and stdout to the service over the Unix socket
(SCM_RIGHTS): the service reads and writes the client's pipes itself, so a call costs
nothing more than with `serve`, and `connect` only waits. When the session ends (the
client's EOF, answered and drained; or the service stopping or dying) the service closes
the socket and `connect` exits, so the client sees its server end cleanly. With
`--relay` it carries the messages instead (`aggregator.downstream.connect_relay`), and the session
survives a restart of the service.
"""

from __future__ import annotations

import _socket  # not `socket`: its enum conversions cost ~15 ms of start-up
import fcntl
import os
import sys
import time
from collections.abc import Sequence

from aggregator.downstream.runtime import (
    ServiceFiles,
    connect_target,
    private_dir,
    service_files,
    service_running,
    try_connect,
)

READ_CHUNK = 1 << 16
START_TIMEOUT = 30.0  # seconds for a new service to accept: importing the SDK and reading the config
LOG_ROTATE_BYTES = 8 << 20
HANDOFF = b"\0"  # as downstream/unix.py HANDOFF (importing it would import anyio)
FD_SIZE = 4  # a C int


class ConnectError(Exception):
    """The service could not be reached or started; the message says why and where its log is."""


class ServiceGone(ConnectError):
    """The service we reached closed the connection before answering: one dying as we connected."""


USAGE = """\
usage: aggregator connect [--config FILE] [--data-dir DIR] [--log-level LEVEL] [--start-timeout SECONDS] [--relay]

What an MCP client runs instead of `aggregator serve`: attaches to this user's aggregator
service for the config (starting it when none runs) and hands the client's stdio to it.
  --config FILE            the config file, found as `serve` finds it when not given
  --data-dir DIR           where indexes and snapshots live (as for serve)
  --log-level LEVEL        the service's log level when this starts it (default info)
  --start-timeout SECONDS  how long to wait for a new service to accept (default 30)
  --relay                  carry the messages instead of handing stdio over: a little slower, and
                           the session survives a restart of the service (the next message finds it)
The service logs to a file: `aggregator service logs`. `--log-file` is accepted and ignored.
"""
OPTIONS = ("--config", "--data-dir", "--log-level", "--log-file", "--start-timeout")
FLAGS = ("--relay",)


def parse_args(argv: Sequence[str]) -> dict[str, str]:
    """`--name value` and `--name=value` for OPTIONS (argparse costs ~10 ms of start-up); SystemExit on misuse."""
    found: dict[str, str] = {}
    words = list(argv)
    while words:
        word = words.pop(0)
        if word in ("-h", "--help"):
            sys.stdout.write(USAGE)
            raise SystemExit(0)
        if word in FLAGS:
            found[word[2:]] = ""
            continue
        name, has_value, value = word.partition("=")
        if name not in OPTIONS:
            what = "unknown option" if word.startswith("-") else "unexpected argument"
            raise _usage_error(f"{what} {word!r}", name)
        if not has_value:
            if not words:
                raise _usage_error(f"{name} needs a value")
            value = words.pop(0)
        found[name[2:]] = value
    return found


def _usage_error(problem: str, word: str = "") -> SystemExit:
    """Says `problem` in one line on stderr, as the other commands' usage errors do; the exit (code 2) to raise.

    (It returns the exit rather than raising it: `typing.NoReturn` would cost `connect` an import.)"""
    from aggregator.suggest import closest  # difflib: only on this path

    guess = closest(word.lstrip("-"), [o.lstrip("-") for o in (*OPTIONS, *FLAGS)]) if word.startswith("-") else None
    hint = f"; did you mean '--{guess}'?" if guess else ""
    _say(f"error: {problem}{hint} (see aggregator connect --help)")
    return SystemExit(2)


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
    if "relay" in args:
        from aggregator.downstream.connect_relay import Bridge

        return Bridge(opener.open, first, timeout).run()
    deadline = time.monotonic() + timeout
    while (code := hand_off(first, files)) is None:  # a service dying as we reached it: never had our stdio
        if time.monotonic() > deadline:
            _say(f"every service reached for {timeout:g}s went away before taking the session")
            return 1
        time.sleep(0.01)  # it finishes dying, or the one we start binds its socket
        try:
            first = opener.open()
        except ConnectError as exc:
            _say(str(exc))
            return 1
    return code


def hand_off(sock: _socket.socket, files: ServiceFiles) -> int | None:
    """Pass our stdin and stdout to the service (SCM_RIGHTS): it talks to the client with no hop between.

    We stay, holding the socket, until the service ends the session (the client's EOF; the service
    stopping or dying): the client sees its server process exit only then. None when the connection
    was reset with our hand-off unread (a service dying as we connected; see `ServiceOpener._connect`):
    its process never had the client's stdio, so another service may take it.
    """
    fds = b"".join(fd.to_bytes(FD_SIZE, sys.byteorder) for fd in (0, 1))
    try:
        sock.sendmsg([HANDOFF], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
    except ConnectionResetError:
        sock.close()
        return None
    except OSError as exc:
        _say(f"cannot pass stdio to the service: {exc}")
        return 1
    while True:
        try:
            if not sock.recv(READ_CHUNK):
                break
        except ConnectionResetError:  # Linux resets a peer only while what it sent is unread
            sock.close()
            return None
        except OSError:
            break
    if not service_running(files.pid):
        _say("the aggregator service went away; this session has ended (the next start of it finds a new one)")
    return 0


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
        sock = self._connect()
        if sock is not None:
            return sock
        try:
            private_dir(self.files.directory)
        except OSError as exc:
            raise ConnectError(f"cannot use the runtime directory: {exc}") from None
        with _locked(self.files.start_lock, self.timeout):  # one starter at a time; the others find its service
            sock = self._connect()
            return sock if sock is not None else self._start()

    def _connect(self) -> _socket.socket | None:
        """A connection to the live service, or None: nothing listens, or what listens is a service going away.

        A SIGKILLed service (the OOM killer, `kill -9`) leaves its socket file, and for a moment
        its listener too, after its clients saw their connections end: the kernel releases a
        dead process's files one by one, in no set order (seen under load). A `connect` there
        succeeds and is reset an instant later. The live service is the one holding the pid
        lock, and the listener we reached must be its own (SO_PEERCRED). A dying service whose
        lock is not yet released passes this: the relay retries a reset handshake for that.
        """
        sock = try_connect(self.files.socket)
        if sock is None or (service_running(self.files.pid) and _peer_pid(sock) in (None, _holder_pid(self.files.pid))):
            return sock
        sock.close()
        return None

    def _start(self) -> _socket.socket:
        import subprocess  # only on this path: ~10 ms of imports a warm attach does not pay

        command = [sys.executable, "-m", "aggregator", "serve", "--transport", "socket"]
        command += ["--log-file", str(self.files.log), "--log-level", self.log_level or "info"]
        if self.config:
            command += ["--config", self.config]
        if self.data_dir:
            command += ["--data-dir", self.data_dir]
        _rotate(self.files.log)
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
            sock = self._connect()  # not the listener of a service still dying, before ours replaces its file
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


def _rotate(log: str) -> None:
    """Keep one previous log (`K.log.1`) when the log has grown past LOG_ROTATE_BYTES: a service per start."""
    try:
        if os.path.getsize(log) > LOG_ROTATE_BYTES:
            os.replace(log, f"{log}.1")
    except OSError:
        pass


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


def _peer_pid(sock: _socket.socket) -> int | None:
    """The pid of the process listening at the other end of `sock`, or None where the system cannot say."""
    option = getattr(_socket, "SO_PEERCRED", None)
    if option is None:  # pragma: no cover - not Linux: the pid lock alone tells
        return None
    try:
        credentials = sock.getsockopt(_socket.SOL_SOCKET, option, 3 * FD_SIZE)  # struct ucred: pid, uid, gid
    except OSError:
        return None
    return int.from_bytes(credentials[:FD_SIZE], sys.byteorder)


def _holder_pid(pid_file: str) -> int | None:
    """The pid the service wrote in its pid file (`claim_service`: `{"pid": N, ...}`), read without `json`,
    which would cost `connect` ~5 ms of start-up (it imports `re`)."""
    try:
        with open(pid_file, "rb") as fh:
            head = fh.read(64)
    except OSError:
        return None
    _, found, rest = head.partition(b'"pid": ')
    digits = rest[: len(rest) - len(rest.lstrip(b"0123456789"))]
    return int(digits) if found and digits else None


def _recv(sock: _socket.socket) -> bytes:
    try:
        return sock.recv(READ_CHUNK)
    except OSError:
        return b""


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
