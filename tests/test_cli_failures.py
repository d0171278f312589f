"""Every CLI failure is one line on stderr naming what to do next, with its exit code, and no traceback.

Exit codes: 0 ok, 1 the upstream or the tool failed, 2 a usage or config mistake. Real upstreams
(the stdlib test server) and a real missing command; `main` runs in-process (fast), and once as a
user runs it (a subprocess).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.cli.commands import build_parser
from aggregator.table import count
from tests.conftest import (
    aggregator_client,
    aggregator_env,
    free_port,
    kit_upstream,
    run_main,
    structured,
    wait_for_port,
    write_config,
)
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


@pytest.mark.parametrize("transport", ["http", "sse"])
def test_a_remote_upstream_nothing_answers_at_is_named_by_host_and_port_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], transport: str
) -> None:
    port = free_port()  # nothing listens there
    url = f"http://127.0.0.1:{port}/mcp?key=not-for-the-screen"
    config = write_config(tmp_path, {"far": {"url": url, "transport": transport, "auth": "none"}})
    done = run_main(capsys, "call", "far", "x", "--config", str(config))
    one_line(done, 1, f"upstream 'far' could not start: 127.0.0.1:{port} is not reachable (")
    assert "ConnectError" not in done.stderr and "not-for-the-screen" not in done.stderr


@pytest.mark.parametrize(
    ("argv", "parts"),
    [
        (["serch", "time"], ["unknown command 'serch'", "did you mean 'search'?", "aggregator --help"]),
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


@pytest.mark.parametrize(
    ("argv", "help_of"),
    [
        (["auth", "status", "kit"], "aggregator auth status"),
        (["auth", "login", "kit", "extra"], "aggregator auth login"),
        (["service", "status", "x"], "aggregator service status"),
        (["tools", "kit", "extra"], "aggregator tools"),
    ],
)
def test_a_word_too_many_names_the_help_of_the_command_it_was_given_to(
    config: Path, capsys: pytest.CaptureFixture[str], argv: list[str], help_of: str
) -> None:
    done = run_main(capsys, *argv, "--config", str(config))
    word = argv[-1]
    one_line(done, 2, f"{help_of}: error: unrecognized arguments: {word} (see {help_of} --help)")


def _commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and nested command of `parser` (`serve`, `auth status`, ...) as its words."""
    found = [words] if words else []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _commands(child, (*words, name))
    return found


def test_every_command_names_an_unknown_option_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Not argparse's "the following arguments are required": the option is what the user got wrong."""
    commands = [words for words in _commands(build_parser()) if words != ("connect",)]
    assert len(commands) > 20
    for words in [(), *commands]:
        done = run_main(capsys, *words, "--bogus-option")
        prog = " ".join(("aggregator", *words))
        one_line(done, 2, f"{prog}: error: unknown option '--bogus-option' (see {prog} --help)")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["search", " "], "aggregator search: 'query' must not be empty or whitespace"),
        (["search", "time", "--limit", "0"], "aggregator search: 'limit' must be in 1..50, got 0"),
    ],
)
def test_a_search_mistake_names_the_command(
    config: Path, capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    one_line(run_main(capsys, *argv, "--config", str(config)), 2, said)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--bogus"], "aggregator: error: unknown option '--bogus' (see aggregator --help)"),
        (["--confg", "x.yaml", "tools"], "unknown option '--confg'; did you mean '--config'?"),
        (["--port", "9", "serve"], "'--port' is an option of 'serve': put it after the command"),
        (["search", "--lmit", "3", "time"], "search: error: unknown option '--lmit'; did you mean '--limit'?"),
        (["call", "kit", "echo", "--argz", "{}"], "unknown option '--argz'; did you mean '--args'?"),
        (["auth", "status", "--data-dr", "d"], "unknown option '--data-dr'; did you mean '--data-dir'?"),
        (["import", "--wrte"], "unknown option '--wrte'; did you mean '--write'?"),
        (["install", "claude"], "invalid choice: 'claude'; did you mean 'claude-code' or 'claude-desktop'?"),
        (["connect", "--confg", "x.yaml"], "aggregator connect: error: unknown option '--confg'; did you mean"),
        (["connect", "serve"], "aggregator connect: error: unexpected argument 'serve'"),
    ],
)
def test_a_misspelt_option_says_what_was_meant_as_a_user_sees_it(argv: list[str], said: str) -> None:
    one_line(run_cli(*argv), 2, said)


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


def half_broken(directory: Path) -> Path:
    """kit, and two entries unusable here: an unset variable (as after importing Cursor's `${env:DOCS_TOKEN}`)
    and a VS Code `${input:...}` prompt."""
    return write_config(
        directory,
        {
            "kit": kit_upstream(),
            "docs": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer ${FD_UNSET_TOKEN}"}},
            "vs": {"command": "x", "args": ["${input:token}"]},
        },
    )


def test_an_unusable_entry_disables_that_upstream_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = half_broken(tmp_path)
    done = run_main(capsys, "call", "kit", "echo", "message=hi", "--config", str(config))
    assert (done.returncode, done.stdout) == (0, "hi\n"), done.stderr
    warnings = done.stderr.splitlines()
    assert len(warnings) == 2 and "upstream docs disabled" in warnings[0] and "FD_UNSET_TOKEN" in warnings[0]
    assert "upstream vs disabled" in warnings[1] and "aggregator doctor" in warnings[1]
    listed = run_main(capsys, "list-upstreams", "--config", str(config), "--json")
    states = {row["name"]: row["state"] for row in json.loads(listed.stdout)["upstreams"]}
    assert listed.returncode == 0 and states == {"kit": "configured", "docs": "disabled", "vs": "disabled"}
    broken = tmp_path / "broken.yaml"
    broken.write_text("upstreams:\n  kit: {comand: x}\n")  # a broken file as a whole still exits 2
    assert run_main(capsys, "tools", "--config", str(broken)).returncode == 2


async def test_serve_warns_and_serves_the_others(tmp_path: Path) -> None:
    with (tmp_path / "err.log").open("w") as errlog:
        async with aggregator_client(half_broken(tmp_path), errlog=errlog) as session:
            servers = structured(await session.call_tool("catalog_list_servers", {}))["servers"]
            assert [s["name"] for s in servers] == ["kit"]
    log = (tmp_path / "err.log").read_text()
    assert log.count("upstream disabled") == 2 and "upstream=docs" in log and "upstream=vs" in log


SERVE_HTTP = [sys.executable, "-m", "aggregator", "serve", "--transport", "http"]


def test_serve_http_says_where_and_stops_cleanly(tmp_path: Path) -> None:
    """The URL (and where the token comes from) on start; SIGTERM with ready, idle upstreams logs no failure."""
    config = write_config(tmp_path, {"kit": kit_upstream(start="eager"), "two": kit_upstream(start="eager")})
    port = free_port()
    proc = subprocess.Popen(
        [*SERVE_HTTP, "--port", str(port), "--config", str(config), "--log-level", "info"],
        stderr=subprocess.PIPE,
        env=aggregator_env(),
    )
    try:
        assert proc.stderr is not None
        banner = proc.stderr.readline().decode()
        assert f"serving MCP at http://127.0.0.1:{port}/mcp" in banner and "AGGREGATOR_TOKEN" in banner
        wait_for_port(port, proc)
        ready: list[str] = []
        while len(ready) < 2:  # both upstreams up and idle
            line = proc.stderr.readline().decode()
            assert line, "the aggregator ended early"
            ready += [line] if "upstream ready" in line else []
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0
    log = rest.decode()
    assert "stopping on signal" in log
    assert not [line for line in log.splitlines() if "level=warning" in line or "level=error" in line], log


def test_plurals_and_units(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (count(1, "tool"), count(0, "tool"), count(2, "entry", "entries")) == ("1 tool", "0 tools", "2 entries")
    config = write_config(tmp_path, {"kit": kit_upstream()})
    done = run_main(capsys, "list-upstreams", "--probe", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert "probed 1 upstream in " in done.stdout and " s; 1 ready" in done.stdout
    row = next(line for line in done.stdout.splitlines() if line.startswith("kit "))
    assert re.search(r"\d\.\d\d s", row), row  # the handshake with its unit
    refreshed = run_main(capsys, "refresh", "--config", str(config))
    assert "refreshed 1 of 1 snapshot in " in refreshed.stdout


def test_an_unexpected_error_is_one_line_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last guard: whatever no command handled (here a bug, injected) is one line and exit 1."""
    import aggregator.cli.calls as calls

    async def broken(*_args: object) -> int:
        raise RuntimeError("injected\nsecond line")

    monkeypatch.setattr(calls, "_tools", broken)
    config = write_config(tmp_path, {"kit": kit_upstream()})
    one_line(run_main(capsys, "tools", "--config", str(config)), 1, "unexpected RuntimeError: injected", "report")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="-=abcdeglnoprstuvwxy ", max_size=12), max_size=6))
def test_unknown_option_reads_any_words_without_failing(words: list[str]) -> None:
    """Whatever a user types, the check answers None or one line naming a word they typed; known options
    (with their values) are never reported."""
    from aggregator.cli.commands import unknown_option

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for each in (parser, commands["search"], commands["call"]):
        said = unknown_option(each, words)
        assert said is None or ("\n" not in said and any(w.partition("=")[0] in said for w in words if w))
    assert unknown_option(commands["search"], ["--limit", "--json", "--load", "--explain", "q"]) is None


def test_a_missing_launcher_says_what_provides_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A new machine often lacks uv or Node.js: the start error and doctor name what to install, not only
    the command (its PATH here is an empty directory, so uvx is missing wherever the test runs)."""
    empty = tmp_path / "bin"
    empty.mkdir()
    entry = {"command": "uvx", "args": ["mcp-server-time"], "env": {"PATH": str(empty)}}
    config = write_config(tmp_path, {"time": entry})
    started = run_main(capsys, "tools", "time", "--config", str(config), "--data-dir", str(tmp_path / "data"))
    one_line(started, 1, "command not found: uvx (install uv, which provides uvx: https://docs.astral.sh/uv/)")
    doctor = run_main(capsys, "doctor", "--no-probe", "--config", str(config), "--data-dir", str(tmp_path / "data"))
    assert "Fix: install uv, which provides uvx: https://docs.astral.sh/uv/, or give its absolute path" in doctor.stdout
