"""The CLI against hostile upstreams and input (issue 20, items 17-19): the real `aggregator`
command; an upstream's terminal escapes are shown escaped, bad input is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aggregator.safetext import printable
from tests.conftest import kit_upstream, write_config
from tests.test_cli import run_cli

CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4=\x07"  # writes `rm -rf ~` to the clipboard
TITLE = "\x1b]0;owned\x07"
CLEAR = "\x1b[2J\x1b[H"
HOSTILE = f"Clipboard{CLIPBOARD} helper{TITLE}{CLEAR}\x9b31m. More\u202e text."
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


@pytest.fixture
def hostile_config(tmp_path: Path) -> Path:
    tools = tmp_path / "tools.json"
    tool = {"name": "clip\x1b[2Jboard", "description": HOSTILE, "inputSchema": {"type": "object"}}
    tools.write_text(json.dumps([tool]))
    return write_config(tmp_path, {"kit": kit_upstream("--extra-tools", str(tools), description=f"kit{TITLE}")})


def _no_raw_escapes(*outputs: str) -> None:
    for output in outputs:
        assert not any(char in output for char in RAW), repr(output)


@pytest.mark.parametrize(
    "command",
    [
        ("tools", "kit"),
        ("search", "clipboard helper", "--load"),
        ("describe", "kit", "clip\x1b[2Jboard"),
        ("call", "kit", "reply", "--args", json.dumps({"result": {"content": [{"type": "text", "text": HOSTILE}]}})),
        ("list-upstreams",),
    ],
    ids=["tools", "search", "describe", "call", "list-upstreams"],
)
def test_an_upstreams_terminal_escapes_are_printed_escaped(hostile_config: Path, command: tuple[str, ...]) -> None:
    done = run_cli(*command, "--config", str(hostile_config))
    assert done.returncode == 0, done.stderr
    _no_raw_escapes(done.stdout, done.stderr)
    if command[0] != "list-upstreams":
        assert "\\u001b" in done.stdout  # shown, not dropped: the user sees something odd is there


def test_json_output_stays_json_with_escapes(hostile_config: Path) -> None:
    done = run_cli("describe", "kit", "clip\x1b[2Jboard", "--json", "--config", str(hostile_config))
    assert done.returncode == 0, done.stderr
    _no_raw_escapes(done.stdout)
    assert json.loads(done.stdout)["description"] == HOSTILE  # the JSON still holds the exact text


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (("--args", "[" * 50_000), "nested too deep"),
        (("x=NaN",), "NaN is not a JSON number"),
        (("x=1e999",), "too large for a JSON number"),
        (("--args", '{"x": -Infinity}'), "-Infinity is not a JSON number"),
    ],
    ids=["deep", "nan", "huge", "infinity"],
)
def test_call_refuses_what_json_cannot_say(tmp_path: Path, arguments: tuple[str, ...], expected: str) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream()})
    done = run_cli("call", "kit", "echo", *arguments, "--config", str(config))
    assert done.returncode == 2 and expected in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


@pytest.mark.parametrize("command", [("list-upstreams",), ("serve",)])
def test_a_raw_control_character_in_a_json_config_is_refused(tmp_path: Path, command: tuple[str, ...]) -> None:
    config = tmp_path / "mcp.json"
    config.write_text('{"mcpServers": {"x": {"command": "x\x01"}}}')
    done = run_cli(*command, "--config", str(config))
    assert done.returncode == 2 and "raw control character U+0001" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and done.stdout == ""


def test_printable_escapes_every_control_and_keeps_the_rest() -> None:
    assert printable("tab\tnew\nline é 😀") == "tab\tnew\nline é 😀"
    assert printable(HOSTILE).count("\\u001b") == 4 and "\\u009b" in printable(HOSTILE)
    assert printable("cut \ud83d") == "cut \ufffd"
