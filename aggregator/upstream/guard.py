"""One process that runs every stdio upstream of an aggregator so that none of their processes outlives
them or the aggregator (Linux).

Usage: ``python -I -S guard.py PARENT_PID SOCKET_FD``, started once per aggregator process by
`guard_client.py`, which then asks it over the socket (a ``SOCK_SEQPACKET`` pair) to start each
upstream. Standard library only, and never imports the aggregator package, so it starts in a few
tens of milliseconds and costs one small interpreter for all upstreams together (issue 24: it used
to be one guard per upstream, 10 MiB RSS each).

A process group is not enough: a grandchild that calls ``setsid()`` leaves it, and when the
aggregator is killed with SIGKILL nothing ends the group at all. So the guard

- marks itself a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): every orphan below it,
  daemonized or ``setsid()``-ed ones included, is re-parented to the guard, not to init, so the
  guard's process tree is exactly the upstreams' processes;
- starts each upstream as its own child, in a new session, with the pipes the aggregator sent
  (``SCM_RIGHTS``) as its stdin, stdout and stderr, its environment marked with
  ``AGGREGATOR_GUARD_UPSTREAM`` (how an orphan that left the session is traced back to its
  upstream), and ``PR_SET_PDEATHSIG`` so it dies with the guard;
- reports each upstream's pid, and its exit code when it exits, then ends what that upstream left
  behind: every adopted orphan whose upstream is gone (SIGTERM, a short grace, SIGKILL);
- ends everything it holds when the aggregator goes away, however it goes: the socket reaches
  end-of-file when the aggregator exits or is killed, and SIGTERM, SIGINT and SIGHUP do the same.

`guard.c` is the same guard in C (docs/guard.md): both speak one wire format, and the aggregator's
side (`guard_client.py`) does not care which one runs. The guard imports the C modules under
`socket`, `signal`, `selectors` and `ctypes` (`_socket`, `_signal`, `select`, `_ctypes`): their
Python wrappers import `enum` and more, 1.5 MB of RSS for names and conveniences the guard never
uses (issue 24: the guard's RSS counts fully in the aggregator's own memory).
A message (one ``SOCK_SEQPACKET`` datagram) is a run of fields, each a tag byte, its value and a NUL
(simple to parse in C; `json` would add 0.5 MB to this guard's RSS). Aggregator → guard: ``i`` the
id (decimal), ``a`` each word of argv (at least one), ``e`` each ``NAME=value`` of the environment,
``c`` the working directory (optional), with three descriptors. Guard → aggregator: ``i`` the id
then ``p`` the pid, or ``i`` the id then ``r`` why it was refused (no ``i`` when the id was
unreadable), and ``x`` a pid then ``c`` its exit code (128 + signal when a signal ended it).
"""

from __future__ import annotations

import _ctypes
import _signal as signal
import _socket
import os
import select
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
TERM_GRACE_SECONDS = 0.5  # below the aggregator's own grace, so the guard finishes first
MARKER = "AGGREGATOR_GUARD_UPSTREAM"
MAX_MESSAGE = 4 * 1024 * 1024
MAX_ID = 18  # digits, as guard.c
MAX_FDS = 16  # received at most (more are closed by the kernel), as guard.c


class _Int(_ctypes._SimpleCData):  # ctypes.c_int, without importing ctypes
    _type_ = "i"


class _LibcFunction(_ctypes.CFuncPtr):  # what ctypes.CDLL(None, use_errno=True) makes of a C function
    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = _Int


class _Libc:
    _handle = _ctypes.dlopen(None, os.RTLD_NOW)  # type: ignore[arg-type]  # the program itself, as CDLL(None)


def libc_function(name: str) -> _LibcFunction:
    """The C library's function `name`, returning an int, with errno kept (`_ctypes.get_errno`): what
    `ctypes.CDLL(None, use_errno=True)` gives, without the `ctypes` package (0.25 MB of RSS; `heap.py`
    uses this too). AttributeError where the program has no such function."""
    return _LibcFunction((name, _Libc))  # type: ignore[arg-type]  # anything with a _handle will do


def _prctl(option: int, value: int) -> None:
    prctl = libc_function("prctl")
    if prctl(option, value, 0, 0, 0) != 0:
        raise OSError(_ctypes.get_errno(), f"prctl({option}) failed")


def _recv_fds(sock: _socket.socket, size: int, most: int) -> tuple[bytes, list[int], bool]:
    """One message, the descriptors that came with it (socket.recv_fds, close-on-exec), and whether it
    was cut (longer than `size`)."""
    data, ancillary, flags, _addr = sock.recvmsg(size, _socket.CMSG_SPACE(most * 4), _socket.MSG_CMSG_CLOEXEC)
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds += [int.from_bytes(payload[i : i + 4], sys.byteorder, signed=True) for i in range(0, usable, 4)]
    return data, fds, bool(flags & _socket.MSG_TRUNC)


def _children_map(zombies: set[int] | None = None) -> dict[int, list[int]]:
    """Parent → children, from /proc; `zombies` receives the pids of zombies (they can neither fork nor
    be ended again)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[1].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
        if zombies is not None and fields[0] == b"Z":
            zombies.add(int(entry))
    return children


def descendants(root: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """Every process below `root`, read from /proc (parents before children)."""
    children = _children_map() if children is None else children
    found: list[int] = []
    queue = list(children.get(root, []))
    while queue:
        pid = queue.pop(0)
        found.append(pid)
        queue.extend(children.get(pid, []))
    return found


def _reap() -> list[tuple[int, int]]:
    """Collect every exited child (adopted orphans included) without blocking: (pid, exit code)."""
    done: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        code = os.waitstatus_to_exitcode(status)
        done.append((pid, 128 - code if code < 0 else code))


def _kill(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:  # noqa: SIM105 - contextlib costs milliseconds of start-up here
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def end_tree(root: int) -> None:
    """SIGTERM everything below `root`, wait a little, then SIGKILL what is left, again at every look (what
    forked since the last one is ended too) until nothing is left or a second has passed; reap."""
    term_end = time.monotonic() + TERM_GRACE_SECONDS
    _kill(descendants(root), signal.SIGTERM)
    while True:
        _reap()
        below = descendants(root)
        now = time.monotonic()
        if not below or now >= term_end + 1.0:
            return
        if now >= term_end:
            _kill(below, signal.SIGKILL)
        time.sleep(0.02)


def _owner(pid: int, leaders: dict[int, str]) -> int | None:
    """The live upstream an adopted orphan belongs to: by its session, else by its environment's marker."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            session = int(fh.read().rsplit(b")", 1)[1].split()[3])
        if session in leaders:
            return session
        with open(f"/proc/{pid}/environ", "rb") as fh:
            environ = fh.read().split(b"\0")
    except (OSError, ValueError, IndexError):
        return None
    marks = {entry.split(b"=", 1)[1].decode() for entry in environ if entry.startswith(MARKER.encode() + b"=")}
    return next((leader for leader, mark in leaders.items() if mark in marks), None)


class Refused(ValueError):
    """A request that cannot be served; the id it carried, if one could be read."""

    def __init__(self, reason: str, ident: str | None) -> None:
        super().__init__(reason)
        self.ident = ident


def parse_request(data: bytes) -> tuple[str, list[str], dict[str, str], str | None]:
    """(id, argv, env, cwd) of a spawn request, or `Refused` with the same reasons as guard.c."""
    if not data.endswith(b"\0"):
        raise Refused("ValueError: a message ends with a NUL", None)
    fields = data[:-1].split(b"\0")
    ids = [field[1:] for field in fields if field[:1] == b"i"]
    ident = ids[0].decode() if ids and 0 < len(ids[0]) <= MAX_ID and ids[0].isdigit() else None
    if any(not field for field in fields):
        raise Refused("ValueError: an empty field", ident)
    if any(field[:1] not in (b"i", b"a", b"e", b"c") for field in fields):
        raise Refused("ValueError: an unknown field", ident)
    if len(ids) != 1 or ident is None:
        raise Refused("ValueError: a spawn request needs one decimal id", None)
    argv = [os.fsdecode(field[1:]) for field in fields if field[:1] == b"a"]
    if not argv:
        raise Refused("ValueError: a spawn request needs argv and three descriptors", ident)
    cwds = [os.fsdecode(field[1:]) for field in fields if field[:1] == b"c"]
    if len(cwds) > 1:
        raise Refused("ValueError: more than one working directory", ident)
    env: dict[str, str] = {}
    for field in fields:
        if field[:1] == b"e":
            name, equals, value = field[1:].partition(b"=")
            if not equals or not name:
                raise Refused("ValueError: an environment entry is not NAME=value", ident)
            env[os.fsdecode(name)] = os.fsdecode(value)
    env[MARKER] = ident
    return ident, argv, env, cwds[0] if cwds else None


def answer(*fields: tuple[str, object]) -> bytes:
    """One message to the aggregator: each (tag, value) as a field."""
    return b"".join(tag.encode() + str(value).encode(errors="replace") + b"\0" for tag, value in fields)


class Guard:
    """The guard's state: the live upstream leaders and the trees being ended."""

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self.leaders: dict[int, str] = {}  # leader pid -> marker
        self.ending: list[tuple[float, list[int]]] = []  # (SIGKILL deadline, pids sent SIGTERM)

    def send(self, message: bytes) -> None:
        try:  # noqa: SIM105
            self.sock.send(message)
        except OSError:  # the aggregator is gone: the main loop sees end-of-file next
            pass

    def spawn(self, data: bytes, fds: list[int]) -> None:
        ident: str | None = None
        try:
            ident, argv, env, cwd = parse_request(data)
            if len(fds) != 3:
                raise Refused("ValueError: a spawn request needs argv and three descriptors", ident)
            pid = os.fork()
        except Refused as exc:
            self.send(answer(*([("i", exc.ident)] if exc.ident else []), ("r", exc)))
        except OSError as exc:
            self.send(answer(("i", ident), ("r", f"OSError: fork: {exc.strerror}")))
        else:
            if pid == 0:
                _exec_upstream(argv, env, cwd, fds)
            self.leaders[pid] = ident
            self.send(answer(("i", ident), ("p", pid)))
        finally:
            for fd in fds:
                os.close(fd)

    def collect(self) -> None:
        """Report exited upstreams, then end the orphans no live upstream owns."""
        exited = False
        for pid, code in _reap():
            if self.leaders.pop(pid, None) is not None:
                self.send(answer(("x", pid), ("c", code)))
                exited = True
        if exited:
            self.end_strays()

    def end_strays(self, spared: set[int] | frozenset[int] = frozenset()) -> None:
        """SIGTERM the orphans no live upstream owns, SIGKILL them after a grace; `spared`: pids just sent
        SIGKILL (not ended twice)."""
        zombies: set[int] = set()
        children = _children_map(zombies)
        skip = zombies | set(spared) | set(self.leaders)
        strays = [pid for pid in children.get(os.getpid(), []) if pid not in skip]
        doomed: list[int] = []
        for pid in strays:
            if _owner(pid, self.leaders) is None:
                doomed += [pid, *descendants(pid, children)]
        if doomed:
            _kill(doomed, signal.SIGTERM)
            self.ending.append((time.monotonic() + TERM_GRACE_SECONDS, doomed))

    def finish_ending(self) -> None:
        """SIGKILL what is left of the trees whose grace is over: only pids still below the guard (one that
        ended, was reaped and was reused by another process is not ours); `collect` reaps them (it alone
        reaps while serving, so no upstream's exit is ever collected without being reported). Then look
        for strays again: a doomed process that forked during its grace and exited left its child to
        the guard, no longer below any doomed pid."""
        now = time.monotonic()
        due = [pids for deadline, pids in self.ending if deadline <= now]
        self.ending = [(deadline, pids) for deadline, pids in self.ending if deadline > now]
        if not due:
            return
        children = _children_map()
        below = set(descendants(os.getpid(), children))
        killed = {pid for pids in due for root in pids if root in below for pid in (root, *descendants(root, children))}
        _kill(sorted(killed), signal.SIGKILL)
        self.end_strays(killed)

    def timeout(self) -> float | None:
        if not self.ending:
            return None
        return max(0.0, min(deadline for deadline, _ in self.ending) - time.monotonic())


def _exec_upstream(argv: list[str], env: dict[str, str], cwd: str | None, fds: list[int]) -> None:
    """In the forked child: become the upstream (never returns)."""
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)  # SIGPIPE, SIGXFSZ: the interpreter ignores them, a program expects not
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if cwd is not None:
            os.chdir(cwd)
        os.execvpe(argv[0], argv, env)
    except BaseException as exc:
        try:  # noqa: SIM105
            os.write(2, f"aggregator-guard: cannot run {argv[0]}: {exc}\n".encode())
        except OSError:
            pass
    finally:
        os._exit(127)


def serve(guard: Guard) -> None:
    """Answer spawn requests and collect exits until the aggregator goes away."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    stopping: list[int] = []
    signal.signal(signal.SIGCHLD, lambda _s, _f: None)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _f: stopping.append(signum))
    poller = select.poll()
    poller.register(guard.sock.fileno(), select.POLLIN)
    poller.register(wake_read, select.POLLIN)
    while not stopping:
        timeout = guard.timeout()
        for fd, _ in poller.poll(None if timeout is None else timeout * 1000):
            if fd == guard.sock.fileno():
                try:
                    data, fds, truncated = _recv_fds(guard.sock, MAX_MESSAGE, MAX_FDS)
                except OSError:
                    data, fds, truncated = b"", [], False
                if not data or truncated:
                    for received in fds:
                        os.close(received)
                    if not data:
                        return
                    guard.send(answer(("r", "ValueError: the message is too long")))
                    continue
                guard.spawn(data, fds)
            else:
                try:  # noqa: SIM105
                    os.read(wake_read, 512)
                except OSError:
                    pass
        guard.collect()
        guard.finish_ending()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        sys.stderr.write("usage: guard.py PARENT_PID SOCKET_FD\n")
        return 2
    parent, fd = int(argv[1]), int(argv[2])
    sock = _socket.socket(fileno=fd)
    os.set_inheritable(fd, False)
    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    except OSError as exc:  # a sandbox refusing prctl: upstreams still end with the aggregator
        sys.stderr.write(f"aggregator-guard: {exc}; orphans of upstreams are not contained\n")
    if os.getppid() != parent:
        return 1  # the aggregator died before the guard started
    try:
        serve(Guard(sock))
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # finish the clean-up whatever arrives now
        end_tree(os.getpid())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
