"""The mistakes a person makes with `aggregator auth` and the token store, as the command line answers them.

A typo is one line on stderr, exit code 2, no traceback, and the stored tokens stay as they were;
a token store that cannot be used (`AGGREGATOR_TOKEN_STORE=keyring` with no keyring) is one line
that says so, in `auth logout`, `call` and `doctor` alike, never an "unexpected error". No
upstream is started here but the one of `tests/oauth_server.py`, where a sign-in is refused.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.upstream.oauth_tokens import TokenStore
from tests.conftest import aggregator_env, run_main, write_config
from tests.test_cli import run_cli
from tests.test_oauth import BROWSER, AuthServer, server  # noqa: F401  (fixture)
from tests.test_oauth import run as oauth_run
from tests.test_oauth import setup as setup_remote  # noqa: F401  (fixture)
from tests.test_oauth_keyring import HEADLESS
from tests.test_pool import toolbox_over

URL = "http://127.0.0.1:9/mcp"
SECRET = "at-never-shown-3f1c"
UPSTREAMS = {"remote": {"url": URL, "auth": "oauth"}, "local": {"command": sys.executable}}


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    data = tmp_path / "data"
    monkeypatch.setenv("AGGREGATOR_DATA_DIR", str(data))
    monkeypatch.setenv("AGGREGATOR_TOKEN_STORE", "file")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AGGREGATOR_BROWSER", raising=False)
    TokenStore.in_data_dir(data).update("remote", URL, tokens={"access_token": SECRET, "token_type": "Bearer"})
    return {"config": str(write_config(tmp_path, UPSTREAMS)), "store": data / "oauth-tokens.json"}


def run(capsys: pytest.CaptureFixture[str], setup: dict[str, Any], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    done = run_main(capsys, *argv[:1], "--config", setup["config"], *argv[1:])
    assert SECRET not in done.stdout + done.stderr
    return done.returncode, done.stdout, done.stderr


def one_line(err: str) -> bool:
    return len(err.strip().splitlines()) == 1 and "Traceback" not in err and "unexpected" not in err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["auth", "login", "remot"], "no upstream named 'remot' (did you mean 'remote'?)"),
        (["auth", "logout", "remot"], "no upstream named 'remot' (did you mean 'remote'?)"),
        (["auth", "logout", "nme"], "no upstream named 'nme' (upstreams that sign in: remote)"),
        (["auth", "login", "local"], "does not sign in with OAuth"),
        (["auth", "statuss"], "did you mean 'status'?"),
    ],
)
def test_a_typo_is_one_line_exit_2_and_keeps_the_tokens(
    argv: list[str], expected: str, setup: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    before = setup["store"].read_bytes()
    code, _, err = run(capsys, setup, *argv)
    assert code == 2 and one_line(err) and expected in err, err
    assert setup["store"].read_bytes() == before


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,23}", fullmatch=True).filter(lambda n: n not in UPSTREAMS))
def test_logging_out_of_any_unknown_name_says_so_and_forgets_nothing(
    name: str, setup: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, setup, "auth", "logout", name)
    assert (code, out) == (2, "") and one_line(err) and f"no upstream named {name!r}" in err
    assert TokenStore.in_data_dir(setup["store"].parent).entry("remote", URL)["tokens"]["access_token"] == SECRET


def test_logout_forgets_an_upstream_already_removed_from_the_config(
    setup: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    TokenStore.in_data_dir(setup["store"].parent).update("gone", "https://gone.example/mcp", tokens={"a": "b"})
    code, out, _ = run(capsys, setup, "auth", "logout", "gone")
    assert code == 0 and "signed out of gone" in out
    assert "gone" not in TokenStore.in_data_dir(setup["store"].parent).read()
    code, out, _ = run(capsys, setup, "auth", "logout", "remote")  # in the config: a plain answer either way
    assert code == 0 and "signed out of remote" in out
    code, out, _ = run(capsys, setup, "auth", "logout", "remote")
    assert code == 0 and "remote was not signed in" in out


def test_a_chosen_keyring_that_is_not_there_is_one_clear_line_everywhere(
    setup: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGGREGATOR_TOKEN_STORE", "keyring")  # keyring's fail backend (tests/conftest.py)
    before = setup["store"].read_bytes()
    code, _, err = run(capsys, setup, "auth", "logout", "remote")
    assert code == 1 and one_line(err) and "cannot reach the token store: AGGREGATOR_TOKEN_STORE=keyring" in err
    code, out, _ = run(capsys, setup, "auth", "status")
    footer = "tokens cannot be kept: AGGREGATOR_TOKEN_STORE=keyring, but no usable keyring backend"
    assert code == 0 and footer in out and "unset AGGREGATOR_TOKEN_STORE" in out and "none:" not in out

    code, out, _ = run(capsys, setup, "doctor", "--no-probe")
    line = "PROBLEM OAuth tokens: no token store: AGGREGATOR_TOKEN_STORE=keyring, but no usable keyring backend"
    assert code == 1 and line in out and "Fix: unset AGGREGATOR_TOKEN_STORE" in out

    code, out, err = run(capsys, setup, "call", "remote", "echo", "text=x")
    assert code == 1 and one_line(out + err) and "TokenStoreError" not in err
    assert "could not start: no token store: AGGREGATOR_TOKEN_STORE=keyring" in err
    assert setup["store"].read_bytes() == before  # the file store keeps what it had


@pytest.mark.parametrize(
    ("browser", "why"),
    [
        ("--deny", "the authorization server refused the sign-in: access_denied the user said no"),
        ("--forged-deny", None),  # another page's refusal does not end this sign-in: it succeeds
        ("no-such-browser", "sign-in needed (AGGREGATOR_BROWSER could not run"),
    ],
)
def test_a_failed_sign_in_says_why_once_and_a_forged_refusal_is_ignored(
    browser: str,
    why: str | None,
    server: AuthServer,  # noqa: F811
    setup_remote: dict[str, Any],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    command = f"{BROWSER} {browser}" if browser.startswith("--") else str(setup_remote["data"] / browser)
    monkeypatch.setenv("AGGREGATOR_BROWSER", command)
    code, out, err = oauth_run(capsys, setup_remote, "auth", "login", "remote")
    log = setup_remote["log"].read_text()
    assert "Traceback" not in err + log and "OAuth flow error" not in log
    if why is None:
        assert code == 0 and "signed in to remote" in out, err
        return
    last = err.strip().splitlines()[-1]
    assert code == 1 and last.startswith(f"aggregator: sign-in to 'remote' failed: {why}"), err
    assert "could not start" not in last and "sign-in failed" not in last  # said once, without the plumbing
    assert "auth login" not in last  # not "run the command you just ran"
    assert "command not executable" not in err and server.stats()["authorization_code"] == 0


def test_login_to_a_server_that_asks_for_no_sign_in_does_not_claim_one(
    setup: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGGREGATOR_BROWSER", BROWSER)
    with toolbox_over("streamable-http") as url:
        for auth in ({}, {"auth": "oauth"}):  # found out, or configured and not asked for
            config = write_config(tmp_path, {"open": {"url": url, **auth}})
            done = run_main(capsys, "auth", "login", "--config", str(config), "open")
            assert done.returncode == 0 and "signed in" not in done.stdout, done.stderr
            assert "open did not ask for a sign-in: it answers without one" in done.stdout
            done = run_main(capsys, "auth", "status", "--config", str(config), "--json")
            assert json.loads(done.stdout)[0]["state"] == "signed out"


def test_client_credentials_without_issuer_is_a_doctor_note_never_a_raw_python_warning(
    server: AuthServer,  # noqa: F811  (it refuses these credentials: the start fails)
    setup: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    entry = {"url": server.url, "auth": "client_credentials", "client_id": "c", "client_secret": "cc-secret-qa"}
    config = write_config(tmp_path, {"cc": entry})
    env = aggregator_env(AGGREGATOR_DATA_DIR=str(tmp_path / "data"))
    done = run_cli("call", "cc", "echo", "text=x", "--config", str(config), env=env)  # as a user runs it
    assert done.returncode == 1 and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert "Warning" not in done.stderr and "cc-secret-qa" not in done.stderr
    assert "upstream 'cc' could not start: sign-in failed" in done.stderr

    doctor = run_main(capsys, "doctor", "--config", str(config))
    assert "note    upstream cc: no issuer: its client credentials go to whichever authorization" in doctor.stdout
    assert "Fix: check its url, headers and auth settings" in doctor.stdout and "by hand" not in doctor.stdout


def test_auth_help_names_both_token_stores(capsys: pytest.CaptureFixture[str]) -> None:
    done = run_main(capsys, "auth", "--help")
    text = " ".join(done.stdout.split())
    assert done.returncode == 0 and "system keyring or in the data dir (0600; AGGREGATOR_TOKEN_STORE chooses)" in text


def signed_in(
    token_store: str, remote: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Any:
    """`auth login remote` done with `token_store`; the config, loaded as a serving aggregator loads it."""
    from aggregator.config.load import load_config

    monkeypatch.setenv("AGGREGATOR_TOKEN_STORE", token_store)
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", HEADLESS)  # a file-based keyring, in this test's HOME
    monkeypatch.setenv("HOME", str(remote["data"].parent / "home"))
    monkeypatch.setenv("AGGREGATOR_BROWSER", BROWSER)
    assert oauth_run(capsys, remote, "auth", "login", "remote")[0] == 0
    monkeypatch.delenv("AGGREGATOR_BROWSER")
    return load_config(Path(remote["config"]), environ={}, cwd=Path(remote["config"]).parent)


@pytest.mark.server_args("--token-seconds", "3")
@pytest.mark.parametrize("token_store", ["file", "keyring"])
@pytest.mark.parametrize("expired", [False, True], ids=["held-token-valid", "held-token-expired"])
def test_a_logout_while_serving_takes_effect_at_once(
    token_store: str,
    expired: bool,
    server: AuthServer,  # noqa: F811
    setup_remote: dict[str, Any],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The serving pool holds the access token in memory. After `auth logout` in another terminal the very
    next call needs a sign-in: the held token is not sent again while it is still valid, and once it has
    expired it is not refreshed (which would write fresh tokens back and undo the logout)."""
    import anyio

    from aggregator.faults import SignInNeeded
    from aggregator.upstream.pool import UpstreamPool

    config = signed_in(token_store, setup_remote, capsys, monkeypatch)

    async def body() -> list[str]:
        answers = []
        async with UpstreamPool.running(config, setup_remote["data"]) as pool:  # a serving aggregator
            for text in ("one", "two"):
                answers.append(str((await pool.call_tool("remote", "echo", {"text": text}))["content"][0]["text"]))
            logout = await anyio.to_thread.run_sync(oauth_run, capsys, setup_remote, "auth", "logout", "remote")
            assert logout[0] == 0  # as in another terminal
            if expired:
                await anyio.sleep(3.2)  # the held token expires: the next call would refresh it
            with pytest.raises(SignInNeeded) as needed:
                await pool.call_tool("remote", "echo", {"text": "three"})
            assert "aggregator auth login remote" in needed.value.message
            with pytest.raises(SignInNeeded):  # and it stays so: nothing brought the old token back
                await pool.call_tool("remote", "echo", {"text": "four"})
        return answers

    assert anyio.run(body) == ["one", "two"]
    code, out, _ = oauth_run(capsys, setup_remote, "auth", "status", "--json")
    assert code == 0 and json.loads(out)[0]["state"] == "signed out"  # the logout stands


def test_a_disabled_upstream_is_named_as_disabled_not_unknown(
    setup: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    servers = {
        "gh": {"url": "${QA_NEVER_SET_URL}", "auth": "oauth"},  # unusable on this machine: disabled
        "idle": {"url": URL, "disabled": True},
    }
    config = tmp_path / "client.json"
    config.write_text(json.dumps({"mcpServers": servers}))
    for name, why in (("gh", "the warning above says why"), ("idle", "disabled: true")):
        done = run_main(capsys, "auth", "login", "--config", str(config), name)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last == f"aggregator: upstream {name!r} is disabled here ({why}); enable it, then sign in"
        done = run_main(capsys, "auth", "logout", "--config", str(config), name)
        assert done.returncode == 0 and done.stdout == f"{name} was not signed in\n"


@pytest.mark.parametrize("command", [["refresh", "remote"], ["search", "echo", "--load"]])
def test_refresh_and_search_load_sign_in_like_call_when_a_browser_is_set(
    command: list[str],
    server: AuthServer,  # noqa: F811
    setup_remote: dict[str, Any],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, err = oauth_run(capsys, setup_remote, *command)  # no browser: sign-in needed, at once
    assert "sign-in needed: run `aggregator auth login remote`" in out + err
    monkeypatch.setenv("AGGREGATOR_BROWSER", BROWSER)
    code, out, err = oauth_run(capsys, setup_remote, *command)
    assert code == 0 and "sign-in needed" not in out + err, out + err
    assert (setup_remote["data"] / "catalogs").is_dir() and server.stats()["authorization_code"] == 1
    monkeypatch.delenv("AGGREGATOR_BROWSER")
    code, out, _ = oauth_run(capsys, setup_remote, "auth", "status", "--json")
    assert json.loads(out)[0]["state"] == "signed in"


def test_every_command_takes_the_data_dir_serve_was_given(
    server: AuthServer,  # noqa: F811
    setup_remote: dict[str, Any],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    other = tmp_path / "served-with"  # `serve --data-dir` in a client's entry: sign in and work there
    monkeypatch.setenv("AGGREGATOR_BROWSER", BROWSER)
    code, out, err = oauth_run(capsys, setup_remote, "auth", "login", "remote", "--data-dir", str(other))
    assert code == 0 and "signed in to remote" in out, err
    assert (other / "oauth-tokens.json").exists() and not (setup_remote["data"] / "oauth-tokens.json").exists()
    monkeypatch.delenv("AGGREGATOR_BROWSER")  # from here on, only the tokens in `other` can serve
    code, out, _ = oauth_run(capsys, setup_remote, "auth", "status", "--json", "--data-dir", str(other))
    assert code == 0 and json.loads(out)[0]["state"] == "signed in"
    code, out, _ = oauth_run(capsys, setup_remote, "auth", "status", "--json")  # the default data dir: not there
    assert json.loads(out)[0]["state"] == "signed out"
    code, out, err = oauth_run(capsys, setup_remote, "call", "remote", "echo", "text=there", "--data-dir", str(other))
    assert (code, out) == (0, "there\n"), err
    code, out, err = oauth_run(capsys, setup_remote, "tools", "remote", "--data-dir", str(other))
    assert code == 0 and "echo" in out, err
    code, out, err = oauth_run(capsys, setup_remote, "describe", "remote", "echo", "--data-dir", str(other))
    assert code == 0 and "call: aggregator call remote echo" in out, err
    code, out, _ = oauth_run(capsys, setup_remote, "doctor", "--no-probe", "--data-dir", str(other))
    assert f"data dir: {other} is writable" in out and "upstream remote: found (not probed); signed in" in out
    code, out, err = oauth_run(capsys, setup_remote, "call", "remote", "echo", "text=here")  # the default dir
    assert code == 1 and "sign-in needed" in out + err
    code, out, _ = oauth_run(capsys, setup_remote, "auth", "logout", "remote", "--data-dir", str(other))
    assert code == 0 and "signed out of remote" in out
    assert "remote" not in json.loads((other / "oauth-tokens.json").read_text())
