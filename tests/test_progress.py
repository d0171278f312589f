"""Progress lines: on stderr when it is a terminal, nothing extra when it is not."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

from tests.conftest import aggregator_env, kit_upstream, write_config
from tests.test_cli import run_cli


def run_with_terminal_stderr(*args: str) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal (stdout stays a pipe); returns (code, stdout, terminal)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "aggregator", *args],
        stdout=subprocess.PIPE,
        stderr=slave,
        stdin=subprocess.DEVNULL,
        env=aggregator_env(TERM="xterm", COLUMNS="100"),
    )
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the slave side closed: the process ended
            break
        if not chunk:
            break
        seen += chunk
    out = proc.stdout.read().decode() if proc.stdout else ""
    code = proc.wait(timeout=120)
    os.close(master)
    return code, out, seen.decode(errors="replace")


def test_probe_shows_progress_on_a_terminal_only(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"a": kit_upstream(), "b": kit_upstream()})
    code, out, terminal = run_with_terminal_stderr("list-upstreams", "--probe", "--config", str(config))
    assert code == 0, terminal
    assert "probing upstreams" in terminal and "2/2" in terminal
    assert "probed 2 upstreams" in out and "probing" not in out  # stdout carries the result only
    piped = run_cli("list-upstreams", "--probe", "--config", str(config))
    assert piped.returncode == 0 and piped.stderr == ""


def test_call_shows_the_upstreams_progress_on_a_terminal(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream()})
    args = ("call", "kit", "slow", "seconds=1.5", "steps=3", "--config", str(config))
    code, out, terminal = run_with_terminal_stderr(*args)
    assert code == 0, terminal
    assert out == "slept 1.5s in 3 steps\n"  # stdout carries the result only
    assert "kit slow: step 1/3" in terminal and "kit slow: step 2/3" in terminal
    piped = run_cli(*args)
    assert (piped.returncode, piped.stdout, piped.stderr) == (0, out, "")


def test_refresh_shows_progress_on_a_terminal(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"a": kit_upstream(), "b": kit_upstream()})
    code, out, terminal = run_with_terminal_stderr("refresh", "--config", str(config))
    assert code == 0, terminal
    assert "refreshing upstreams" in terminal and "2/2" in terminal and "refreshed 2 of 2 snapshots" in out
