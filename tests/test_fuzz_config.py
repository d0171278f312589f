"""Hypothesis-made configs, YAML and JSON, through the loader and the CLI.

Whatever the text, the result is a valid `AggregatorConfig` or one `ConfigError` line naming the
file, and the CLI exits 0 or 2 with at most that one line on stderr: never a traceback or a hang.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.config import AggregatorConfig, ConfigError, parse_config
from tests.conftest import aggregator_env

KEYS = [
    "command", "args", "env", "cwd", "url", "headers", "transport", "description", "capabilities",
    "start", "expose", "pin", "tools", "timeouts", "allow", "deny", "connect", "call", "type",
    "transportType", "serverUrl", "envFile", "disabled", "autoApprove", "alwaysAllow", "timeout", "dev",
    "defaults", "max_result_bytes", "upstreams", "mcpServers", "servers", "aggregator",
]  # fmt: skip
WORDS = [
    "stdio", "http", "sse", "streamable-http", "lazy", "eager", "catalog", "direct", "uvx", "npx",
    "http://127.0.0.1:9/mcp", "http://h/sse", "${HOME}", "${UNSET_X}", "${A:-d}", "$$", "${", "~/x",
    "${env:A}", "${input:k}", "yes", "no", "null", "1e999", "-1", "0", "*", "delete_*",
]  # fmt: skip

NAMES = st.one_of(st.sampled_from(KEYS), st.sampled_from(["git", "a", "Git", "x y", "abc\n"]), st.text(max_size=8))
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(WORDS),
    st.text(max_size=12),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(NAMES, inner, max_size=5)),
    max_leaves=25,
)
SERVER_NAMES = st.from_regex(r"[a-z][a-z0-9_-]{0,6}", fullmatch=True)
VAR_TEXT = st.one_of(st.sampled_from(WORDS), st.text(max_size=10))
PLAUSIBLE = st.fixed_dictionaries(
    {"command": st.sampled_from(["uvx", "npx", "${AGGREGATOR_PYTHON}", "~/bin/s", sys.executable])},
    optional={
        "args": st.lists(st.one_of(VAR_TEXT, st.integers(), st.booleans()), max_size=4),
        "env": st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,5}", fullmatch=True), VAR_TEXT, max_size=3),
        "cwd": st.sampled_from([".", "sub", "/tmp", "~", "${HOME}"]),
        "description": st.text(max_size=20),
        "capabilities": st.lists(st.text(max_size=6), max_size=3),
        "start": st.sampled_from(["lazy", "eager", "soon"]),
        "expose": st.sampled_from(["catalog", "direct"]),
        "pin": st.lists(st.sampled_from(["a", "b", "delete_x"]), max_size=2),
        "tools": st.fixed_dictionaries(
            {},
            optional={"allow": st.lists(st.sampled_from(["*", "a"])), "deny": st.lists(st.sampled_from(["delete_*"]))},
        ),
        "timeouts": st.fixed_dictionaries({}, optional={"connect": st.floats(), "call": st.integers(-1, 100)}),
        "type": st.sampled_from(["stdio", "STDIO", "sse", "ws"]),
        "disabled": st.booleans(),
    },
)
ENTRY = st.one_of(PLAUSIBLE, st.dictionaries(st.sampled_from(KEYS[:27]), VALUES, max_size=6))
DOCUMENT = st.one_of(
    st.builds(
        lambda section, servers, extra: {section: servers, **extra},
        st.sampled_from(["upstreams", "mcpServers", "servers"]),
        st.dictionaries(st.one_of(SERVER_NAMES, NAMES), st.one_of(ENTRY, ENTRY, VALUES), max_size=4),
        st.one_of(st.just({}), st.just({}), st.dictionaries(NAMES, VALUES, max_size=2)),
    ),
    VALUES,
)
ENVIRON = st.dictionaries(st.sampled_from(["A", "HOME", "UNSET_X", "AGGREGATOR_PYTHON"]), st.text(max_size=6))


def as_yaml(data: Any) -> str:
    return yaml.safe_dump(data, allow_unicode=True, default_flow_style=None)


def as_json(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False)


def mutate(text: str, position: int, insert: str) -> str:
    """Text damaged the way hand edits (or attackers) damage it."""
    at = position % (len(text) + 1)
    return text[:at] + insert + text[at:]


DAMAGE = st.sampled_from(
    [
        "",
        "",
        "",
        "",
        "",
        "\x00",
        "\x07",
        "\ufeff",
        "\t",
        ": ",
        " #",
        "&a ",
        "*a",
        "*b",
        "[",
        "]",
        "{",
        "}",
        "//",
        "/*",
        ",",
        '"',
        "'",
    ]
)
TEXT = st.one_of(
    st.builds(lambda d, p, i: (mutate(as_yaml(d), p, i), "aggregator.yaml"), DOCUMENT, st.integers(0), DAMAGE),
    st.builds(lambda d, p, i: (mutate(as_json(d), p, i), "mcp.json"), DOCUMENT, st.integers(0), DAMAGE),
    st.tuples(st.text(max_size=200), st.sampled_from(["a.yaml", "a.json"])),
)


def check_one(text: str, name: str, environ: dict[str, str], directory: Path) -> AggregatorConfig | ConfigError:
    source = str(directory / name)
    try:
        return parse_config(text, source, environ=environ)
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message and "\r" not in message, message
        assert message.startswith(source) and ". Fix: " in message, message
        return exc


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=TEXT, environ=ENVIRON)
def test_loader_gives_a_config_or_one_error_line(
    tmp_path_factory: Any, case: tuple[str, str], environ: dict[str, str]
) -> None:
    text, name = case
    result = check_one(text, name, environ, tmp_path_factory.getbasetemp())
    if isinstance(result, AggregatorConfig):
        assert list(result.upstreams) == sorted(result.upstreams)
        assert all(up.name == key for key, up in result.upstreams.items())


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=TEXT)
def test_cli_exits_0_or_2_with_one_line(tmp_path_factory: Any, case: tuple[str, str]) -> None:
    text, name = case
    directory = tmp_path_factory.mktemp("fuzz")
    path = directory / name
    path.write_text(text, encoding="utf-8")
    expected = check_one(text, name, aggregator_env(), directory)
    done = subprocess.run(
        [sys.executable, "-m", "aggregator", "list-upstreams", "--json", "--config", str(path)],
        env=aggregator_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in done.stderr
    if isinstance(expected, ConfigError):
        assert done.returncode == 2 and done.stderr == f"aggregator: config error: {expected}\n"
        assert done.stdout == ""
    else:
        assert done.returncode == 0, done.stderr
        assert [row["name"] for row in json.loads(done.stdout)["upstreams"]] == list(expected.upstreams)
