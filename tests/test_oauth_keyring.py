"""OAuth tokens in the system keyring (`AGGREGATOR_TOKEN_STORE`), against the real servers of test_oauth.

The keyring is the real `keyring` package with a backend that works headless: `keyrings.alt`'s
file backend (in the test extra), kept in this test's own XDG data dir. Every other test runs with
keyring's fail backend (tests/conftest.py), so none touches the user's keyring.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_oauth import AuthServer, login, run, server, setup  # noqa: F401  (fixtures)

pytest.importorskip("keyring", reason="the optional keyring package is not installed (pip install -e '.[test]')")
pytest.importorskip("keyrings.alt.file", reason="keyrings.alt (a headless keyring backend) is not installed")

HEADLESS = "keyrings.alt.file.PlaintextKeyring"
SERVICE = "aggregator-oauth"


def in_keyring(data: Path) -> dict[str, Any]:
    """What the keyring holds for this data dir: {upstream: entry}."""
    from keyring.core import load_keyring

    backend = load_keyring(HEADLESS)
    scope = str(data / "oauth-tokens.json")
    names = json.loads(backend.get_password(SERVICE, scope) or "[]")
    return {name: json.loads(backend.get_password(SERVICE, f"{scope}:{name}") or "null") for name in names}


def in_file(data: Path) -> dict[str, Any]:
    path = data / "oauth-tokens.json"
    return dict(json.loads(path.read_text())) if path.exists() else {}


def status(capsys: pytest.CaptureFixture[str], setup: dict[str, Any]) -> dict[str, Any]:  # noqa: F811
    code, out, err = run(capsys, setup, "auth", "status", "--json")
    assert code == 0, err
    [row] = json.loads(out)
    return dict(row)


def test_tokens_live_in_the_keyring_move_between_stores_and_logout_clears_both(
    server: AuthServer,  # noqa: F811
    setup: dict[str, Any],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data: Path = setup["data"]
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", HEADLESS)
    monkeypatch.setenv("AGGREGATOR_TOKEN_STORE", "keyring")
    assert "signed in to remote" in login(capsys, setup, monkeypatch)
    secret = in_keyring(data)["remote"]["tokens"]["access_token"]
    assert "remote" not in in_file(data) and not any(secret in p.read_text() for p in data.rglob("*") if p.is_file())
    code, out, err = run(capsys, setup, "call", "remote", "echo", "text=from the keyring")
    assert (code, out.strip()) == (0, "from the keyring"), err
    row = status(capsys, setup)
    assert row["state"] == "signed in" and row["store"] == f"keyring {HEADLESS}" and secret not in json.dumps(row)
    _, out, _ = run(capsys, setup, "doctor", "--no-probe")
    assert f"OAuth tokens: kept in keyring {HEADLESS}" in out and secret not in out

    monkeypatch.setenv("AGGREGATOR_TOKEN_STORE", "file")  # moving to the file loses nothing ...
    row = status(capsys, setup)
    assert row["state"] == "signed in" and row["store"].startswith("file ")
    assert in_file(data)["remote"]["tokens"]["access_token"] == secret and in_keyring(data) == {}
    code, out, err = run(capsys, setup, "call", "remote", "echo", "text=from the file")
    assert (code, out.strip()) == (0, "from the file"), err

    monkeypatch.setenv("AGGREGATOR_TOKEN_STORE", "keyring")  # ... nor does moving back
    assert status(capsys, setup)["state"] == "signed in"
    assert "remote" in in_keyring(data) and "remote" not in in_file(data)
    assert server.stats()["authorization_code"] == 1  # one sign-in through it all

    monkeypatch.setenv("AGGREGATOR_TOKEN_STORE", "file")
    code, out, _ = run(capsys, setup, "auth", "logout", "remote")  # leaves it in neither store
    assert code == 0 and "signed out of remote" in out
    assert in_keyring(data) == {} and "remote" not in in_file(data)


def test_auto_uses_a_system_keyring_only_and_an_unusable_chosen_keyring_is_a_clear_error(
    setup: dict[str, Any],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", HEADLESS)  # a plain file: no better than ours, auto keeps ours
    where = status(capsys, setup)["store"]
    assert where.startswith("file ") and f"keyring not used: no system keyring backend ({HEADLESS})" in where

    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")
    monkeypatch.setenv("AGGREGATOR_TOKEN_STORE", "keyring")
    assert "no usable keyring backend" in status(capsys, setup)["store"]
    monkeypatch.setenv("AGGREGATOR_BROWSER", "true")
    code, _, err = run(capsys, setup, "auth", "login", "remote")
    assert code == 1 and "cannot keep tokens: AGGREGATOR_TOKEN_STORE=keyring, but no usable keyring backend" in err
    assert not (setup["data"] / "oauth-tokens.json").exists()

    monkeypatch.setenv("AGGREGATOR_TOKEN_STORE", "vault")
    code, _, err = run(capsys, setup, "auth", "status")
    assert code == 2 and "AGGREGATOR_TOKEN_STORE" in err


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    index=st.one_of(st.text(max_size=40), json_values.map(json.dumps)),
    entry=st.one_of(st.text(max_size=40), json_values.map(json.dumps)),
)
def test_whatever_the_keyring_holds_reads_as_entries_or_signed_out(
    index: str, entry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from keyring.core import load_keyring

    from aggregator.upstream.oauth_tokens import TokenStore

    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", HEADLESS)
    backend = load_keyring(HEADLESS)
    scope = str(tmp_path / "oauth-tokens.json")
    backend.set_password(SERVICE, scope, index)
    backend.set_password(SERVICE, f"{scope}:remote", entry)
    store = TokenStore(tmp_path / "oauth-tokens.json", "keyring")
    entries = store.read()
    assert all(isinstance(value, dict) for value in entries.values())
    assert isinstance(store.entry("remote", "https://x.example/mcp"), dict)
    store.update("remote", "https://x.example/mcp", tokens={"access_token": "a"})  # and it heals
    assert store.entry("remote", "https://x.example/mcp")["tokens"] == {"access_token": "a"}
    assert store.remove("remote") and store.read() == {}


async def test_an_unusable_chosen_keyring_is_a_clear_upstream_error_never_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aggregator.config import parse_config
    from aggregator.faults import Fault, SignInNeeded
    from aggregator.upstream.pool import UpstreamPool

    monkeypatch.setenv("AGGREGATOR_TOKEN_STORE", "keyring")  # and keyring's fail backend (tests/conftest.py)
    config = parse_config(json.dumps({"upstreams": {"r": {"url": "http://127.0.0.1:1/mcp"}}}), "c.yaml", environ={})
    async with UpstreamPool.running(config, tmp_path / "data") as pool:
        for _ in range(2):
            with pytest.raises(Fault) as refused:
                await pool.call_tool("r", "t", {})
            assert not isinstance(refused.value, SignInNeeded)
            assert "AGGREGATOR_TOKEN_STORE=keyring, but no usable keyring backend" in refused.value.message
