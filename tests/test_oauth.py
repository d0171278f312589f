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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
def setup(
    server: AuthServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> dict[str, Any]:
    data = tmp_path / "data"
    log = tmp_path / "aggregator.log"
    monkeypatch.setenv("AGGREGATOR_DATA_DIR", str(data))
    monkeypatch.setenv("AGGREGATOR_LOG_FILE", str(log))
    monkeypatch.setenv("AGGREGATOR_LOG_LEVEL", "debug")
    monkeypatch.delenv("AGGREGATOR_BROWSER", raising=False)
    sse = (
        request.node.get_closest_marker("server_args")
        and "--sse" in request.node.get_closest_marker("server_args").args
    )
    url = server.url.replace("/mcp", "/sse") if sse else server.url
    config = write_config(tmp_path, {"remote": {"url": url, "transport": "sse" if sse else "http"}})
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
    assert code == 1 and "sign-in to 'remote' failed: Protected resource" in err and "does not match" in err
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


def test_doctor_says_which_upstream_needs_sign_in(
    server: AuthServer,
    setup: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home" / ".config"))
    _, out, _ = run(capsys, setup, "doctor")
    assert "PROBLEM upstream remote: sign-in needed. Fix: run `aggregator auth login remote`" in out
    _, out, _ = run(capsys, setup, "doctor", "--no-probe")
    assert "note    upstream remote: found (not probed); not signed in" not in out  # auth unset: not known yet
    login(capsys, setup, monkeypatch)
    _, out, _ = run(capsys, setup, "doctor")
    assert "ok      upstream remote: ready, 1 tool" in out
    _, out, _ = run(capsys, setup, "doctor", "--no-probe")
    assert "ok      upstream remote: found (not probed); signed in" in out
    assert tokens(setup)["access_token"] not in out


def test_mcp_remote_entries_import_as_native_oauth_upstreams() -> None:
    from aggregator.config.importing import translate

    assert translate({"command": "npx", "args": ["-y", "mcp-remote", "https://mcp.example/mcp"]}, "claude") == (
        {"url": "https://mcp.example/mcp", "auth": "oauth"},
        "",
    )
    sse = {"command": "npx", "args": ["mcp-remote@latest", "https://x.example/sse", "--transport", "sse-only"]}
    assert translate(sse, "cursor") == ({"url": "https://x.example/sse", "auth": "oauth", "transport": "sse"}, "")
    static = {
        "command": "npx",
        "args": ["mcp-remote", "https://x.example/mcp", "--header", "Authorization:${AUTH}"],
        "env": {"AUTH": "Bearer abc"},
    }
    assert translate(static, "claude") == (  # the reference stays: the value is the client's secret
        {"url": "https://x.example/mcp", "headers": {"Authorization": "${AUTH}"}},
        "",
    )
    client = {"client_id": "id1", "client_secret": "s3"}
    pre = {
        "command": "npx",
        "args": ["mcp-remote", "https://x.example/mcp", "9696", "--static-oauth-client-info", json.dumps(client)],
    }
    assert translate(pre, "claude")[0] == {"url": "https://x.example/mcp", "auth": "oauth", **client}
    assert translate({"command": "npx", "args": ["-y", "mcp-remote"]}, "claude")[0] == {
        "command": "npx",
        "args": ["-y", "mcp-remote"],
    }


def test_auth_kinds_name_the_keys_they_need(tmp_path: Path) -> None:
    from aggregator.config import ConfigError, parse_config

    def problem(entry: dict[str, Any]) -> str:
        with pytest.raises(ConfigError) as info:
            parse_config(json.dumps({"upstreams": {"r": entry}}), "c.yaml", environ={})
        return f"{info.value.key}: {info.value.problem}"

    url = "https://mcp.example/mcp"
    assert (
        problem({"url": url, "auth": "client_credentials"})
        == "upstreams.r.auth: auth: client_credentials needs client_id"
    )
    assert problem({"url": url, "auth": "client_credentials", "client_id": "c"}).endswith(
        "needs client_secret or client_private_key"
    )
    assert problem({"url": url, "auth": "identity_assertion", "client_id": "c", "client_secret": "s"}).endswith(
        "needs issuer"
    )
    assert (
        problem({"command": "x", "scopes": ["a"]}) == "upstreams.r.scopes: scopes applies only to a remote server (url)"
    )
    assert problem({"url": url, "auth": "sometimes"}).startswith("upstreams.r.auth: input should be")
    config = parse_config(
        json.dumps({"upstreams": {"r": {"url": url, "client_secret": "${SECRET}", "client_id": ""}}}),
        "c.yaml",
        environ={"SECRET": "s3cr3t-value"},
    )
    assert config.upstreams["r"].client_id is None and "s3cr3t" not in repr(config.upstreams["r"])


@pytest.mark.server_args("--sse")
def test_sse_upstreams_sign_in_too(
    server: AuthServer, setup: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run(capsys, setup, "call", "remote", "echo", "text=before")
    assert code == 1 and "aggregator auth login remote" in out + err
    login(capsys, setup, monkeypatch)
    code, out, err = run(capsys, setup, "call", "remote", "echo", "text=over sse")
    assert (code, out.strip()) == (0, "over sse"), err


def test_a_forged_callback_state_is_refused(
    server: AuthServer, setup: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGGREGATOR_BROWSER", f"{BROWSER} --tamper-state")
    code, _, err = run(capsys, setup, "auth", "login", "remote")
    assert code == 1 and "sign-in to 'remote' failed: State parameter mismatch" in err
    assert server.stats()["authorization_code"] == 0


# ---------------------------------------------------------------- the loopback listener, attacked


async def _sign_in_through(garbage: list[bytes]) -> Any:
    """Start a sign-in's listener, send it `garbage` on connections of their own, then the real redirect."""
    import anyio

    from aggregator.upstream.oauth_signin import BrowserStep

    step = BrowserStep("x", free_port(), interactive=True, browser="true")  # a browser that opens nothing
    await step.redirect("http://127.0.0.1:1/authorize")
    result: list[Any] = []

    async def wait() -> None:
        result.append(await step.callback())

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        for payload in [*garbage, b"GET /callback?code=the-code&state=s1 HTTP/1.1\r\nHost: x\r\n\r\n"]:
            async with await anyio.connect_tcp("127.0.0.1", step.port) as stream:
                if payload:
                    await stream.send(payload)
                await stream.send_eof()
                with anyio.move_on_after(5):
                    while True:
                        try:
                            await stream.receive()
                        except (anyio.EndOfStream, anyio.BrokenResourceError):
                            break
    return result[0]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(max_size=200), max_size=5))
def test_the_loopback_listener_answers_only_the_callback(garbage: list[bytes]) -> None:
    import anyio

    hostile = [
        *garbage,
        b"GET /other?code=stolen HTTP/1.1\r\n\r\n",
        b"POST /callback?code=posted HTTP/1.1\r\n\r\n",
        b"GET /callback?state=s1 HTTP/1.1\r\n\r\n",
        b"GET /callback?code=x " + b"A" * 20000,
    ]
    result = anyio.run(_sign_in_through, [g for g in hostile if b"code=" not in g or b"GET /callback?" not in g])
    assert (result.code, result.state) == ("the-code", "s1")


async def test_while_serving_a_needed_sign_in_fails_at_once_and_a_login_elsewhere_takes_effect(
    server: AuthServer, setup: dict[str, Any], tmp_path: Path
) -> None:
    import anyio

    from tests.conftest import aggregator_client, aggregator_env

    env = aggregator_env(AGGREGATOR_DATA_DIR=str(setup["data"]), AGGREGATOR_BROWSER=BROWSER)  # serve never uses it
    request = {"server": "remote", "tool": "echo", "arguments": {"text": "served"}}
    async with aggregator_client(Path(setup["config"]), env=env, errlog=(tmp_path / "serve.err").open("w")) as client:
        started = time.monotonic()
        refused = await client.call_tool("catalog_call_tool", request)
        assert refused.is_error and "sign-in needed: run `aggregator auth login remote`" in refused.content[0].text
        assert time.monotonic() - started < 10
        login_env = {**env, "AGGREGATOR_LOG_FILE": str(tmp_path / "login.log")}
        argv = [sys.executable, "-m", "aggregator", "auth", "login", "remote", "--config", setup["config"]]
        done = await anyio.run_process(argv, env=login_env, check=False)
        assert done.returncode == 0, done.stderr
        answered = await client.call_tool("catalog_call_tool", request)
        assert not answered.is_error and answered.content[0].text == "served"
    secret = tokens(setup)["access_token"]
    assert secret not in (tmp_path / "serve.err").read_text()


async def test_tokens_are_stored_with_the_client_they_were_issued_to_when_two_sign_ins_race() -> None:
    from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

    from aggregator.upstream.oauth_tokens import StoredTokens, TokenStore

    store, url = TokenStore(None), "http://127.0.0.1:1/mcp"
    first, second = StoredTokens(store, "r", url, None), StoredTokens(store, "r", url, None)
    assert await first.get_client_info() is None and await second.get_client_info() is None
    await first.set_client_info(OAuthClientInformationFull(client_id="first", redirect_uris=None))
    await second.set_client_info(OAuthClientInformationFull(client_id="second", redirect_uris=None))
    await first.set_tokens(OAuthToken(access_token="issued-to-first", refresh_token="r1"))  # first finishes last
    entry = store.entry("r", url)
    assert (entry["client"]["client_id"], entry["tokens"]["refresh_token"]) == ("first", "r1")
    assert (await StoredTokens(store, "r", url, None).get_client_info()).client_id == "first"  # type: ignore[union-attr]


async def test_a_sign_in_refused_while_serving_remembers_its_scopes_for_the_next_login() -> None:
    from aggregator.config import UpstreamConfig
    from aggregator.upstream.oauth_providers import Authenticator
    from aggregator.upstream.oauth_signin import SignInRequired
    from aggregator.upstream.oauth_tokens import TokenStore

    store = TokenStore(None)
    config = UpstreamConfig(name="r", transport="http", url="http://127.0.0.1:1/mcp", scopes=["read"])
    serving = Authenticator(store)
    provider: Any = serving.auth_for(config).provider  # type: ignore[union-attr]
    assert provider.extra_scope == "read"
    with pytest.raises(SignInRequired, match="aggregator auth login r"):  # a step-up to write, while serving
        await provider.context.redirect_handler("http://as.test/authorize?scope=read+write&state=s")
    assert store.entry("r", config.url)["wanted_scope"] == "read write"
    login: Any = Authenticator(store, interactive=True, browser="true").auth_for(config).provider  # type: ignore[union-attr]
    assert login.extra_scope == "read write"


def test_a_config_reload_keeps_the_sign_in(
    server: AuthServer, setup: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import anyio

    from aggregator.config.load import load_config
    from aggregator.upstream.pool import UpstreamPool

    login(capsys, setup, monkeypatch)
    config = load_config(Path(setup["config"]), environ={}, cwd=Path(setup["config"]).parent)

    async def body() -> list[Any]:
        async with UpstreamPool.running(config, setup["data"]) as pool:
            first = await pool.call_tool("remote", "echo", {"text": "one"})
            changed = config.upstreams["remote"].model_copy(update={"description": "edited"})
            diff = pool.apply_config(config.model_copy(update={"upstreams": {"remote": changed}}))
            assert diff.changed == ["remote"]
            return [first, await pool.call_tool("remote", "echo", {"text": "two"})]

    results = anyio.run(body)
    assert [r["content"][0]["text"] for r in results] == ["one", "two"]
    assert server.stats()["authorization_code"] == 1  # no second sign-in
