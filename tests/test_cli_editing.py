"""`aggregator init`, `add`, `remove`: the config edited from a shell, comments and order kept."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from aggregator.config import load_config, user_config_file
from aggregator.config.yaml_edits import STARTER
from tests.conftest import EXAMPLES, aggregator_env, run_main


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user with no config yet, working in an empty project folder."""
    home = tmp_path / "home"
    (home / "project").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.delenv("AGGREGATOR_CONFIG", raising=False)
    monkeypatch.chdir(home / "project")
    return home


def test_init_writes_a_commented_starter_once(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    done = run_main(capsys, "init", "--no-import")
    path = user_config_file()
    assert done.returncode == 0 and str(path) in done.stdout and "aggregator add" in done.stdout
    assert path.read_text() == STARTER and load_config().upstreams == {}
    path.write_text(STARTER + "  mine: {command: x}\n")
    again = run_main(capsys, "init")
    assert again.returncode == 0 and "already exists; nothing changed" in again.stdout
    assert path.read_text() == STARTER + "  mine: {command: x}\n"


def test_init_imports_what_the_clients_have(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (home / ".cursor").mkdir()
    (home / ".cursor/mcp.json").write_text(json.dumps({"mcpServers": {"time": {"command": "uvx", "args": ["t"]}}}))
    offered = run_main(capsys, "init", "--no-import")  # stdin is not a terminal: no question, a hint
    assert "your clients have 1 server; import them with: aggregator import --write" in offered.stdout
    user_config_file().unlink()
    done = run_main(capsys, "init", "--import")
    assert done.returncode == 0 and "imported 1 server: time" in done.stdout, done
    text = user_config_file().read_text()
    assert text.startswith(STARTER) and load_config().upstreams["time"].args == ["t"]


def test_add_and_remove_keep_comments_and_order(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kit = ["--", sys.executable, str(EXAMPLES / "testkit.py")]
    added = run_main(capsys, "add", "kit", "--description", "test server", *kit)
    assert added.returncode == 0 and added.stdout.endswith("try: aggregator tools kit\n")
    added = run_main(capsys, "add", "docs", "https://example.com/mcp")  # remote: it may want a sign-in first
    assert added.returncode == 0 and "if it asks for a sign-in: aggregator auth login docs" in added.stdout
    path = user_config_file()
    path.write_text(path.read_text().replace("\n  docs:", "\n  # my remote docs\n  docs:"))
    done = run_main(capsys, "add", "git", "--env", "A=1", "--", "uvx", "mcp-server-git", "--repository", ".")
    assert done.returncode == 0 and f"--repository {home / 'project'}" in done.stdout
    config = load_config()
    text = path.read_text()
    assert text.index("\n  kit:") < text.index("\n  docs:") < text.index("\n  git:")  # in the order added
    assert config.upstreams["git"].args == ["mcp-server-git", "--repository", str(home / "project")]
    assert config.upstreams["git"].env == {"A": "1"} and config.upstreams["kit"].description == "test server"
    assert config.upstreams["docs"].url == "https://example.com/mcp"
    assert "# my remote docs" in text and text.startswith(STARTER)

    called = run_main(capsys, "call", "kit", "echo", "message=hello")  # what was added works at once
    assert (called.returncode, called.stdout) == (0, "hello\n"), called.stderr

    assert run_main(capsys, "remove", "DOCS").returncode == 0  # names match ignoring case
    text = path.read_text()
    assert "\n    url: https://example.com/mcp" not in text and "# my remote docs" in text
    assert set(load_config().upstreams) == {"kit", "git"}


@pytest.mark.parametrize(
    ("argv", "parts"),
    [
        (["add", "kit", "--", "other"], ["already has an upstream named 'kit'", "--replace", "aggregator remove kit"]),
        (["add", "bad name", "--", "x"], ["not a valid upstream name"]),
        (["add", "Aggregator", "--", "x"], ["reserved"]),
        (["add", "x", "npx", "-y", "pkg"], ["put -- before the server's command"]),
        (["add", "x", "--", "cmd", "--env", "novalue"], []),  # after --, --env is the server's own argument
        (["remove", "kti"], ["no upstream named 'kti'", "did you mean 'kit'?", "known: kit"]),
    ],
)
def test_edit_mistakes_change_nothing(
    home: Path, capsys: pytest.CaptureFixture[str], argv: list[str], parts: list[str]
) -> None:
    assert run_main(capsys, "add", "kit", "--", "somecmd").returncode == 0
    before = user_config_file().read_text()
    done = run_main(capsys, *argv)
    if not parts:
        assert done.returncode == 0 and load_config().upstreams["x"].args == ["--env", "novalue"]
        return
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert all(part in done.stderr for part in parts), done.stderr
    assert user_config_file().read_text() == before


def test_add_replace(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_main(capsys, "add", "kit", "--", "one")
    run_main(capsys, "add", "other", "--", "two")
    done = run_main(capsys, "add", "kit", "--replace", "--", "three")
    assert done.returncode == 0 and "replaced kit" in done.stdout
    assert {name: u.command for name, u in load_config().upstreams.items()} == {"other": "two", "kit": "three"}


def test_init_asks_on_a_terminal(tmp_path: Path) -> None:
    """On a terminal `init` offers to import what the clients have; Enter says yes. Run from the home
    directory, where ~/.cursor/mcp.json is both the user and the project file: one server, not two."""
    home = tmp_path / "home"
    (home / ".cursor").mkdir(parents=True)
    (home / ".cursor/mcp.json").write_text(json.dumps({"mcpServers": {"time": {"command": "uvx", "args": ["t"]}}}))
    env = aggregator_env(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), TERM="dumb")
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "aggregator", "init"], stdin=slave, stdout=slave, stderr=slave, env=env, cwd=home
    )
    os.close(slave)
    seen = b""
    while b"[Y/n]" not in seen:
        chunk = os.read(master, 4096)
        assert chunk, seen
        seen += chunk
    assert b"import 1 server from cursor?" in seen
    os.write(master, b"\n")
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the process ended and closed its side
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(timeout=60) == 0, seen
    os.close(master)
    assert b"imported 1 server: time" in seen
    text = (home / ".config/aggregator/aggregator.yaml").read_text()
    assert text.startswith(STARTER) and "\n  time:\n" in text


def test_add_notes_a_command_that_cannot_start_here(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Written all the same (the user may install it next), with doctor's one line on stderr: not only at the
    first `tools` call, minutes later, as 'could not start'."""
    missing = run_main(capsys, "add", "time", "--", "no-such-launcher-7f3", "mcp-server-time")
    assert missing.returncode == 0 and "added time" in missing.stdout
    assert missing.stderr == (
        "aggregator add: note: command 'no-such-launcher-7f3' is not on PATH; "
        "fix: install it, or give its absolute path\n"
    )
    present = run_main(capsys, "add", "kit", "--", sys.executable, str(EXAMPLES / "testkit.py"))
    assert (present.returncode, present.stderr) == (0, "")
    assert run_main(capsys, "tools").stdout.count("configured") == 2  # both entries are in the config
