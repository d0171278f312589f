"""The `aggregator` command line, run as a user runs it (a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import aggregator_env, kit_upstream, write_config


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aggregator", *args],
        env=env or aggregator_env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("upstreams: [unclosed\n", "invalid YAML"),
        ("upstreams:\n  git:\n    comand: uvx\n", "upstreams.git.comand"),
        ("upstreams:\n  git:\n    command: uvx\n    url: http://x/mcp\n", "upstreams.git"),
        ("upstreams:\n  aggregator:\n    command: uvx\n", "aggregator"),
        ("upstreams:\n  'bad name':\n    command: uvx\n", "bad name"),
        ("upstreams:\n  git:\n    command: uvx\n    args: 5\n", "upstreams.git.args"),
        # were accepted, then failed at start as "command not found: " or "None:80 is not reachable"
        ("upstreams:\n  git:\n    command: ''\n", "upstreams.git.command: command is empty"),
        ("upstreams:\n  docs:\n    url: localhost:8080/mcp\n", "upstreams.docs.url: url is not an http:// or"),
        ("upstreams:\n  docs:\n    url: ftp://example.com/mcp\n", "e.g. url: https://example.com/mcp"),
    ],
)
def test_config_errors_exit_2_with_file_key_and_fix(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    done = run_cli("list-upstreams", "--config", str(path))
    assert done.returncode == 2, done
    assert str(path) in done.stderr and expected in done.stderr
    assert "Fix:" in done.stderr or "fix" in done.stderr.lower()
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    done = run_cli("serve", "--config", str(tmp_path / "nope.yaml"))
    assert done.returncode == 2 and "nope.yaml" in done.stderr and "Traceback" not in done.stderr


def test_list_upstreams_starts_nothing_without_probe(tmp_path: Path) -> None:
    spawn_log = tmp_path / "spawns.log"
    config = write_config(tmp_path, {"kit": kit_upstream("--spawn-log", str(spawn_log), description="test kit")})
    done = run_cli("list-upstreams", "--config", str(config), "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["upstreams"]
    assert [(r["name"], r["transport"], r["state"], r["tools"]) for r in rows] == [("kit", "stdio", "configured", None)]
    assert not spawn_log.exists()


def test_list_upstreams_probe_reports_ready_and_failed_with_stderr(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        {"kit": kit_upstream(), "dies": kit_upstream("--exit-at-start"), "ghost": {"command": "/no/such"}},
    )
    done = run_cli("list-upstreams", "--config", str(config), "--probe", "--json")
    assert done.returncode == 1  # not every upstream is ready
    rows = {row["name"]: row for row in json.loads(done.stdout)["upstreams"]}
    assert rows["kit"]["state"] == "ready" and rows["kit"]["tools"] > 5 and rows["kit"]["handshake"] > 0
    assert rows["dies"]["state"] in ("backoff", "failed")
    assert any("exit-at-start" in line for line in rows["dies"]["stderr_tail"])
    assert "not found" in rows["ghost"]["last_error"]

    table = run_cli("list-upstreams", "--config", str(config), "--probe")
    assert "kit" in table.stdout and "ready" in table.stdout and "--- dies stderr" in table.stdout


def test_built_in_default_config_is_used_when_nothing_else_is_found(tmp_path: Path) -> None:
    env = aggregator_env(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    done = run_cli("list-upstreams", "--json", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["config"] == "<built-in default>"
    assert {row["name"] for row in payload["upstreams"]} == {"notes", "toolbox"}


def test_search_command_loads_and_ranks(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream(description="scriptable test server")})
    lazy = run_cli("search", "echo a message", "--config", str(config), "--json")
    assert lazy.returncode == 0, lazy.stderr
    assert all(result["tool"] is None for result in json.loads(lazy.stdout)["results"])  # nothing loaded
    loaded = run_cli("search", "echo a message", "--config", str(config), "--load", "--json")
    results = json.loads(loaded.stdout)["results"]
    assert results[0]["server"] == "kit" and results[0]["tool"] == "echo"
    table = run_cli("search", "echo a message", "--config", str(config), "--load")
    assert "echo" in table.stdout
    empty = run_cli("search", "   ", "--config", str(config))
    assert empty.returncode == 2 and "query" in empty.stderr


HOSTILE_CONFIGS = {
    "laughs.yaml": "".join(
        [f"l0: &l0 [{', '.join(['lol'] * 9)}]\n"]
        + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)]
    ),
    "deep.yaml": "[" * 100_000 + "]" * 100_000,
    "deep.json": "[" * 100_000 + "]" * 100_000,
    "self.yaml": "upstreams: &u {a: *u}\n",
    "nul.yaml": "upstreams: {}\x00\n",
    "bell.yaml": "upstreams:\n  a: {command: \x07}\n",
    "newline-name.yaml": 'upstreams: {"abc\\n": {command: x}}\n',
}


@pytest.mark.parametrize("name", sorted(HOSTILE_CONFIGS))
def test_hostile_configs_are_one_line_and_exit_2(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text(HOSTILE_CONFIGS[name], encoding="utf-8")
    done = run_cli("list-upstreams", "--config", str(path))
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"aggregator: config error: {path}")
    assert done.stdout == ""


@pytest.mark.parametrize("text", ["", "# only a comment\n", "\ufeff"])
def test_list_upstreams_of_an_empty_config(tmp_path: Path, text: str) -> None:
    path = tmp_path / "aggregator.yaml"
    path.write_text(text, encoding="utf-8")
    done = run_cli("list-upstreams", "--config", str(path))
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.splitlines()[1].split() == [
        "name",
        "transport",
        "state",
        "tools",
        "catalog_age",
        "handshake",
        "snapshot",
        "last_error",
    ]


@pytest.mark.parametrize("port", ["99999", "-1", "http", "1e3"])
def test_bad_port_is_one_line_and_exit_2(port: str) -> None:
    done = run_cli("serve", "--transport", "http", "--port", port)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "--port" in done.stderr and "Traceback" not in done.stderr
