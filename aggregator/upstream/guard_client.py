"""The aggregator's side of the shared guard (`guard.py`, or the same in C: `guard.c`, chosen by
`guard_build.choose`): one guard process for all stdio upstreams.

`open_guarded_process` starts an upstream through the guard and returns an `anyio.abc.Process`
whose stdin and stdout are plain pipes the aggregator made (the guard only holds them long enough
to hand them to the upstream). The guard is started on the first need and again if it died; one
reader thread takes its answers (pids, exit codes), so no event loop owns it and every loop of the
process (tests run many) shares it. When its last upstream has exited the guard is told to go (its
socket is shut): nothing idles, and the next upstream starts a new one. Off Linux there is no
guard: the upstream is spawned directly.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from contextlib import suppress

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread

from aggregator.log import get_logger
from aggregator.upstream import guard_build

log = get_logger(__name__)

GUARD = guard_build.PYTHON_GUARD
READ_CHUNK = 65536
EXIT_POLL_SECONDS = 0.02


class GuardError(OSError):
    """The guard could not start the upstream (its message says why)."""


class _Retired(Exception):
    """This guard was told to go (its last upstream exited): ask a new one."""


class _DidNotStart(GuardError):
    """The C guard exited before its first answer: ask again, the Python guard runs now."""


def encode_request(ident: int, argv: list[str], env: Mapping[str, str], cwd: str | None) -> bytes:
    """A spawn request in the guards' wire format (`guard.py`); `GuardError` for what no exec could take."""
    fields = [b"i%d" % ident]
    fields += [b"a" + os.fsencode(word) for word in argv]
    for name, value in env.items():
        if not name or "=" in name:
            raise GuardError(f"not an environment variable name: {name!r}")
        fields.append(b"e" + os.fsencode(name) + b"=" + os.fsencode(value))
    if cwd is not None:
        fields.append(b"c" + os.fsencode(cwd))
    if not argv:
        raise GuardError("no command to run: argv is empty")
    if any(b"\0" in field for field in fields):
        raise GuardError("a command, its arguments, environment and directory cannot hold a NUL")
    return b"\0".join(fields) + b"\0"


def decode_answer(data: bytes) -> dict[str, str]:
    """A guard's answer: tag → value (``i``/``p``, ``i``/``r``, ``x``/``c``)."""
    return {field[:1].decode(): field[1:].decode(errors="replace") for field in data.split(b"\0") if field}


def _start(choice: guard_build.Choice, theirs: socket.socket) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*choice.command, str(os.getpid()), str(theirs.fileno())],
        pass_fds=(theirs.fileno(),),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )


_announced: set[str] = set()


def _start_guard(theirs: socket.socket) -> tuple[guard_build.Choice, subprocess.Popen[bytes]]:
    """Start the guard `guard_build` chooses; the Python one if the C binary will not run (one log line;
    one that runs but exits at once is caught by `_Guard._read`). Each choice is logged once per process
    (at info: which guard and why)."""
    choice = guard_build.choose(start_build=True)
    try:
        process = _start(choice, theirs)
    except OSError as exc:
        if choice.kind == "python":
            raise
        reason = f"the C guard {choice.command[0]} does not start: {exc.strerror or exc}"
        choice = guard_build.did_not_start(choice.command[0], reason, ran=False)
        process = _start(choice, theirs)
    if choice.reason not in _announced:
        _announced.add(choice.reason)
        log.info("guard", kind=choice.kind, reason=choice.reason)
    return choice, process


class _Guard:
    """One running guard: its socket, the reader thread, and the upstreams it reported."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.choice, self.process = _start_guard(theirs)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self.owner_pid = os.getpid()
        self.lock = threading.Lock()
        self.next_id = 0
        self.pending: dict[int, Future[int]] = {}
        self.processes: dict[int, GuardedProcess | None] = {}  # None: spawned, not registered yet
        self.early_exits: dict[int, int] = {}  # exits reported before their process was registered
        self.alive = True
        self.answered = False  # a C guard that exits before its first answer did not start
        self.died = GuardError("the guard process has exited")  # what a spawn on a dead guard raises
        self.closed = threading.Event()  # set when the reader saw the guard go
        self.retired = False  # told to go once idle (not dead)
        threading.Thread(target=self._read, name="aggregator-guard", daemon=True).start()

    def spawn(self, argv: list[str], env: Mapping[str, str], cwd: str | None, fds: list[int]) -> int:
        with self.lock:
            if not self.alive:
                raise _Retired if self.retired else self._death()
            self.next_id += 1
            ident = self.next_id
            try:
                request = encode_request(ident, argv, env, cwd)
            except GuardError:
                self._retire_if_idle()
                raise
            answer: Future[int] = Future()
            self.pending[ident] = answer
            failed: OSError | None = None
            try:
                socket.send_fds(self.sock, [request], fds)
            except OSError as exc:
                self.pending.pop(ident, None)
                failed = exc
        if failed is not None:  # the guard is gone: its reader says whether it ever started
            if self.closed.wait(10) and isinstance(self.died, _DidNotStart):
                raise self._death() from failed
            raise failed
        return answer.result()

    def register(self, process: GuardedProcess) -> None:
        with self.lock:
            code = self.early_exits.pop(process.pid, None)
            if code is not None:
                process.exited(code)
            elif process.pid not in self.processes:  # the guard died in between, and the upstream with it
                process.exited(128 + signal.SIGKILL)
            else:
                self.processes[process.pid] = process

    def _retire_if_idle(self) -> None:
        """No upstream left and none starting: tell the guard to go (under the lock)."""
        if self.alive and not self.processes and not self.pending:
            self.alive, self.retired = False, True
            with suppress(OSError):
                self.sock.shutdown(socket.SHUT_WR)  # the guard reads end-of-file, ends what is left, exits

    def _death(self) -> GuardError:
        """A new exception saying how the guard died (one instance is never raised in two threads)."""
        return type(self.died)(*self.died.args)

    def _did_not_start(self) -> _DidNotStart | None:
        """A C guard that exited before answering anything (a libc it cannot load: "GLIBC_2.34 not found"):
        the Python guard runs from now on, and the request is asked again (`_spawn`)."""
        if self.answered or self.choice.kind != "c" or self.retired:
            return None
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None
        path = self.choice.command[0]
        reason = f"the C guard {path} does not start: it exited at once (exit code {code}; its stderr says why)"
        guard_build.did_not_start(path, reason, ran=True)
        return _DidNotStart(reason)

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            self.answered = True
            message = decode_answer(data)
            try:
                numbers = {tag: int(message[tag]) for tag in ("i", "p", "x", "c") if tag in message}
            except ValueError:
                continue  # not from a guard of ours: nothing to resolve
            with self.lock:
                if "x" in numbers:
                    pid, code = numbers["x"], numbers.get("c", 128 + signal.SIGKILL)
                    process = self.processes.pop(pid, None)
                    if process is not None:
                        process.exited(code)
                    else:
                        self.early_exits[pid] = code
                    self._retire_if_idle()
                    continue
                answer = self.pending.pop(numbers.get("i", 0), None)
                if answer is not None and "p" in numbers:
                    self.processes[numbers["p"]] = None
                else:  # a refused start: the guard may have nothing left to do
                    self._retire_if_idle()
            if answer is not None:
                if "p" in numbers:
                    answer.set_result(numbers["p"])
                else:
                    answer.set_exception(GuardError(message.get("r", "the guard refused")))
        died = self._did_not_start()
        with self.lock:  # the guard died: its upstreams died with it (PR_SET_PDEATHSIG)
            self.alive = False
            if died is not None:
                self.died = died
            for answer in self.pending.values():
                answer.set_exception(self._death())
            for pid, process in self.processes.items():
                if process is not None:
                    process.exited(128 + signal.SIGKILL)
                else:
                    self.early_exits[pid] = 128 + signal.SIGKILL
            self.pending.clear()
            self.processes.clear()
        self.closed.set()
        with suppress(OSError):
            self.sock.close()
        with suppress(OSError):
            self.process.wait()


_current: _Guard | None = None
_current_lock = threading.Lock()


def _guard() -> _Guard:
    """The running guard of this process, started (or restarted) on demand."""
    global _current
    with _current_lock:
        if _current is None or not _current.alive or _current.owner_pid != os.getpid():
            _current = _Guard()
        return _current


def guard_pid() -> int | None:
    """The pid of the running guard, if any (tests and the memory benchmark look at it)."""
    return _current.process.pid if _current is not None and _current.alive else None


def guard_kind() -> str | None:
    """Which guard runs, "c" or "python", if one runs."""
    return _current.choice.kind if _current is not None and _current.alive else None


class _PipeEnd:
    """One end of a pipe, non-blocking, on whatever event loop uses it; closing tells the loop first."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd: int | None = fd

    def fileno(self) -> int | None:
        """The pipe's descriptor while this end is open, else None (read by `PipeReader` and `LineWriter`)."""
        return self._fd

    async def aclose(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            anyio.notify_closing(fd)
            os.close(fd)


class PipeReceive(_PipeEnd, anyio.abc.ByteReceiveStream):
    """The read end of a pipe."""

    async def receive(self, max_bytes: int = READ_CHUNK) -> bytes:
        """The next bytes; a checkpoint once, however they come: a read that had to wait for them yielded
        already, so only one that found them at once yields after (one loop turn per answer, not two)."""
        waited = False
        while True:
            if self._fd is None:
                raise anyio.ClosedResourceError
            try:
                data = os.read(self._fd, max_bytes)
            except BlockingIOError:
                await anyio.wait_readable(self._fd)
                waited = True
                continue
            if not waited:
                await anyio.lowlevel.checkpoint()
            if not data:
                raise anyio.EndOfStream
            return data


class PipeSend(_PipeEnd, anyio.abc.ByteSendStream):
    """The write end of a pipe; a reader that went away is a broken resource."""

    async def send(self, item: bytes) -> None:
        """Write all of `item`. Cancellation is checked first, but the loop is not yielded to before
        the write (a request reaches its upstream a loop turn sooner); a full pipe waits as usual."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        view = memoryview(item)
        while view:
            if self._fd is None:
                raise anyio.ClosedResourceError
            try:
                view = view[os.write(self._fd, view) :]
            except BlockingIOError:
                await anyio.wait_writable(self._fd)
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise anyio.BrokenResourceError from exc


class GuardedProcess(anyio.abc.Process):
    """An upstream started by the guard: the guard is its parent, so its exit code comes from there."""

    def __init__(self, pid: int, stdin: int, stdout: int) -> None:
        self._pid = pid
        self._returncode: int | None = None
        self._stdin = PipeSend(stdin)
        self._stdout = PipeReceive(stdout)

    def exited(self, code: int) -> None:
        """Called from the guard's reader thread; an int assignment is atomic."""
        self._returncode = code

    async def wait(self) -> int:
        while self._returncode is None:
            await anyio.sleep(EXIT_POLL_SECONDS)
        return self._returncode

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def send_signal(self, sig: int) -> None:
        if self._returncode is None:
            with suppress(ProcessLookupError, PermissionError):
                os.kill(self._pid, sig)

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._returncode

    @property
    def stdin(self) -> anyio.abc.ByteSendStream:
        return self._stdin

    @property
    def stdout(self) -> anyio.abc.ByteReceiveStream:
        return self._stdout

    @property
    def stderr(self) -> None:
        return None

    async def aclose(self) -> None:
        await self._stdin.aclose()
        await self._stdout.aclose()


async def open_guarded_process(
    argv: list[str], *, env: Mapping[str, str], cwd: str | None, stderr: int
) -> anyio.abc.Process:
    """Start `argv` in its own session under the shared guard (Linux), or directly elsewhere.

    `stderr` is a descriptor the caller keeps ownership of. Raises `OSError` when the guard cannot
    start the upstream (the command itself is checked by the caller first).
    """
    if sys.platform != "linux":
        return await anyio.open_process(
            argv, env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, start_new_session=True
        )
    stdin_read, stdin_write = os.pipe()
    stdout_read, stdout_write = os.pipe()
    try:
        guard, pid = await anyio.to_thread.run_sync(_spawn, argv, env, cwd, [stdin_read, stdout_write, stderr])
    except BaseException:
        for fd in (stdin_write, stdout_read):
            os.close(fd)
        raise
    finally:
        for fd in (stdin_read, stdout_write):
            os.close(fd)
    process = GuardedProcess(pid, stdin_write, stdout_read)
    guard.register(process)
    return process


def _spawn(argv: list[str], env: Mapping[str, str], cwd: str | None, fds: list[int]) -> tuple[_Guard, int]:
    """Start the upstream under the current guard, or a new one if that one was just retired."""
    while True:
        guard = _guard()
        try:
            return guard, guard.spawn(argv, env, cwd, fds)
        except (_Retired, _DidNotStart):
            continue
