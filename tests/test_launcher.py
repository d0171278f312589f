"""`install` writes a launcher that outlives a checkout; `doctor` reports a client entry whose command is gone."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from aggregator.config.launcher import launcher_command, missing_command
from tests.conftest import kit_upstream, write_config
from tests.test_doctor import run_doctor


def fake_script(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "aggregator"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -m aggregator "$@"\n')
    script.chmod(0o755)
    return script


def test_the_command_on_path_wins_over_this_checkouts_venv(tmp_path: Path) -> None:
    shim = fake_script(tmp_path / "local-bin")  # what pipx / uv tool install put on PATH
    assert launcher_command({"PATH": f"{shim.parent}{os.pathsep}/usr/bin"}) == [str(shim)]
    fallback = launcher_command({"PATH": str(tmp_path / "empty")})
    assert fallback[0].startswith(str(Path(sys.executable).parent)) or fallback[1:] == ["-m", "aggregator"]


def test_missing_command() -> None:
    assert not missing_command(sys.executable) and not missing_command("sh")
    assert missing_command("/gone/.venv/bin/aggregator") and missing_command("no-such-command-xyz")


def test_doctor_reports_a_client_entry_whose_command_is_gone(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream()})
    cursor = tmp_path / "home/.cursor/mcp.json"
    cursor.parent.mkdir(parents=True)
    gone = str(tmp_path / "deleted-checkout/.venv/bin/aggregator")
    entry = {"command": gone, "args": ["serve", "--config", str(config)]}
    cursor.write_text(json.dumps({"mcpServers": {"aggregator": entry}}))
    code, found, out = run_doctor(tmp_path, "--config", str(config), "--no-probe")
    assert code == 1, out
    problem = next(line for line in found["PROBLEM"] if line.startswith("client cursor"))
    assert gone in problem and "no longer exists" in problem and "aggregator install cursor" in problem
    fake_script(Path(gone).parent)  # the command is back: no problem
    code, found, out = run_doctor(tmp_path, "--config", str(config), "--no-probe")
    assert code == 0 and not found.get("PROBLEM"), out
