"""Run one upstream so that none of its processes outlives it or the aggregator (Linux).

Usage: ``python -I -S guard.py PARENT_PID COMMAND [ARGS...]``, started by the aggregator in
place of the upstream's command. Standard library only, and never imports the aggregator
package, so it starts in a few tens of milliseconds.

A process group is not enough: a grandchild that calls ``setsid()`` leaves it, and when
the aggregator is killed with SIGKILL nothing ends the group at all. So the guard

- marks itself a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): every orphan below it,
  daemonized or ``setsid()``-ed ones included, is re-parented to the guard, not to init,
  so the guard's process tree is exactly the upstream's processes;
- asks for SIGTERM when the aggregator dies (``PR_SET_PDEATHSIG``), however it dies;
- runs the command as its child (same stdin, stdout, stderr and environment), and when
  that child exits, or the guard is told to stop (SIGTERM, SIGINT, SIGHUP, the
  aggregator's death), ends its whole tree: SIGTERM, a short grace, SIGKILL.

It exits with the command's exit code (128 + signal if a signal ended it).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
TERM_GRACE_SECONDS = 0.5  # below the aggregator's own grace, so the guard finishes first


class _Stop(Exception):
    """Raised by the signal handlers to leave the wait loop."""


def _stop(signum: int, _frame: object) -> None:
    raise _Stop(signum)


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def descendants(root: int) -> list[int]:
    """Every process below `root`, read from /proc (parents before children)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(b")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    queue = list(children.get(root, []))
    while queue:
        pid = queue.pop(0)
        found.append(pid)
        queue.extend(children.get(pid, []))
    return found


def _reap() -> None:
    """Collect every exited child (adopted orphans included) without blocking."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def end_tree(root: int) -> None:
    """SIGTERM everything below `root`, wait a little, SIGKILL what is left, reap."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in descendants(root):
            try:  # noqa: SIM105 - contextlib costs milliseconds of start-up here
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + (TERM_GRACE_SECONDS if sig == signal.SIGTERM else 1.0)
        while time.monotonic() < deadline:
            _reap()
            if not descendants(root):
                return
            time.sleep(0.02)


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        sys.stderr.write("usage: guard.py PARENT_PID COMMAND [ARGS...]\n")
        return 2
    parent, command = int(argv[1]), argv[2:]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _stop)
    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError as exc:  # not Linux, or a sandbox refusing prctl: run unguarded
        sys.stderr.write(f"aggregator-guard: {exc}; running the upstream unguarded\n")
    if os.getppid() != parent:
        return 1  # the aggregator died before PR_SET_PDEATHSIG took effect
    code = 1
    try:
        child = os.fork()
        if child == 0:
            try:
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    signal.signal(sig, signal.SIG_DFL)
                os.execvp(command[0], command)
            except BaseException as exc:
                sys.stderr.write(f"aggregator-guard: cannot run {command[0]}: {exc}\n")
            finally:
                os._exit(127)
        while True:
            pid, status = os.wait()
            if pid == child:
                code = os.waitstatus_to_exitcode(status)
                code = 128 - code if code < 0 else code
                break
    except _Stop as stop:
        code = 128 + int(stop.args[0])
    except ChildProcessError:
        pass
    while True:
        try:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)  # finish the clean-up whatever arrives now
            end_tree(os.getpid())
            return code
        except _Stop:  # arrived before the handlers were replaced
            continue


if __name__ == "__main__":
    sys.exit(main(sys.argv))
