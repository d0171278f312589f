"""One guard process for all of an aggregator's stdio upstreams (issue 24), with the containment of one
guard per upstream: an upstream's escaped processes end with it, not before and not later. Every
containment test runs against both guards, `guard.py` and the C `guard.c` (docs/guard.md)."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.config import parse_config
from aggregator.upstream import guard as guard_module
from aggregator.upstream import guard_build, guard_client
from aggregator.upstream.guard_client import guard_kind, guard_pid
from aggregator.upstream.pool import UpstreamPool
from tests.conftest import alive, kit_upstream, rpc, spawn_raw_aggregator, write_config

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the guard is Linux-only")

NO_COMPILER = "no C compiler on PATH (cc, gcc, clang): the C guard cannot be built here, only the Python one runs"


@pytest.fixture(params=["c", "python"])
def guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which guard the test runs against (``AGGREGATOR_GUARD``); the C one built first, in the session's
    private cache (conftest), or skipped when there is no compiler."""
    if request.param == "c":
        if guard_build.compiler() is None:
            pytest.skip(NO_COMPILER)
        assert guard_build.build() is not None, "the C guard did not build (see the log)"
    monkeypatch.setenv("AGGREGATOR_GUARD", request.param)
    return str(request.param)


def _is_guard(pid: int, kind: str) -> bool:
    """`pid` runs the guard of that kind (the C one: this source's build)."""
    if kind == "c" and os.readlink(f"/proc/{pid}/exe") != str(guard_build.binary()):
        return False
    return guard_build.kind_of(pid) == kind


def _call(proc: subprocess.Popen[bytes], request_id: int, server: str, tool: str) -> dict[str, Any]:
    params = {"name": "catalog_call_tool", "arguments": {"server": server, "tool": tool, "arguments": {}}}
    return rpc(proc, request_id, "tools/call", params)


def _pid_of(proc: subprocess.Popen[bytes], request_id: int, server: str) -> int:
    return int(_call(proc, request_id, server, "pid")["result"]["content"][0]["text"])


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _children(pid: int) -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and _safe_ppid(int(entry)) == pid]


def _safe_ppid(pid: int) -> int | None:
    try:
        return _ppid(pid)
    except (OSError, IndexError):
        return None


def _gone_within(pids: list[int], seconds: float = 10) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


def _escaping(tmp_path: Path, name: str) -> dict[str, Any]:
    """An upstream whose grandchild calls setsid(): it leaves the upstream's session and group."""
    return kit_upstream("--spawn-grandchild", "--grandchild-setsid", "--pid-file", str(tmp_path / f"{name}.pid"))


def test_every_upstream_runs_under_one_guard(tmp_path: Path, guard: str) -> None:
    config = write_config(tmp_path, {name: kit_upstream() for name in ("a", "b", "c")})
    proc = spawn_raw_aggregator(config, AGGREGATOR_GUARD=guard)
    try:
        pids = [_pid_of(proc, n, name) for n, name in enumerate(("a", "b", "c"), start=1)]
        guards = {_ppid(pid) for pid in pids}
        assert len(guards) == 1, guards
        (guard_process,) = guards
        assert _is_guard(guard_process, guard)
        assert _children(proc.pid) == [guard_process]  # the aggregator's only child
    finally:
        assert proc.stdin
        proc.stdin.close()
        proc.wait(timeout=30)
    assert _gone_within([*pids, guard_process]) == []


def test_an_upstreams_escaped_grandchild_ends_with_it_and_not_with_another(tmp_path: Path, guard: str) -> None:
    config = write_config(tmp_path, {"a": _escaping(tmp_path, "a"), "b": _escaping(tmp_path, "b")})
    proc = spawn_raw_aggregator(config, AGGREGATOR_GUARD=guard)
    try:
        a, b = _pid_of(proc, 1, "a"), _pid_of(proc, 2, "b")
        a_grandchild, b_grandchild = (int((tmp_path / f"{n}.pid").read_text()) for n in ("a", "b"))
        assert os.getsid(a_grandchild) != os.getsid(a)  # it really left
        crashed = _call(proc, 3, "a", "crash")
        assert crashed["result"]["isError"] is True
        assert _gone_within([a, a_grandchild]) == []
        assert alive(b) and alive(b_grandchild)  # b's own escapee stays while b runs
        assert _pid_of(proc, 4, "b") == b
    finally:
        assert proc.stdin
        proc.stdin.close()
        proc.wait(timeout=30)
    assert _gone_within([b, b_grandchild]) == []


def test_a_killed_guard_takes_its_upstreams_along_and_is_started_again(tmp_path: Path, guard: str) -> None:
    config = write_config(tmp_path, {"a": kit_upstream()})
    proc = spawn_raw_aggregator(config, AGGREGATOR_GUARD=guard)
    try:
        first = _pid_of(proc, 1, "a")
        killed = _ppid(first)
        assert _is_guard(killed, guard)
        os.kill(killed, signal.SIGKILL)
        assert _gone_within([first]) == []
        deadline, request_id = time.monotonic() + 20, 10
        while True:  # the crash puts the upstream in backoff for a moment
            request_id += 1
            answer = _call(proc, request_id, "a", "pid")
            if not answer["result"].get("isError") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        second = int(answer["result"]["content"][0]["text"])
        assert second != first and _ppid(second) not in (killed, proc.pid) and _is_guard(_ppid(second), guard)
    finally:
        assert proc.stdin
        proc.stdin.close()
        proc.wait(timeout=30)
    assert _gone_within([second]) == []


async def test_the_guard_goes_when_its_last_upstream_has_stopped_and_comes_back_for_the_next(
    tmp_path: Path, guard: str
) -> None:
    config = parse_config(json.dumps({"upstreams": {"a": kit_upstream(), "b": kit_upstream()}}), "test.yaml")
    async with UpstreamPool.running(config, tmp_path) as pool:
        await pool.call_tool("a", "echo", {"message": "x"})
        await pool.call_tool("b", "echo", {"message": "x"})
        first = guard_pid()
        assert first is not None and alive(first) and guard_kind() == guard
    assert _gone_within([first]) == []  # nothing left to guard: no idle guard process
    async with UpstreamPool.running(config, tmp_path) as pool:
        await pool.call_tool("a", "echo", {"message": "x"})
        second = guard_pid()
        assert second is not None and second != first and alive(second)
    assert _gone_within([second]) == []


@pytest.mark.parametrize(
    ("argv", "env", "refusal"),
    [
        ([], {}, "argv is empty"),
        (["true"], {"A=B": "1"}, "not an environment variable name"),
        (["tr\0ue"], {}, "cannot hold a NUL"),
    ],
)
def test_a_refused_start_leaves_no_idle_guard(guard: str, argv: list[str], env: dict[str, str], refusal: str) -> None:
    running = guard_client._guard()
    ends = [*os.pipe(), *os.pipe()]
    try:
        with pytest.raises(guard_client.GuardError, match=refusal):
            running.spawn(argv, env, None, ends[:3])
    finally:
        for fd in ends:
            os.close(fd)
    assert _gone_within([running.process.pid]) == []


def test_the_guard_imports_no_python_wrapper_of_the_c_modules_it_uses() -> None:
    """Its RSS counts fully in the aggregator's own memory (issue 24): `socket`, `signal`, `selectors`
    and `ctypes` would bring `enum` and more (1.5 MB); the guard runs on `_socket`, `_signal`,
    `select` and `_ctypes`, and its prctl through `_ctypes` works (it marks itself a subreaper)."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import guard; before = set(sys.modules); "
        "guard._prctl(guard.PR_SET_CHILD_SUBREAPER, 1); "
        "print(' '.join(sorted(set(sys.modules) - set(sys.builtin_module_names) - before)), '|', "
        "' '.join(sorted(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script, str(guard_client.GUARD.parent)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    late, loaded = done.stdout.split("|")
    assert late.strip() == ""  # prctl imported nothing more
    assert not set(loaded.split()) & {"socket", "signal", "selectors", "ctypes", "enum", "aggregator"}, loaded


DAEMONIZE = """
import os, signal, sys
pid_file, rest = sys.argv[1], sys.argv[2:]
if os.fork() == 0:  # the classic daemon: fork, setsid, fork, the middle one exits
    os.setsid()
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in range(3):
            os.dup2(null, fd)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # and a stubborn one: only SIGKILL ends it
        with open(pid_file + ".tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.replace(pid_file + ".tmp", pid_file)
        os.execvp("sleep", ["sleep", "300"])
    os._exit(0)
os.wait()
os.execv(sys.executable, [sys.executable, *rest])
"""


def test_nothing_outlives_kill_9_of_the_aggregator_not_even_a_daemon(tmp_path: Path, guard: str) -> None:
    """An upstream that ignores EOF and SIGTERM and leaves a double-forked, setsid()-ed daemon that ignores
    SIGTERM too: after `kill -9` of the aggregator the guard ends both (it adopted the daemon)."""
    pid_file = tmp_path / "daemon.pid"
    kit = kit_upstream("--ignore-term")
    upstream = {"command": sys.executable, "args": ["-c", DAEMONIZE, str(pid_file), *kit["args"]]}
    proc = spawn_raw_aggregator(write_config(tmp_path, {"d": upstream}), AGGREGATOR_GUARD=guard)
    try:
        upstream_pid = _pid_of(proc, 1, "d")
        daemon = int(pid_file.read_text())
        guard_process = _ppid(upstream_pid)
        assert _is_guard(guard_process, guard)
        assert _ppid(daemon) == guard_process  # adopted: the guard is a subreaper
        assert os.getsid(daemon) not in (os.getsid(upstream_pid), daemon)  # its own session, not a leader
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert _gone_within([upstream_pid, daemon, guard_process]) == []


FORKS_IN_ITS_GRACE = """
import os, signal, sys
pid_file, rest = sys.argv[1], sys.argv[2:]
if os.fork() == 0:  # an orphan-to-be in its own session; on SIGTERM it forks a child and exits
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in range(3):
        os.dup2(null, fd)

    def fork_and_go(_signum, _frame):
        if os.fork() == 0:  # left to the guard, below no process it is ending; deaf to SIGTERM
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            with open(pid_file + ".tmp", "w") as fh:
                fh.write(str(os.getpid()))
            os.replace(pid_file + ".tmp", pid_file)
            os.execvp("sleep", ["sleep", "300"])
        os._exit(0)

    signal.signal(signal.SIGTERM, fork_and_go)
    while True:
        signal.pause()
os.execv(sys.executable, [sys.executable, *rest])
"""


def test_an_orphan_that_forks_during_its_grace_leaves_nothing_behind(tmp_path: Path, guard: str) -> None:
    """The guard ends an exited upstream's orphan (SIGTERM, a grace, SIGKILL); the orphan forks on SIGTERM
    and exits, so its child is the guard's, below nothing being ended: it is found and ended too, while
    the aggregator and another upstream go on."""
    pid_file = tmp_path / "forked.pid"
    kit = kit_upstream()
    upstream = {"command": sys.executable, "args": ["-c", FORKS_IN_ITS_GRACE, str(pid_file), *kit["args"]]}
    proc = spawn_raw_aggregator(write_config(tmp_path, {"a": upstream, "b": kit_upstream()}), AGGREGATOR_GUARD=guard)
    try:
        b = _pid_of(proc, 1, "b")
        a = _pid_of(proc, 2, "a")
        assert _call(proc, 3, "a", "crash")["result"]["isError"] is True
        deadline = time.monotonic() + 10
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        forked = int(pid_file.read_text())
        assert _gone_within([a, forked], 5) == []
        assert alive(b) and _pid_of(proc, 4, "b") == b
    finally:
        assert proc.stdin
        proc.stdin.close()
        proc.wait(timeout=30)


LEAVES_AN_ORPHAN = """
import os, signal, sys, time
if os.fork() == 0:  # an orphan in its own session that SIGTERM ends at once
    os.setsid()
    with open(sys.argv[1] + ".tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    while True:
        signal.pause()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
"""


def test_a_doomed_pid_reused_by_another_process_is_not_killed(guard: str, tmp_path: Path) -> None:
    """An exited upstream's orphan is sent SIGTERM and dies at once; its pid, freed, is taken by a process
    that is not the guard's before the grace is over: the guard does not SIGKILL it. The pid is reused on
    purpose (/proc/sys/kernel/ns_last_pid, which needs root), else the test skips."""
    ns_last_pid = Path("/proc/sys/kernel/ns_last_pid")
    if not os.access(ns_last_pid, os.W_OK):
        pytest.skip("reusing a pid on purpose needs a writable /proc/sys/kernel/ns_last_pid (root)")
    pid_file = tmp_path / "orphan.pid"
    process, sock = _raw_guard()
    stranger = None
    try:
        request = guard_client.encode_request(
            1, [sys.executable, "-c", LEAVES_AN_ORPHAN, str(pid_file)], {"PATH": os.environ["PATH"]}, None
        )
        ends = [*os.pipe(), *os.pipe()]
        socket.send_fds(sock, [request], ends[:3])
        for fd in ends:
            os.close(fd)
        assert any("x" in m for m in _answers(sock, 30))  # the upstream exited: its orphan gets SIGTERM now
        orphan = int(pid_file.read_text())
        deadline = time.monotonic() + 0.3
        while os.path.exists(f"/proc/{orphan}") and time.monotonic() < deadline:
            time.sleep(0.002)  # until the guard reaped it: the pid is free, its grace not over
        assert not os.path.exists(f"/proc/{orphan}")
        ns_last_pid.write_text(str(orphan - 1))
        stranger = subprocess.Popen(["sleep", "30"])
        if stranger.pid != orphan:
            pytest.skip(f"another process took pid {orphan} first")
        time.sleep(guard_module.TERM_GRACE_SECONDS + 0.5)
        assert stranger.poll() is None, "the guard killed a process that is not its own"
    finally:
        if stranger is not None:
            stranger.kill()
            stranger.wait()
        sock.close()
        process.wait(timeout=10)


def test_the_python_guard_does_not_end_a_pid_no_longer_below_it() -> None:
    """A doomed pid that ended and was reused by an unrelated process when its grace is over: the guard
    kills only what is still below it (here the "reused" pid is a process outside its tree: the guard
    runs in a process of its own, the stranger is this test's child)."""
    stranger = subprocess.Popen(["sleep", "30"])
    script = (
        "import sys, time, _socket; sys.path.insert(0, sys.argv[1]); import guard; "
        "keeper = guard.Guard(_socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)); "
        "keeper.ending.append((0.0, [int(sys.argv[2])])); keeper.finish_ending(); print(keeper.ending)"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", script, str(guard_client.GUARD.parent), str(stranger.pid)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr
        time.sleep(0.1)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


# ---------------------------------------------------------------- the wire, from an attacker's side


def _raw_guard() -> tuple[subprocess.Popen[bytes], socket.socket]:
    """The guard `AGGREGATOR_GUARD` chooses, started as the client starts it, its socket ours to abuse."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with theirs:
        process = guard_client._start(guard_build.choose(start_build=False), theirs)
    return process, ours


def _answers(sock: socket.socket, until: float = 5.0) -> list[dict[str, str]]:
    """The guard's messages until a refusal or an exit report (or `until` seconds)."""
    found: list[dict[str, str]] = []
    deadline = time.monotonic() + until
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sock], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        data = sock.recv(65536)
        assert data, "the guard closed its socket"
        found.append(guard_client.decode_answer(data))
        if any("r" in m or "x" in m for m in found):  # a refusal, or the exit that follows a pid
            break
    return found


SAFE_COMMANDS = [b"true", b"/nonexistent/aggregator-fuzz", b"./no-such-program"]
CLEAN_FIELDS = st.one_of(
    st.tuples(st.just(b"a"), st.binary(max_size=20)),
    st.tuples(
        st.just(b"e"),
        st.one_of(
            st.sampled_from([b"A=B", b"=x", b"NOEQ", b"AGGREGATOR_GUARD_UPSTREAM=9", b"PATH=/usr/bin:/bin", b"X="]),
            st.from_regex(rb"\A[A-Z_]{1,8}=[^\x00]{0,12}\Z"),
        ),
    ),
    st.tuples(st.just(b"c"), st.sampled_from([b"/", b"/tmp", b"/nonexistent", b"", b"\xff"])),
)
JUNK_FIELDS = st.one_of(
    st.tuples(st.just(b"i"), st.one_of(st.from_regex(rb"\A[0-9]{1,20}\Z"), st.binary(max_size=4))),
    st.tuples(st.sampled_from([b"x", b"p", b"r", b"\xff", b""]), st.binary(max_size=8)),
)


@st.composite
def hostile_messages(draw: st.DrawFn) -> bytes:
    """Plain bytes, or field runs near the format: bad, many or no ids, unknown tags, empty fields,
    entries that are not NAME=value, more than one directory, no final NUL. The first word of argv is
    always one of SAFE_COMMANDS, so a message that passes runs nothing harmful."""
    kind = draw(st.integers(0, 5))
    if kind == 0:
        data = draw(st.binary(min_size=1, max_size=300))
        return b"b" + data[1:].replace(b"\0a", b"\0b") if data[:1] == b"a" else data.replace(b"\0a", b"\0b")
    fields = draw(st.lists(CLEAN_FIELDS if kind > 1 else st.one_of(CLEAN_FIELDS, JUNK_FIELDS), max_size=8))
    ident = draw(st.from_regex(rb"\A[0-9]{1,19}\Z"))
    fields.insert(draw(st.integers(0, len(fields))), (b"i", ident))
    words = [tag + value.replace(b"\0", b"") for tag, value in fields]
    commands = [i for i, word in enumerate(words) if word[:1] == b"a"]
    if commands:
        words[commands[0]] = b"a" + draw(st.sampled_from(SAFE_COMMANDS))
    return b"\0".join(words) + (b"" if draw(st.integers(0, 19)) == 0 else b"\0")


def _run_one(sock: socket.socket, ident: int, code: int) -> None:
    """A good request over the raw socket: the guard answers its pid, then its exit code."""
    ends = [*os.pipe(), *os.pipe()]
    request = guard_client.encode_request(ident, ["sh", "-c", f"exit {code}"], {"PATH": os.environ["PATH"]}, None)
    socket.send_fds(sock, [request], ends[:3])
    for fd in ends:
        os.close(fd)
    answers = _answers(sock, 30)
    assert answers[0]["i"] == str(ident) and any(m.get("c") == str(code) for m in answers), answers


def _expected(message: bytes, descriptors: int) -> tuple[str | None, str | None]:
    """(id, refusal) both guards must answer, by `guard.py`'s parser; refusal None: it runs."""
    try:
        ident = guard_module.parse_request(message)[0]
    except guard_module.Refused as refused:
        return refused.ident, str(refused)
    return ident, None if descriptors == 3 else "ValueError: a spawn request needs argv and three descriptors"


def _held(pid: int) -> list[str]:
    """What a process's descriptors point at, sorted, but the /proc directories its scans open for a
    moment (on a loaded machine with many processes a scan lasts long enough to be seen again and again)."""
    targets = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed meanwhile
            continue
        if not target.startswith("/proc"):
            targets.append(target)
    return sorted(targets)


def test_a_hostile_or_truncated_message_is_refused_and_the_guard_goes_on(guard: str) -> None:
    """Fuzzed over the real socket: every message gets an answer, the same from both guards (a refusal
    with the reason `guard.py`'s parser gives, or a pid and then its exit), the guard neither crashes
    nor keeps a descriptor or a child, and serves a good request after."""
    process, sock = _raw_guard()
    try:
        _run_one(sock, 6, 0)  # the baseline once the guard is up, however loaded the machine is, and idle:
        sock.send(b"junk")  # its answer to this comes after the /proc scan that followed that exit
        assert _answers(sock, 30) == [{"r": "ValueError: a message ends with a NUL"}]
        baseline = _held(process.pid)

        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
        @given(message=hostile_messages(), descriptors=st.one_of(st.just(3), st.integers(0, 20)))
        def one(message: bytes, descriptors: int) -> None:
            ends = [os.open(os.devnull, os.O_RDWR) for _ in range(descriptors)]
            try:
                socket.send_fds(sock, [message], ends)
            finally:
                for fd in ends:
                    os.close(fd)
            answers = _answers(sock)
            assert answers, f"no answer to {message!r}"
            ident, refusal = _expected(message, descriptors)
            assert answers[0].get("i") == ident and answers[0].get("r") == refusal, (message, answers)
            if refusal is None:  # it was a good request: its exit is reported too
                assert any(m.get("x") == answers[0]["p"] for m in answers), answers
            assert process.poll() is None, "the guard exited"

        one()
        deadline = time.monotonic() + 5  # the guard answers first and closes the last message's descriptors after
        while _held(process.pid) != baseline and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _held(process.pid) == baseline  # no descriptor kept
        assert _children(process.pid) == []  # no child kept
        _run_one(sock, 7, 5)
    finally:
        sock.close()
        assert process.wait(timeout=10) == 0


def test_the_marker_names_the_request_and_no_other_value_survives(guard: str, tmp_path: Path) -> None:
    """Both guards set AGGREGATOR_GUARD_UPSTREAM to the request's id, whatever the request's env said,
    and hand over the environment, argv and directory exactly (bytes that are not UTF-8 included)."""
    process, sock = _raw_guard()
    out = tmp_path / "out"
    try:
        env = {"PATH": os.environ["PATH"], "AGGREGATOR_GUARD_UPSTREAM": "forged", "ODD": "\udcff-é"}
        script = 'printf "%s|%s|%s|%s" "$AGGREGATOR_GUARD_UPSTREAM" "$ODD" "$1" "$(pwd)" > "$0"'
        request = guard_client.encode_request(42, ["sh", "-c", script, str(out), "x y"], env, str(tmp_path))
        ends = [*os.pipe(), *os.pipe()]
        socket.send_fds(sock, [request], ends[:3])
        for fd in ends:
            os.close(fd)
        answers = _answers(sock)
        assert any(m.get("c") == "0" for m in answers), answers
        assert out.read_bytes() == b"42|\xff-\xc3\xa9|x y|" + bytes(tmp_path)
    finally:
        sock.close()
        process.wait(timeout=10)


@pytest.mark.parametrize("by_path", [False, True], ids=["by-name-with-slash", "found-on-path"])
def test_a_script_without_shebang_is_not_run_through_sh(guard: str, tmp_path: Path, by_path: bool) -> None:
    """Both guards run a command as os.execvpe does (what users had): a file the kernel cannot execute is
    an error (exit 127, the reason on its stderr), not handed to /bin/sh as execvp would."""
    script = tmp_path / "no-shebang"
    ran = tmp_path / "ran"
    script.write_text(f"touch {ran}\n")
    script.chmod(0o755)
    errors = tmp_path / "stderr"
    process, sock = _raw_guard()
    try:
        env = {"PATH": f"{tmp_path / 'missing'}:{tmp_path}:/usr/bin:/bin"}
        request = guard_client.encode_request(3, [script.name if by_path else str(script)], env, None)
        with errors.open("wb") as sink:
            ends = [*os.pipe(), *os.pipe()]
            socket.send_fds(sock, [request], [ends[0], ends[3], sink.fileno()])
            for fd in ends:
                os.close(fd)
        answers = _answers(sock, 30)
        assert any(m.get("c") == "127" for m in answers), answers
        assert not ran.exists()
        assert "Exec format error" in errors.read_text()
    finally:
        sock.close()
        process.wait(timeout=10)


# ---------------------------------------------------------------- how the C guard comes to exist


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache with no C guard built yet, and no background build of an earlier test in this process."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(guard_build, "_builder", guard_build._Builder())
    return tmp_path / "cache" / "aggregator" / "guard"


def _needs_compiler() -> None:
    if guard_build.compiler() is None:
        pytest.skip(NO_COMPILER)


def test_without_a_compiler_the_python_guard_runs_and_one_line_says_why(tmp_path: Path, fresh_cache: Path) -> None:
    config = write_config(tmp_path, {"a": kit_upstream(), "b": kit_upstream()})
    errors = tmp_path / "stderr"
    with errors.open("wb") as sink:
        proc = spawn_raw_aggregator(
            config, stderr=sink, PATH=str(tmp_path / "empty"), CC="", AGGREGATOR_LOG_LEVEL="info"
        )
        try:
            pids = [_pid_of(proc, 1, "a"), _pid_of(proc, 2, "b")]
            assert _is_guard(_ppid(pids[0]), "python")
        finally:
            assert proc.stdin
            proc.stdin.close()
            proc.wait(timeout=30)
    lines = [line for line in errors.read_text().splitlines() if "guard" in line]
    assert len(lines) == 1 and "no C compiler" in lines[0], lines
    assert not fresh_cache.exists() or not any(fresh_cache.glob("guard-*"))


@pytest.mark.parametrize(
    "compiler",
    [
        "echo 'cc1: internal compiler error: broken' >&2; exit 1",  # a compile error
        'while [ "$1" != -o ]; do shift; done; echo garbage > "$2"; chmod +x "$2"',  # a binary that does not run
    ],
)
def test_a_broken_compiler_leaves_the_python_guard_and_is_not_tried_again(
    tmp_path: Path, fresh_cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, compiler: str
) -> None:
    fake = tmp_path / "fake-cc"
    fake.write_text(f"#!/bin/sh\n{compiler}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    caplog.set_level("INFO", logger="aggregator")
    assert guard_build.build() is None
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "C guard not built" in warnings[0].getMessage()
    choice = guard_build.choose(start_build=True)  # the failure is remembered: no background build
    assert choice.kind == "python" and "failed to build" in choice.reason, choice
    from aggregator.cli.doctor import check_guard

    assert check_guard().level == "note" and "aggregator install" in check_guard().fix
    assert guard_build._builder.thread is None
    assert sorted(p.name for p in fresh_cache.iterdir()) == [".build.lock", f"guard-{guard_build.source_key()}.failed"]


def test_two_builds_at_once_both_end_with_one_working_binary(tmp_path: Path, fresh_cache: Path) -> None:
    _needs_compiler()
    script = "from aggregator.upstream import guard_build as b; print(b.build())"
    builds = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=dict(os.environ))
        for _ in range(2)
    ]
    paths = {build.communicate(timeout=120)[0].strip() for build in builds}
    assert paths == {str(guard_build.binary())}
    done = subprocess.run([str(guard_build.binary()), "--version"], capture_output=True, text=True, timeout=10)
    assert done.stdout.strip() == f"aggregator-guard {guard_build.source_key()}"
    assert sorted(p.name for p in fresh_cache.iterdir()) == [".build.lock", guard_build.binary().name]


def test_a_binary_built_from_another_source_is_not_used(
    tmp_path: Path, fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _needs_compiler()
    older = tmp_path / "guard.c"
    older.write_text(guard_build.SOURCE.read_text() + "\n/* an older guard */\n")
    with monkeypatch.context() as patch:
        patch.setattr(guard_build, "SOURCE", older)
        guard_build.source_key.cache_clear()
        stale = guard_build.build()
    guard_build.source_key.cache_clear()
    assert stale is not None and stale.exists() and stale != guard_build.binary()
    assert guard_build.built() is None
    monkeypatch.setenv("AGGREGATOR_GUARD", "auto")
    assert guard_build.choose(start_build=False).kind == "python"


def test_the_background_build_makes_the_next_start_use_the_c_guard(
    fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _needs_compiler()
    builder = guard_build._Builder()
    monkeypatch.setattr(guard_build, "_builder", builder)
    monkeypatch.setattr(guard_build, "BUILD_DELAY_SECONDS", 0.0)
    first = guard_build.choose(start_build=True)
    assert first.kind == "python" and "background" in first.reason
    assert builder.thread is not None
    builder.thread.join(120)
    assert guard_build.choose(start_build=True).kind == "c"


def _hanging_background_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> guard_build._Builder:
    """A background builder of its own, starting at once, with a compiler that never finishes."""
    slow = tmp_path / "slow-cc"
    slow.write_text("#!/bin/sh\nexec sleep 300\n")
    slow.chmod(0o755)
    monkeypatch.setenv("CC", str(slow))
    builder = guard_build._Builder()
    monkeypatch.setattr(guard_build, "_builder", builder)
    monkeypatch.setattr(guard_build, "BUILD_DELAY_SECONDS", 0.0)
    return builder


def test_a_background_build_still_running_at_exit_is_killed(
    tmp_path: Path, fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builder = _hanging_background_build(tmp_path, monkeypatch)
    guard_build.choose(start_build=True)
    deadline = time.monotonic() + 10
    while not builder.running and time.monotonic() < deadline:
        time.sleep(0.02)
    (compiling,) = builder.running
    started = time.monotonic()
    guard_build.stop_background_build()
    assert time.monotonic() - started < 5 and compiling.poll() is not None
    assert builder.thread is not None and not builder.thread.is_alive()
    assert not list(fresh_cache.glob(".guard-*.tmp"))
    assert not list(fresh_cache.glob("*.failed"))  # a stopped build is not a failed one


def test_doctor_says_which_guard_runs_and_why(
    tmp_path: Path, fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aggregator.cli.doctor import check_guard

    with monkeypatch.context() as patch:
        patch.setenv("PATH", str(tmp_path / "empty"))
        patch.setenv("CC", "")
        finding = check_guard()
    assert finding.level == "ok" and "Python guard" in finding.detail and "no C compiler" in finding.detail
    assert "install one" in finding.detail
    monkeypatch.setenv("AGGREGATOR_GUARD", "python")
    finding = check_guard()
    assert "AGGREGATOR_GUARD=python" in finding.detail and finding.fix == ""
    if guard_build.compiler() is None:
        pytest.skip(NO_COMPILER)
    monkeypatch.setenv("AGGREGATOR_GUARD", "auto")
    assert "not built yet" in check_guard().detail
    assert not fresh_cache.exists() or not list(fresh_cache.glob("guard-*"))  # doctor asked; it built nothing
    guard_build.build()
    finding = check_guard()
    assert finding.level == "ok" and str(guard_build.binary()) in finding.detail


def test_install_builds_the_c_guard_so_the_first_session_has_it(tmp_path: Path, fresh_cache: Path) -> None:
    _needs_compiler()
    from tests.test_install import CLIENT_FILES, Home

    home = Home(tmp_path, "cursor", CLIENT_FILES["cursor"][1])
    done = home.run("install", "cursor")
    assert done.returncode == 0, done.stderr
    assert f"guard: C (built at {guard_build.binary()})" in done.stdout
    assert guard_build.built() is not None


def test_a_background_build_leaves_a_build_in_progress_to_its_builder(
    tmp_path: Path, fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holds the build lock: the background build neither waits for it nor compiles,
    so nothing delays this aggregator's exit."""
    import fcntl

    _needs_compiler()
    fresh_cache.mkdir(parents=True)
    with open(fresh_cache / ".build.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        builder = guard_build._Builder()
        monkeypatch.setattr(guard_build, "_builder", builder)
        monkeypatch.setattr(guard_build, "BUILD_DELAY_SECONDS", 0.0)
        guard_build.choose(start_build=True)
        assert builder.thread is not None
        builder.thread.join(5)
        assert not builder.thread.is_alive() and guard_build.built() is None
    assert not list(fresh_cache.glob(".guard-*.tmp"))


def _plant(fresh_cache: Path, content: bytes, mode: int = 0o700) -> Path:
    """A file where the C guard's binary goes, in a cache directory as the build makes it."""
    fresh_cache.mkdir(parents=True)
    fresh_cache.chmod(0o700)
    path = guard_build.binary()
    path.write_bytes(content)
    path.chmod(mode)
    return path


async def _first_guard_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str = "auto") -> list[str]:
    """The kind of guard two upstreams, one after the other, run under (the second: after a fall-back)."""
    monkeypatch.setenv("AGGREGATOR_GUARD", mode)
    config = parse_config(json.dumps({"upstreams": {"a": kit_upstream(), "b": kit_upstream()}}), "test.yaml")
    kinds = []
    async with UpstreamPool.running(config, tmp_path) as pool:
        for name in ("a", "b"):
            await pool.call_tool(name, "echo", {"message": "x"})
            kinds.append(str(guard_kind()))
    return kinds


@pytest.mark.parametrize("content", [b"not a program\n", b""], ids=["not-a-program", "empty"])
async def test_a_c_guard_that_does_not_start_falls_back_to_the_python_guard(
    tmp_path: Path,
    fresh_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    content: bytes,
) -> None:
    """The binary is there but cannot run (here: not a program, or empty as a crash during its build could
    leave it; a cache remounted noexec is the same): the upstream still starts, under the Python guard,
    one log line says why, and the binary is removed so that the next build makes a good one."""
    _plant(fresh_cache, content)
    caplog.set_level("INFO", logger="aggregator")
    assert await _first_guard_kind(tmp_path, monkeypatch) == ["python", "python"]
    lines = [r.getMessage() for r in caplog.records if "does not start" in r.getMessage()]
    assert len(lines) == 1, lines
    assert not guard_build.binary().exists()
    assert not list(fresh_cache.glob("*.failed"))  # rebuilt by the next start, not given up on


EXITS_AT_ONCE = b"""#!/bin/sh
echo "$0: /lib/x86_64-linux-gnu/libc.so.6: version 'GLIBC_2.99' not found" >&2
exit 1
"""


async def test_a_c_guard_that_exits_before_its_first_answer_falls_back_to_the_python_guard(
    tmp_path: Path, fresh_cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """It starts, then exits at once (a dynamically linked guard on a host with an older glibc): the
    upstream starts under the Python guard, which runs for the rest of the process; one log line; the
    failure marker keeps later starts from building it again with the same compiler."""
    _needs_compiler()
    _plant(fresh_cache, EXITS_AT_ONCE)
    caplog.set_level("INFO", logger="aggregator")
    assert await _first_guard_kind(tmp_path, monkeypatch, "c") == ["python", "python"]
    lines = [r.getMessage() for r in caplog.records if "does not start" in r.getMessage()]
    assert len(lines) == 1 and "exited at once" in lines[0], lines
    assert not guard_build.binary().exists() and list(fresh_cache.glob("*.failed"))
    choice = guard_build.choose(start_build=True)
    assert choice.kind == "python" and "does not start" in choice.reason


def test_the_binary_is_keyed_by_the_c_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dynamically linked guard built under one glibc is never run under another (a home shared by two hosts)."""
    ours = guard_build.source_key()
    try:
        guard_build.source_key.cache_clear()
        with monkeypatch.context() as patch:
            patch.setattr(guard_build, "libc", lambda: "glibc 2.17")
            assert guard_build.source_key() != ours
    finally:
        guard_build.source_key.cache_clear()
    assert guard_build.libc() == os.confstr("CS_GNU_LIBC_VERSION")


def test_guard_c_checks_the_failure_marker_and_builds_at_most_once_per_process(
    tmp_path: Path, fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AGGREGATOR_GUARD=c builds at a start that finds no binary (the start waits for it), but a compiler
    that failed is not run again (its marker), and one that hangs is waited for once, not once per flag set."""
    calls = tmp_path / "calls"
    fake = tmp_path / "fake-cc"
    fake.write_text(f"#!/bin/sh\necho run >> {calls}\necho 'cc1: broken' >&2; exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setenv("AGGREGATOR_GUARD", "c")
    for _ in range(3):
        choice = guard_build.choose(start_build=True)
        assert choice.kind == "python" and "failed to build" in choice.reason, choice
    assert len(calls.read_text().splitlines()) == len(guard_build.CFLAGS)  # one build; later starts read the marker
    (fresh_cache / f"guard-{guard_build.source_key()}.failed").unlink()
    fake.write_text(f"#!/bin/sh\necho run >> {calls}\nexec sleep 300\n")  # a new compiler: tried, and it hangs
    calls.unlink()
    monkeypatch.setattr(guard_build, "BUILD_TIMEOUT_SECONDS", 0.5)
    monkeypatch.setattr(guard_build, "_built_now", set())
    started = time.monotonic()
    assert guard_build.choose(start_build=True).kind == "python"
    assert guard_build.choose(start_build=True).kind == "python"
    assert time.monotonic() - started < 5 and len(calls.read_text().splitlines()) == 1


@pytest.mark.parametrize("planted", ["group-writable", "symlink", "folder-writable"])
def test_a_planted_binary_is_not_run(
    tmp_path: Path, fresh_cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, planted: str
) -> None:
    """A guard binary someone else could have written (group or others may write it or its directory, or
    it is a symlink) is never run: the Python guard runs, one warning says why."""
    evidence = tmp_path / "ran"
    program = f"#!/bin/sh\ntouch {evidence}\nexit 1\n".encode()
    if planted == "symlink":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.write_bytes(program)
        elsewhere.chmod(0o700)
        _plant(fresh_cache, b"").unlink()
        guard_build.binary().symlink_to(elsewhere)
    else:
        _plant(fresh_cache, program, 0o720 if planted == "group-writable" else 0o700)
        if planted == "folder-writable":
            fresh_cache.chmod(0o777)
    monkeypatch.setenv("AGGREGATOR_GUARD", "auto")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no compiler: nothing rebuilds it meanwhile
    monkeypatch.setenv("CC", "")
    caplog.set_level("INFO", logger="aggregator")
    for _ in range(2):
        assert guard_build.built() is None
        assert guard_build.choose(start_build=True).kind == "python"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "C guard not used" in warnings[0], warnings
    assert not evidence.exists()


def test_a_background_build_ended_while_its_compiler_starts_kills_it(
    tmp_path: Path, fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The aggregator exits (`end`) between the compiler's start and its being held by the build's owner:
    the compiler is killed all the same, and the build returns at once."""
    builder = _hanging_background_build(tmp_path, monkeypatch)
    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def ended_meanwhile(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        process = real_popen(*args, **kwargs)
        started.append(process)
        import threading

        threading.Thread(target=builder.end, args=(10.0,), daemon=True).start()
        builder.stop.wait(5)
        time.sleep(0.2)  # `end` has looked at what the build holds: nothing yet
        return process

    monkeypatch.setattr(guard_build.subprocess, "Popen", ended_meanwhile)
    guard_build.choose(start_build=True)
    assert builder.thread is not None
    builder.thread.join(5)
    monkeypatch.undo()
    assert not builder.thread.is_alive(), "the build waits for a compiler nobody kills"
    (compiling,) = started
    assert compiling.poll() is not None
    assert not list(fresh_cache.glob(".guard-*.tmp")) and not list(fresh_cache.glob("*.failed"))


def test_a_cache_that_cannot_be_written_is_one_line_not_a_warning_at_every_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The cache cannot hold a build (here below a file; a read-only home is the same): no build is
    tried, so nothing warns at every start; the choice, logged once per process, says why."""
    _needs_compiler()
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file" / "cache"))
    builder = guard_build._Builder()
    monkeypatch.setattr(guard_build, "_builder", builder)
    monkeypatch.setattr(guard_build, "BUILD_DELAY_SECONDS", 0.0)
    caplog.set_level("INFO", logger="aggregator")
    for mode in ("auto", "c"):
        monkeypatch.setenv("AGGREGATOR_GUARD", mode)
        choice = guard_build.choose(start_build=True)
        assert choice.kind == "python" and "is not a directory" in choice.reason, choice
    assert builder.thread is None
    assert [r for r in caplog.records if r.levelname == "WARNING"] == []
