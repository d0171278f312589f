"""OAuth for remote upstreams, against a real authorization server and protected MCP server.

`tests/oauth_server.py` runs as a subprocess on 127.0.0.1 (the SDK's server-side auth: resource
metadata, discovery, dynamic registration, PKCE, refresh, tokens bound to their resource);
`tests/oauth_browser.py` is the `AGGREGATOR_BROWSER` that completes the sign-in. The aggregator
runs as its command line does (`main([...])`), so every step is the user's.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from aggregator.cli.commands import main
from tests.conftest import free_port, wait_for_port, write_config

HERE = Path(__file__).parent
BROWSER = f"{sys.executable} {HERE / 'oauth_browser.py'}"


class AuthServer:
    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "oauth_server.py"), str(self.port), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        wait_for_port(self.port, self.proc)

    def stats(self) -> dict[str, int]:
        return dict(httpx2.get(f"http://127.0.0.1:{self.port}/test/stats").json())

    def revoke(self) -> None:
        httpx2.post(f"http://127.0.0.1:{self.port}/test/revoke")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[AuthServer]:
    marker = request.node.get_closest_marker("server_args")
    srv = AuthServer(*(marker.args if marker else ()))
    yield srv
    srv.stop()


@pytest.fixture
def setup(server: AuthServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    data = tmp_path / "data"
    log = tmp_path / "aggregator.log"
    monkeypatch.setenv("AGGREGATOR_DATA_DIR", str(data))
    monkeypatch.setenv("AGGREGATOR_LOG_FILE", str(log))
    monkeypatch.setenv("AGGREGATOR_LOG_LEVEL", "debug")
    monkeypatch.delenv("AGGREGATOR_BROWSER", raising=False)
    config = write_config(tmp_path, {"remote": {"url": server.url}})
    return {"config": str(config), "data": data, "log": log}


def run(capsys: pytest.CaptureFixture[str], setup: dict[str, Any], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([*argv[:1], "--config", setup["config"], *argv[1:]])
    out, err = capsys.readouterr()
    return code, out, err


def login(capsys: pytest.CaptureFixture[str], setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AGGREGATOR_BROWSER", BROWSER)
    code, out, err = run(capsys, setup, "auth", "login", "remote")
    monkeypatch.delenv("AGGREGATOR_BROWSER")
    assert code == 0, err
    return out


def tokens(setup: dict[str, Any]) -> dict[str, Any]:
    entry = json.loads((setup["data"] / "oauth-tokens.json").read_text())["remote"]
    return dict(entry["tokens"])


def test_sign_in_then_calls_and_the_token_stays_in_the_store(
    server: AuthServer, setup: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run(capsys, setup, "call", "remote", "echo", "text=before")
    assert code == 1 and "sign-in needed: run `aggregator auth login remote`" in out + err

    assert "signed in to remote" in login(capsys, setup, monkeypatch)
    store = setup["data"] / "oauth-tokens.json"
    assert stat.S_IMODE(store.stat().st_mode) == 0o600
    code, out, err = run(capsys, setup, "call", "remote", "echo", "text=after")
    assert (code, out.strip()) == (0, "after"), err
    code, out, err = run(capsys, setup, "auth", "status", "--json")
    [row] = json.loads(out)
    assert row["name"] == "remote" and row["state"] == "signed in" and row["expires_in"] > 3000

    secrets = [v for k, v in tokens(setup).items() if k in ("access_token", "refresh_token")]
    assert len(secrets) == 2
    for path in setup["data"].rglob("*"):
        if path.is_file() and path != store:
            assert not any(s.encode() in path.read_bytes() for s in secrets), path
    assert setup["log"].read_text() and not any(s in setup["log"].read_text() for s in secrets)
    assert not any(s in out + err for s in secrets)

    code, out, err = run(capsys, setup, "auth", "logout", "remote")
    assert code == 0 and "remote" not in json.loads(store.read_text())
    code, out, err = run(capsys, setup, "call", "remote", "echo", "text=gone")
    assert code == 1 and "aggregator auth login remote" in out + err


@pytest.mark.server_args("--token-seconds", "2")
def test_an_expired_token_is_refreshed_and_a_revoked_one_asks_for_sign_in(
    server: AuthServer, setup: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    login(capsys, setup, monkeypatch)
    first = tokens(setup)["access_token"]
    time.sleep(2.2)
    code, out, err = run(capsys, setup, "call", "remote", "echo", "text=refreshed")
    assert (code, out.strip()) == (0, "refreshed"), err
    assert server.stats()["refresh_token"] >= 1 and server.stats()["authorization_code"] == 1
    assert tokens(setup)["access_token"] != first

    server.revoke()
    started = time.monotonic()
    code, out, err = run(capsys, setup, "call", "remote", "echo", "text=revoked")
    assert code == 1 and "sign-in needed: run `aggregator auth login remote`" in out + err
    assert time.monotonic() - started < 20  # at once: no browser is waited for


@pytest.mark.server_args("--resource", "http://127.0.0.1:1/elsewhere")
def test_a_server_announcing_another_resource_is_refused(
    server: AuthServer, setup: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGGREGATOR_BROWSER", BROWSER)
    code, _, err = run(capsys, setup, "auth", "login", "remote")
    assert code == 1 and "sign-in failed" in err and "does not match" in err
    assert server.stats() == {"authorization_code": 0, "refresh_token": 0}


def test_login_names_what_cannot_sign_in(
    server: AuthServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGGREGATOR_DATA_DIR", str(tmp_path / "data"))
    config = write_config(
        tmp_path, {"plain": {"url": server.url, "auth": "none"}, "local": {"command": sys.executable}}
    )
    assert main(["auth", "login", "--config", str(config), "plain"]) == 2
    assert main(["auth", "login", "--config", str(config), "local"]) == 2
    assert main(["auth", "login", "--config", str(config), "nope"]) == 2
    err = capsys.readouterr().err
    assert "auth: none" in err and "stdio" in err and "no upstream named 'nope'" in err
    assert not os.path.exists(tmp_path / "data" / "oauth-tokens.json")
