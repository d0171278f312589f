"""`aggregator doctor`: one line per finding, a fix for each problem, exit 0 only when all is well."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from aggregator.examples.testkit import CORE_NAMES

from aggregator.config.config_file import config_lookup, user_config_file
from tests.conftest import aggregator_env, kit_upstream, write_config
from tests.test_cli import run_cli


def run_doctor(tmp_path: Path, *args: str, **env: str) -> tuple[int, dict[str, list[str]], str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    environ = aggregator_env(
        **{"HOME": str(home), "XDG_CONFIG_HOME": "", "AGGREGATOR_DATA_DIR": str(tmp_path / "d"), **env}
    )
    done = run_cli("doctor", *args, env=environ, cwd=tmp_path)
    assert "Traceback" not in done.stderr
    by_level: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        if line[:7].strip() in ("ok", "note", "PROBLEM"):
            by_level.setdefault(line[:7].strip(), []).append(line[8:])
    return done.returncode, by_level, done.stdout


def test_a_healthy_config_exits_0(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream()})
    code, found, out = run_doctor(tmp_path, "--config", str(config))
    assert code == 0, out
    assert found["ok"][0] == f"config: {config}, given with --config"
    assert any(line.startswith(f"upstream kit: ready, {len(CORE_NAMES)} tools, handshake ") for line in found["ok"])
    assert any(line.startswith("data dir: ") and "writable" in line for line in found["ok"])
    assert found["note"] == ["clients: no MCP client starts the aggregator yet. Fix: aggregator install CLIENT"]
    assert out.rstrip().endswith("all well")


def test_missing_command_and_unset_variable_are_problems_with_fixes(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        {
            "kit": kit_upstream(),
            "ghost": {"command": "no-such-command-for-doctor"},
            "needs": kit_upstream(env={"TOKEN": "${DOCTOR_UNSET_TOKEN}", "OK": "${DOCTOR_UNSET_OTHER:-fine}"}),
            "dies": kit_upstream("--exit-at-start"),
        },
    )
    code, found, out = run_doctor(tmp_path, "--config", str(config))
    assert code == 1
    problems = found["PROBLEM"]
    assert "upstream ghost: command 'no-such-command-for-doctor' is not on PATH. Fix: install it" in "\n".join(problems)
    assert any(
        p.startswith("upstream needs: ${DOCTOR_UNSET_TOKEN} is referenced but DOCTOR_UNSET_TOKEN is not set. Fix: set")
        for p in problems
    )
    assert not any("DOCTOR_UNSET_OTHER" in p for p in problems)  # it has a default
    assert any(p.startswith("upstream dies: ") and "exit-at-start" in p for p in problems)
    assert any(line.startswith("upstream kit: ready") for line in found["ok"])
    assert out.rstrip().endswith("3 problems")
    payload = json.loads(run_cli("doctor", "--config", str(config), "--no-probe", "--json").stdout)
    assert payload["ok"] is False and {f["level"] for f in payload["findings"]} >= {"ok", "problem"}


def test_broken_config_is_one_problem(tmp_path: Path) -> None:
    config = tmp_path / "aggregator.yaml"
    config.write_text("upstreams:\n  git: {comand: uvx}\n")
    code, found, _ = run_doctor(tmp_path)
    assert code == 1
    assert found["ok"][0].startswith(f"config: {config}, aggregator.yaml in the working directory")
    (problem,) = found["PROBLEM"]
    assert (
        problem.startswith(f"config: {config}:2: upstreams.git.comand: unknown key") and "Fix: did you mean" in problem
    )


def test_unwritable_data_dir_is_a_problem(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    data = blocker / "data"  # under a regular file: not creatable, even for root
    config = write_config(tmp_path, {})
    code, found, _ = run_doctor(tmp_path, "--config", str(config), AGGREGATOR_DATA_DIR=str(data))
    assert code == 1 and any(p.startswith(f"data dir: {data} is not writable") for p in found["PROBLEM"])


def test_clients_that_start_the_aggregator_are_named(tmp_path: Path) -> None:
    cursor = tmp_path / "home" / ".cursor" / "mcp.json"
    cursor.parent.mkdir(parents=True)
    entry = {"command": sys.executable, "args": ["-m", "aggregator", "serve"]}  # a command that exists
    cursor.write_text(json.dumps({"mcpServers": {"aggregator": entry}}))
    config = write_config(tmp_path, {})
    code, found, _ = run_doctor(tmp_path, "--config", str(config))
    assert code == 0 and any(
        line == f"clients: the aggregator is installed in cursor (user) ({cursor})" for line in found["ok"]
    )
    cursor.write_text('{"mcpServers": ')
    code, found, _ = run_doctor(tmp_path, "--config", str(config))
    assert code == 1 and any(p.startswith(f"client cursor (user): {cursor}: invalid JSON") for p in found["PROBLEM"])


def test_config_lookup_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config_lookup(None, {}, tmp_path) == (
        None,
        f"nothing found (no --config, no AGGREGATOR_CONFIG, no ./aggregator.yaml, no {user_config_file()})",
    )
    user_config_file().parent.mkdir(parents=True)
    user_config_file().write_text("")
    assert config_lookup(None, {}, tmp_path)[1].startswith("the user config file")
    (tmp_path / "aggregator.yaml").write_text("")
    assert config_lookup(None, {}, tmp_path)[1].startswith("aggregator.yaml in the working directory")
    assert config_lookup(None, {"AGGREGATOR_CONFIG": "aggregator.yaml"}, tmp_path)[1].startswith(
        "named by the AGGREGATOR"
    )
    assert config_lookup("aggregator.yaml", {}, tmp_path) == (tmp_path / "aggregator.yaml", "given with --config")
