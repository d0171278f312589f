"""`aggregator auth login NAME`, `auth status`, `auth logout NAME`: OAuth sign-in for remote upstreams.

`login` runs the upstream's OAuth flow (upstream/oauth_providers.py) with a browser step: the authorization
URL is printed to stderr, opened in the desktop browser when there is one, or handed to the
command in `AGGREGATOR_BROWSER`; the redirect comes back to a listener on 127.0.0.1. Tokens go
to the token store (the keyring, or the data dir's file at 0600), never to stdout or a log.
`status` shows who is signed in, with expiry and scopes, never a token. Exit codes: 0 done, 1 the
sign-in failed, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from aggregator.cli.exit_codes import EXIT_FAILED, EXIT_USAGE
from aggregator.config import AggregatorConfig, UpstreamConfig
from aggregator.log import redact_text
from aggregator.settings import Settings, data_dir_of
from aggregator.suggest import did_you_mean
from aggregator.table import render_table
from aggregator.upstream.oauth_providers import Authenticator, uses_oauth
from aggregator.upstream.oauth_signin import CALLBACK_TIMEOUT_SECONDS, login_command
from aggregator.upstream.oauth_tokens import TokenStore, TokenStoreError
from aggregator.upstream.pool import UpstreamPool

__all__ = ["STORE_FIX", "register", "sign_in_state"]


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `auth login|status|logout` to the CLI's subparsers."""
    auth = sub.add_parser(
        "auth",
        parents=[common],
        help="sign in to remote upstreams that use OAuth",
        description="Sign in once to remote upstreams behind OAuth; tokens stay in the system keyring or in the "
        "data dir (0600; AGGREGATOR_TOKEN_STORE chooses), never in the config or a log. login NAME signs in, "
        "status shows expiry, scopes and the store, logout NAME forgets.",
    )
    actions = auth.add_subparsers(dest="auth_action", metavar="ACTION", required=True)
    login = actions.add_parser(
        "login",
        parents=[common],
        help="sign in to one upstream (opens a browser, or prints the URL)",
        description="Sign in to an upstream that uses OAuth. The URL to open is printed to stderr; "
        "AGGREGATOR_BROWSER, if set, is a command that receives it as its last argument.",
    )
    login.add_argument("name", help="the upstream's name")
    login.set_defaults(handler=_login)
    status = actions.add_parser("status", parents=[common], help="who is signed in: expiry and scopes, never a token")
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.set_defaults(handler=_status)
    logout = actions.add_parser("logout", parents=[common], help="forget one upstream's tokens and registration")
    logout.add_argument("name", help="the upstream's name")
    logout.set_defaults(handler=_logout)
    for action in (login, status, logout):  # the tokens of a `serve --data-dir DIR` are in DIR
        action.add_argument("--data-dir", type=Path, help="the data dir whose tokens to use (as serve --data-dir)")


STORE_FIX = "unset AGGREGATOR_TOKEN_STORE (or set it to file), or install a keyring backend"


def _store(args: argparse.Namespace, settings: Settings) -> TokenStore:
    return TokenStore.in_data_dir(data_dir_of(args, settings))


def _remote(config: AggregatorConfig, name: str) -> UpstreamConfig | str:
    """The upstream that signs in, or why `name` is not one."""
    upstream = config.upstreams.get(name)
    if upstream is None and (name in config.broken or name in config.disabled):
        why = "the warning above says why" if name in config.broken else "disabled: true"
        return f"upstream {name!r} is disabled here ({why}); enable it, then sign in"
    if upstream is None:
        signing = [n for n, u in config.upstreams.items() if uses_oauth(u)]
        known = ", ".join(signing) or "none"
        return f"no upstream named {name!r}{did_you_mean(name, signing)} (upstreams that sign in: {known})"
    if not uses_oauth(upstream):
        why = (
            "a local (stdio) server"
            if upstream.transport == "stdio"
            else "set to auth: none or an Authorization header"
        )
        return f"upstream {name!r} does not sign in with OAuth ({why})"
    return upstream


async def _login(args: argparse.Namespace, config: AggregatorConfig, settings: Settings) -> int:
    upstream = _remote(config, args.name)
    if isinstance(upstream, str):
        print(f"aggregator: {upstream}", file=sys.stderr)
        return EXIT_USAGE
    data_dir = data_dir_of(args, settings)
    store = TokenStore.in_data_dir(data_dir)
    try:
        store.update(upstream.name, upstream.url, tokens=None, expires_at=None)  # a fresh sign-in, not the old token
    except TokenStoreError as exc:
        print(f"aggregator: cannot keep tokens: {exc}", file=sys.stderr)
        return EXIT_FAILED
    patient = upstream.timeouts.model_copy(update={"connect": CALLBACK_TIMEOUT_SECONDS + upstream.timeouts.connect})
    one = config.model_copy(update={"upstreams": {upstream.name: upstream.model_copy(update={"timeouts": patient})}})
    authenticator = Authenticator(store, interactive=True, browser=settings.browser)
    async with UpstreamPool.running(one, data_dir, authenticator=authenticator) as pool:
        outcome = await pool.start_all([upstream.name])
        [status] = pool.statuses()
    fault = outcome.get(upstream.name)
    state = sign_in_state(store, upstream)
    if fault is not None and state["state"] == "signed out":  # why, without "upstream X could not start: "
        why = redact_text(status.last_error or "").removeprefix("sign-in failed: ") or fault.message
        why = why.removesuffix(f": run `{login_command(upstream.name)}`")  # the command that just ran
        print(f"aggregator: sign-in to {upstream.name!r} failed: {why}", file=sys.stderr)
        return EXIT_FAILED
    if fault is None and state["state"] == "signed out":  # it served us without asking for a sign-in
        print(f"{upstream.name} did not ask for a sign-in: it answers without one (nothing was stored)")
        return 0
    print(f"signed in to {upstream.name}{_describe(state)}")
    if fault is not None:
        print(f"aggregator: signed in, but the upstream did not start: {fault.message}", file=sys.stderr)
    return 0


async def _status(args: argparse.Namespace, config: AggregatorConfig, settings: Settings) -> int:
    store = _store(args, settings)
    rows = [sign_in_state(store, u) for u in config.upstreams.values() if uses_oauth(u)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no upstream signs in with OAuth")
        return 0
    table = [[r["name"], r["auth"], r["state"], _expiry_text(r["expires_in"]), r["scopes"] or "-"] for r in rows]
    print(render_table(["NAME", "AUTH", "STATE", "EXPIRES", "SCOPES"], table))
    if (unusable := store.unusable()) is not None:  # not "kept in: none: ..."
        print(f"tokens cannot be kept: {unusable}; {STORE_FIX}")
    else:
        print(f"tokens are kept in: {rows[0]['store']}")
    return 0


async def _logout(args: argparse.Namespace, config: AggregatorConfig, settings: Settings) -> int:
    store = _store(args, settings)
    try:
        removed = store.remove(args.name)  # also the tokens of an upstream no longer in the config
    except TokenStoreError as exc:
        print(f"aggregator: cannot reach the token store: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if removed:
        print(f"signed out of {args.name}: its tokens and client registration are forgotten")
    elif not {args.name} & {*config.upstreams, *config.broken, *config.disabled}:  # a typo: say so
        print(f"aggregator: {_remote(config, args.name)}", file=sys.stderr)
        return EXIT_USAGE
    else:
        print(f"{args.name} was not signed in")
    return 0


def sign_in_state(store: TokenStore, upstream: UpstreamConfig) -> dict[str, Any]:
    """Name, auth kind, state (signed in / expired / signed out), seconds left, scopes, and which store
    holds the tokens: never a token."""
    try:
        entry = store.entry(upstream.name, upstream.url)
    except TokenStoreError:
        entry = {}
    tokens = entry.get("tokens") or {}
    expires_at = entry.get("expires_at")
    left = round(expires_at - time.time()) if isinstance(expires_at, int | float) else None
    if not tokens.get("access_token"):
        state = "signed out"
    elif left is not None and left <= 0:
        state = "expired, will refresh" if tokens.get("refresh_token") else "expired"
    else:
        state = "signed in"
    return {
        "name": upstream.name,
        "auth": upstream.auth or "auto",  # auto: OAuth once the server asks for it
        "state": state,
        "expires_in": left,
        "scopes": redact_text(str(tokens.get("scope") or "")),
        "store": store.where(),
    }


def _describe(state: dict[str, Any]) -> str:
    parts = [f"expires in {_expiry_text(state['expires_in'])}"] if state["expires_in"] is not None else []
    if state["scopes"]:
        parts.append(f"scopes: {state['scopes']}")
    return f" ({'; '.join(parts)})" if parts else ""


def _expiry_text(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    if seconds <= 0:
        return "expired"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
