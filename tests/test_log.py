"""Logging: stderr (never stdout) or a file, one redacted key=value line per event."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from aggregator.config import UpstreamConfig
from aggregator.log import (
    configure_logging,
    forget_secrets,
    get_logger,
    is_secret_key,
    redact_text,
    register_secrets,
    reset_logging,
)


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    yield
    reset_logging()


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line]


def test_logs_go_to_stderr_never_stdout() -> None:
    script = textwrap.dedent(
        """
        import logging
        from aggregator.log import configure_logging, get_logger
        log = get_logger("aggregator.probe")
        log.warning("before configure", upstream="git")
        configure_logging("debug")
        log.debug("after configure", upstream="git")
        logging.getLogger("mcp.client.stdio").warning("from the sdk")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout == ""
    lines = _lines(done.stderr)
    assert len(lines) == 3
    assert 'event="before configure"' in lines[0] and "upstream=git" in lines[0]
    assert "level=debug" in lines[1] and "logger=aggregator.probe" in lines[1]
    assert "logger=mcp.client.stdio" in lines[2] and 'event="from the sdk"' in lines[2]


def test_line_format(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info")
    get_logger("aggregator.t").info("upstream ready", upstream="git", tools=12, note='say "hi"\nbye')
    (line,) = _lines(capsys.readouterr().err)
    assert line.startswith("timestamp=")
    assert ' level=info logger=aggregator.t event="upstream ready" upstream=git tools=12 ' in line
    assert line.endswith('note="say \\"hi\\"\\nbye"')


@pytest.mark.parametrize(
    "key",
    [
        "token",
        "access_token",
        "refreshToken",
        "Authorization",
        "password",
        "db_passwd",
        "client_secret",
        "api_key",
        "apiKey",
        "X-Api-Key",
        "cookie",
        "Set-Cookie",
        "headers",
        "env",
        "credentials",
    ],
)
def test_secret_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["event", "upstream", "tool", "tokens", "max_tokens", "tool_count", "environmental"])
def test_ordinary_keys(key: str) -> None:
    assert not is_secret_key(key)


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("Authorization: Bearer eyJhbGciOi.J9.abc-def_ghi", "eyJhbGciOi"),
        ("auth=Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
        ("GET https://api.example.com/mcp?access_token=tok123&x=1", "tok123"),
        ("connecting to postgres://admin:hunter2@db:5432/x", "hunter2"),
        ("config has password=hunter2, retrying", "hunter2"),
        ('{"api_key": "sk-live-abc"}', "sk-live-abc"),
    ],
)
def test_credentials_inside_strings_are_masked(text: str, secret: str) -> None:
    masked = redact_text(text)
    assert secret not in masked
    assert "***" in masked


def test_secrets_are_redacted_in_events(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("debug")
    upstream = UpstreamConfig(
        name="docs",
        transport="http",
        url="http://h/mcp",
        headers={"Authorization": "Bearer header-secret-1"},
    )
    log = get_logger("aggregator.t")
    log.info(
        "connecting",
        token="tok-secret-2",
        headers={"Authorization": "Bearer hdr-secret-3"},
        env={"GITHUB_TOKEN": "env-secret-4"},
        config={"nested": {"api_key": "nested-secret-5"}, "args": ["--token=arg-secret-6"]},
        message="using Bearer bearer-secret-7",
        upstream=upstream,
        url="https://h/mcp?token=url-secret-8",
    )
    err = capsys.readouterr().err
    for number in range(1, 9):
        assert f"secret-{number}" not in err
    assert "upstream=" in err and "docs" in err  # the model is logged, minus its secrets
    assert err.count("***") >= 8


def test_stdlib_records_are_redacted_and_share_the_sink(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("warning")
    logging.getLogger("httpx2").warning("request failed: %s", "Authorization: Bearer std-secret")
    err = capsys.readouterr().err
    assert "std-secret" not in err
    assert "logger=httpx2" in err and "level=warning" in err


def test_exceptions_are_one_line_and_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("warning")
    try:
        raise RuntimeError("bad header Bearer exc-secret")
    except RuntimeError:
        get_logger("aggregator.t").exception("call failed", upstream="docs")
    (line,) = _lines(capsys.readouterr().err)
    assert "exc-secret" not in line
    assert "level=error" in line and "Traceback" in line and "RuntimeError" in line


def test_levels(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info")
    log = get_logger("aggregator.t")
    log.debug("hidden debug")
    log.info("shown info")
    logging.getLogger("mcp.server").info("sdk info hidden: the stdlib stays at warning")
    logging.getLogger("mcp.server").warning("sdk warning shown")
    err = capsys.readouterr().err
    assert "shown info" in err and "sdk warning shown" in err
    assert "hidden" not in err

    configure_logging("error")
    logging.getLogger("mcp.server").warning("below error")
    log.warning("below error too")
    log.error("shown error")
    err = capsys.readouterr().err
    assert "below error" not in err and "shown error" in err


def test_configure_twice_does_not_duplicate_lines(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("warning")
    configure_logging("warning")
    get_logger("aggregator.t").warning("once")
    logging.getLogger("uvicorn.error").warning("once from stdlib")
    assert len(_lines(capsys.readouterr().err)) == 2


def test_file_sink(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "logs" / "aggregator.log"
    configure_logging("info", path)
    get_logger("aggregator.t").info("to the file", password="file-secret")
    logging.getLogger("mcp").error("sdk to the file")
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""
    lines = _lines(path.read_text(encoding="utf-8"))
    assert len(lines) == 2
    assert 'event="to the file"' in lines[0] and "password=***" in lines[0]
    assert "file-secret" not in lines[0]
    configure_logging("info")  # switching back to stderr closes the file handler
    get_logger("aggregator.t").info("back on stderr")
    assert "back on stderr" in capsys.readouterr().err
    assert len(_lines(path.read_text(encoding="utf-8"))) == 2


def test_unknown_level_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown log level"):
        configure_logging("loud")


def test_registered_secret_values_are_masked_in_any_shape() -> None:
    """Configured values are masked as they are, escaped, trimmed and word by word; short ones are not."""
    register_secrets(["Bearer tok-123456789\n", "plainsecretvalue", "dev"])
    try:
        for text in (
            "header value 'Bearer tok-123456789\\n' is invalid",  # repr-escaped newline
            '{"authorization": "Bearer tok-123456789\\n"}',  # JSON-escaped
            "using tok-123456789 now",  # the token alone
            "the value is plainsecretvalue, see",
        ):
            masked = redact_text(text)
            assert "tok-123456789" not in masked and "plainsecretvalue" not in masked, masked
            assert "***" in masked
        assert redact_text("dev mode") == "dev mode"  # under MIN_SECRET_CHARS: left alone
    finally:
        forget_secrets()
