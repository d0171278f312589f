"""One guard process for all of an aggregator's stdio upstreams (issue 24), with the containment of one
guard per upstream: an upstream's escaped processes end with it, not before and not later."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from aggregator.config import parse_config
from aggregator.upstream import guard_client
from aggregator.upstream.guard_client import guard_pid
from aggregator.upstream.pool import UpstreamPool
from tests.conftest import alive, kit_upstream, rpc, spawn_raw_aggregator, write_config

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the guard is Linux-only")


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


def test_every_upstream_runs_under_one_guard(tmp_path: Path) -> None:
    config = write_config(tmp_path, {name: kit_upstream() for name in ("a", "b", "c")})
    proc = spawn_raw_aggregator(config)
    try:
        pids = [_pid_of(proc, n, name) for n, name in enumerate(("a", "b", "c"), start=1)]
        guards = {_ppid(pid) for pid in pids}
        assert len(guards) == 1, guards
        (guard,) = guards
        assert "guard.py" in Path(f"/proc/{guard}/cmdline").read_text()
        assert _children(proc.pid) == [guard]  # the aggregator's only child
    finally:
        assert proc.stdin
        proc.stdin.close()
        proc.wait(timeout=30)
    assert _gone_within([*pids, guard]) == []


def test_an_upstreams_escaped_grandchild_ends_with_it_and_not_with_another(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"a": _escaping(tmp_path, "a"), "b": _escaping(tmp_path, "b")})
    proc = spawn_raw_aggregator(config)
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


def test_a_killed_guard_takes_its_upstreams_along_and_is_started_again(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"a": kit_upstream()})
    proc = spawn_raw_aggregator(config)
    try:
        first = _pid_of(proc, 1, "a")
        guard = _ppid(first)
        os.kill(guard, signal.SIGKILL)
        assert _gone_within([first]) == []
        deadline, request_id = time.monotonic() + 20, 10
        while True:  # the crash puts the upstream in backoff for a moment
            request_id += 1
            answer = _call(proc, request_id, "a", "pid")
            if not answer["result"].get("isError") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        second = int(answer["result"]["content"][0]["text"])
        assert second != first and _ppid(second) not in (guard, proc.pid)
    finally:
        assert proc.stdin
        proc.stdin.close()
        proc.wait(timeout=30)
    assert _gone_within([second]) == []


async def test_the_guard_goes_when_its_last_upstream_has_stopped_and_comes_back_for_the_next(tmp_path: Path) -> None:
    config = parse_config(json.dumps({"upstreams": {"a": kit_upstream(), "b": kit_upstream()}}), "test.yaml")
    async with UpstreamPool.running(config, tmp_path) as pool:
        await pool.call_tool("a", "echo", {"message": "x"})
        await pool.call_tool("b", "echo", {"message": "x"})
        first = guard_pid()
        assert first is not None and alive(first)
    assert _gone_within([first]) == []  # nothing left to guard: no idle guard process
    async with UpstreamPool.running(config, tmp_path) as pool:
        await pool.call_tool("a", "echo", {"message": "x"})
        second = guard_pid()
        assert second is not None and second != first and alive(second)
    assert _gone_within([second]) == []


def test_a_refused_start_leaves_no_idle_guard() -> None:
    guard = guard_client._guard()
    ends = [*os.pipe(), *os.pipe()]
    try:
        with pytest.raises(guard_client.GuardError, match="argv"):
            guard.spawn([], {}, None, ends[:3])  # the guard refuses a request without a command
    finally:
        for fd in ends:
            os.close(fd)
    assert _gone_within([guard.process.pid]) == []


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
