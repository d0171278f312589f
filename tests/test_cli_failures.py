"""Every CLI failure is one line on stderr naming what to do next, with its exit code, and no traceback.

Exit codes: 0 ok, 1 the upstream or the tool failed, 2 a usage or config mistake. Real upstreams
(the stdlib test server) and a real missing command; `main` runs in-process (fast), and once as a
user runs it (a subprocess).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from aggregator.cli.commands import build_parser
from tests.conftest import kit_upstream, run_main, write_config
from tests.test_cli import run_cli


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_config(
        tmp_path,
        {"kit": kit_upstream(), "gone": {"command": str(tmp_path / "no-such-server")}},
    )


def one_line(done: object, code: int, *parts: str) -> None:
    """Exit `code`, nothing on stdout, exactly one line on stderr holding every part."""
    stderr = done.stderr  # type: ignore[attr-defined]
    assert done.returncode == code, stderr  # type: ignore[attr-defined]
    assert done.stdout == "", done.stdout  # type: ignore[attr-defined]
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    for part in parts:
        assert part in stderr, stderr


@pytest.mark.parametrize(
    ("argv", "parts"),
    [
        (["tools", "nope"], ["no upstream named 'nope'", "known: gone, kit", "aggregator add"]),
        (["tools", "kti"], ["did you mean 'kit'?"]),
        (["describe", "kit", "ehco"], ["kit has no tool 'ehco'", "did you mean 'echo'?", "aggregator tools kit"]),
        (["call", "kit", "ehco", "message=hi"], ["did you mean 'echo'?", "aggregator tools kit"]),
        (["call", "kit", "ehco"], ["did you mean 'echo'?"]),
        (["call", "kti", "echo", "message=hi"], ["did you mean 'kit'?"]),
    ],
)
def test_a_typo_is_one_line_with_did_you_mean_and_exit_2(
    config: Path, capsys: pytest.CaptureFixture[str], argv: list[str], parts: list[str]
) -> None:
    one_line(run_main(capsys, *argv, "--config", str(config)), 2, *parts)


@pytest.mark.parametrize("argv", [["call", "gone", "x", "a=1"], ["call", "gone", "x"], ["tools", "gone"]])
def test_an_upstream_that_cannot_start_is_one_line_exit_1(
    config: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    done = run_main(capsys, *argv, "--config", str(config))
    one_line(done, 1, "could not start", "no-such-server", "aggregator doctor")


@pytest.mark.parametrize(
    ("argv", "parts"),
    [
        (["serch", "time"], ["'serch'", "did you mean 'search'?", "aggregator --help"]),
        (["install", "curser"], ["did you mean 'cursor'?"]),
        (["uninstall", "vscod"], ["did you mean 'vscode'?"]),
        (["import", "curser"], ["'curser' is neither a client nor a file", "did you mean 'cursor'?"]),
    ],
)
def test_a_mistyped_command_or_client_says_what_was_meant(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    parts: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, {"kit": kit_upstream()})
    one_line(run_main(capsys, *argv, "--config", str(config)), 2, *parts)


def test_a_user_sees_one_line_and_a_bare_aggregator_prints_help(config: Path) -> None:
    one_line(run_cli("call", "kit", "ehco", "message=hi", "--config", str(config)), 2, "did you mean 'echo'?")
    done = run_cli()
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("usage: aggregator") and "call" in done.stdout and "doctor" in done.stdout


def test_version_does_not_import_the_sdk() -> None:
    code = (
        "import sys; from aggregator.cli import main; assert main(['--version']) == 0; "
        "assert not [m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types')], 'the SDK was imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("aggregator ")


def test_every_subcommand_and_option_has_help() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helped = {action.dest for action in commands._choices_actions if action.help}
    assert helped == set(commands.choices), set(commands.choices) - helped
    missing = [
        f"{name} {action.dest}"
        for name, sub in [("aggregator", parser), *commands.choices.items()]
        for action in sub._actions
        if not isinstance(action, argparse._SubParsersAction) and not action.help
    ]
    assert missing == []
    for name, sub in commands.choices.items():
        assert sub.description, f"{name} has no description"
