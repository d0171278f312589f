"""The sign-in step of OAuth, and the error that says one is needed.

A loopback listener on 127.0.0.1 receives the redirect (the SDK checks state and PKCE); the
authorization URL goes to `AGGREGATOR_BROWSER` (a command that receives the URL as its last
argument, for tests and scripted setups), else to the desktop browser, and is always printed to
stderr (SSH sessions open it elsewhere). While serving there is nobody to sign in: an upstream that
needs it fails at once with `SignInRequired`, whose message names the command to run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.abc
import anyio.to_thread

from aggregator.upstream.oauth_tokens import TokenStoreError

if TYPE_CHECKING:  # the SDK's OAuth models load with the first sign-in (upstream/oauth_tokens.py)
    from mcp.shared.auth import AuthorizationCodeResult

__all__ = [
    "CALLBACK_TIMEOUT_SECONDS",
    "BrowserStep",
    "SignInRequired",
    "describe_auth_error",
    "free_port",
    "login_command",
    "port_is_free",
]

CALLBACK_PATH = "/callback"
CALLBACK_TIMEOUT_SECONDS = 300.0  # how long a sign-in waits for the browser to come back


def _not_described(record: logging.LogRecord) -> bool:
    """The SDK logs every failed OAuth flow with a traceback; the ones we report in one line (a needed
    sign-in, the SDK's OAuth errors) reach the user as the upstream's error instead."""
    return not (record.exc_info and record.exc_info[1] and describe_auth_error(record.exc_info[1]) is not None)


class BrowserFailed(Exception):
    """The AGGREGATOR_BROWSER command could not be started."""


class SignInRequired(Exception):
    """The upstream needs a (new) sign-in and nobody can be asked now."""

    def __init__(self, name: str, detail: str = "") -> None:
        self.name = name
        super().__init__(f"sign-in needed{detail}: run `{login_command(name)}`")


logging.getLogger("mcp.client.auth.oauth2").addFilter(_not_described)


def login_command(name: str) -> str:
    return f"aggregator auth login {name}"


def describe_auth_error(exc: BaseException) -> str | None:
    """One line for an exception of a sign-in (ours or the SDK's OAuth errors), else None."""
    if isinstance(exc, SignInRequired):
        return str(exc)
    sdk_auth = sys.modules.get("mcp.client.auth")  # looked up, not imported (it imports httpx2): if it
    if sdk_auth is not None and isinstance(exc, sdk_auth.OAuthFlowError):  # is not loaded, `exc` is not its
        return f"sign-in failed: {exc}"
    if isinstance(exc, TokenStoreError):
        return f"no token store: {exc}"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class BrowserStep:
    """The redirect and callback handlers of one sign-in: open the URL, wait for the redirect.

    `interactive` False (serving): the redirect handler raises `SignInRequired` at once, after
    `refused(url)` has seen the authorization URL it would have opened (its scopes matter).
    `offer` (a sign-in offered to a client while serving, `oauth_offers.py`): receives the URL
    instead of a browser, once the listener is up.
    """

    def __init__(
        self,
        name: str,
        port: int,
        interactive: bool,
        browser: str | None,
        refused: Callable[[str], None] = lambda url: None,
        offer: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.name = name
        self.offer = offer
        self.port = port
        self.interactive = interactive
        self.browser = browser
        self.refused = refused
        self._listener: anyio.abc.SocketListener | None = None
        self._browser: anyio.abc.Process | None = None  # the AGGREGATOR_BROWSER command, while it runs
        self._state: str | None = None  # the `state` of the authorization URL: a refusal must carry it

    @property
    def redirect_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}{CALLBACK_PATH}"

    async def redirect(self, url: str) -> None:
        if not self.interactive:
            self.refused(url)
            raise SignInRequired(self.name)
        self._state = parse_qs(urlsplit(url).query).get("state", [None])[0]
        try:
            listeners = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=self.port)
        except OSError as exc:
            raise SignInRequired(
                self.name, f" (the sign-in port 127.0.0.1:{self.port} is busy: {exc.strerror})"
            ) from None
        listener = listeners.listeners[0]
        assert isinstance(listener, anyio.abc.SocketListener)
        self._listener = listener
        if self.offer is not None:
            await self.offer(url)
            return
        print(f"Sign in to {self.name!r} by opening this URL in a browser:\n{url}", file=sys.stderr, flush=True)
        try:
            self._browser = await open_browser(url, self.browser)
        except BrowserFailed as exc:
            await listener.aclose()
            self._listener = None
            raise SignInRequired(self.name, f" ({exc})") from None

    async def callback(self) -> AuthorizationCodeResult:
        listener = self._listener
        if listener is None:
            raise SignInRequired(self.name)
        try:
            with anyio.fail_after(CALLBACK_TIMEOUT_SECONDS):
                while True:
                    stream = await listener.accept()
                    async with stream:
                        result = await _answer_callback(stream, self._state)
                    if result is not None:
                        return result
        except TimeoutError:
            raise SignInRequired(
                self.name, f" (no answer from the browser within {CALLBACK_TIMEOUT_SECONDS:g}s)"
            ) from None
        finally:
            self._listener = None
            await listener.aclose()
            with anyio.CancelScope(shield=True):
                await _reap(self._browser)


async def _answer_callback(stream: anyio.abc.SocketStream, state: str | None) -> AuthorizationCodeResult | None:
    """Read one HTTP request; the redirect's parameters if it is the callback (else None, 404).

    A refusal (`error=access_denied`: the user said no) ends the sign-in with an `OAuthFlowError`, a
    one-line reason; only with this sign-in's `state`, so a forged refusal cannot cancel it.
    """
    head = b""
    with anyio.move_on_after(10):
        while b"\r\n\r\n" not in head and len(head) < 16384:
            try:
                head += await stream.receive(4096)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                break
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    target = urlsplit(parts[1]) if len(parts) == 3 and parts[0] == "GET" else None
    if target is None or target.path != CALLBACK_PATH:
        await _respond(stream, "404 Not Found", "Not the sign-in callback.")
        return None
    query = {key: values[0] for key, values in parse_qs(target.query).items()}
    if "error" in query and state is not None and query.get("state") != state:
        await _respond(stream, "400 Bad Request", "Not the callback of this sign-in.")
        return None
    if "error" in query:
        await _respond(stream, "400 Bad Request", "Sign-in refused. You can close this tab.")
        reason = f"{query['error']} {query.get('error_description', '')}".strip()[:200]
        from mcp.client.auth import OAuthFlowError

        raise OAuthFlowError(f"the authorization server refused the sign-in: {reason}")
    if "code" not in query:
        await _respond(stream, "400 Bad Request", "No authorization code in this request.")
        return None
    await _respond(stream, "200 OK", "Signed in. You can close this tab.")
    from mcp.shared.auth import AuthorizationCodeResult

    return AuthorizationCodeResult(code=query["code"], state=query.get("state"), iss=query.get("iss"))


async def _respond(stream: anyio.abc.SocketStream, status: str, text: str) -> None:
    body = f"<!doctype html><title>aggregator</title><p>{text}</p>".encode()
    head = f"HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        await stream.send(head.encode() + b"Connection: close\r\n\r\n" + body)


async def open_browser(url: str, command: str | None) -> anyio.abc.Process | None:
    """Hand the URL to `command` (its last argument; not awaited: it may wait for the redirect we
    answer), else to a desktop browser if there is one."""
    if command:
        argv = [*shlex.split(command), url]
        try:  # its stderr is ours; its stdout is not (stdout may carry a command's result)
            return await anyio.open_process(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=None)
        except OSError as exc:
            raise BrowserFailed(f"AGGREGATOR_BROWSER could not run: {exc.strerror or exc}") from None
    if sys.platform in ("darwin", "win32") or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        with contextlib.suppress(Exception):  # no browser: the printed URL is the way
            import webbrowser

            await anyio.to_thread.run_sync(webbrowser.open, url)
    return None


async def _reap(process: anyio.abc.Process | None) -> None:
    if process is None:
        return
    with anyio.move_on_after(5):
        await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()
