"""OAuth for remote upstreams: which upstreams use it, the token store, and the sign-in step.

The protocol itself (RFC 9728 / 8414 discovery, client ID metadata documents, dynamic client
registration, PKCE S256, RFC 8707 `resource`, scope selection and step-up, refresh, the
client-credentials grant) is the SDK's (`aggregator.sdk.oauth.OAuthProvider` and its siblings). What
is ours:

- `TokenStore`: tokens and registered clients of every upstream, one JSON file in the data
  dir, readable by the user alone (0600 in a 0700 directory), keyed by upstream name and bound
  to its URL (a changed URL is a different resource: its old tokens are not sent there).
- The sign-in step: a loopback listener on 127.0.0.1 receives the redirect (the SDK checks
  state and PKCE); the authorization URL goes to `AGGREGATOR_BROWSER` (a command that receives
  the URL as its last argument, for tests and scripted setups), else to the desktop browser,
  and is always printed to stderr (SSH sessions open it elsewhere).
- While serving there is nobody to sign in: an upstream that needs it fails at once with
  `SignInRequired`, whose message names the command to run.

Every token and client secret read or written is registered with the log's secrets mask.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shlex
import socket
import subprocess
import sys
import time
import webbrowser
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.abc
import anyio.to_thread
import httpx2
from mcp.client.auth import OAuthFlowError, OAuthRegistrationError, OAuthTokenError, TokenStorage
from mcp.client.auth.extensions.client_credentials import SignedJWTParameters
from mcp.client.auth.extensions.identity_assertion import IdentityAssertionOAuthProvider
from mcp.client.auth.utils import union_scopes
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from pydantic import AnyUrl, ValidationError

from aggregator.config import UpstreamConfig
from aggregator.files import write_atomically
from aggregator.log import get_logger, register_secrets
from aggregator.sdk.oauth import ClientCredentialsProvider, OAuthProvider, PrivateKeyJWTProvider
from aggregator.settings import Settings

__all__ = [
    "Authenticator",
    "SignInRequired",
    "TokenStore",
    "cli_authenticator",
    "describe_auth_error",
    "login_command",
    "uses_oauth",
]

log = get_logger(__name__)

STORE_NAME = "oauth-tokens.json"
CALLBACK_PATH = "/callback"
CALLBACK_TIMEOUT_SECONDS = 300.0  # how long a sign-in waits for the browser to come back
CLIENT_NAME = "aggregator"


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
    if isinstance(exc, OAuthFlowError | OAuthTokenError | OAuthRegistrationError):
        return f"sign-in failed: {exc}"
    return None


def uses_oauth(config: UpstreamConfig) -> bool:
    """True for a remote upstream that signs in: `auth: oauth`/`client_credentials`, or unset without
    a configured Authorization header (then OAuth starts only if the server answers 401)."""
    if config.transport == "stdio" or config.auth == "none":
        return False
    if config.auth is not None:
        return True
    return not any(key.lower() == "authorization" for key in config.headers)


# ---------------------------------------------------------------- the token store


class TokenStore:
    """`<data dir>/oauth-tokens.json`: {upstream name: {url, tokens, expires_at, client, wanted_scope}}.

    Every read-modify-write holds an exclusive lock on a sibling lock file, so a sign-in and a
    serving process writing at once both keep their change. Without a path (no data dir) the
    entries live in memory, for as long as the process.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._memory: dict[str, dict[str, Any]] = {}

    @classmethod
    def in_data_dir(cls, data_dir: Path) -> TokenStore:
        return cls(data_dir / STORE_NAME)

    def read(self) -> dict[str, dict[str, Any]]:
        if self.path is None:
            return json.loads(json.dumps(self._memory))  # a copy, as a file read would give
        try:
            data = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("token store unreadable; treating every upstream as signed out", error=type(exc).__name__)
            return {}
        if not isinstance(data, dict):
            return {}
        entries = {name: entry for name, entry in data.items() if isinstance(entry, dict)}
        register_secrets(_secrets_of(entries.values()))
        return entries

    def entry(self, name: str, url: str | None) -> dict[str, Any]:
        """The entry of `name` if it was made for `url` (a changed URL starts afresh), else {}."""
        entry = self.read().get(name, {})
        return entry if entry.get("url") == url else {}

    def update(self, name: str, url: str | None, **fields: Any) -> None:
        """Set `fields` in the entry of `name` (None removes a field); a different URL starts a new entry."""
        register_secrets(_secrets_of([fields]))
        with self._locked():
            entries = self.read()
            entry = entries.get(name, {})
            if entry.get("url") != url:
                entry = {"url": url}
            for key, value in fields.items():
                if value is None:
                    entry.pop(key, None)
                else:
                    entry[key] = value
            entries[name] = entry
            self._write(entries)

    def remove(self, name: str) -> bool:
        """Forget everything about `name`; True if there was something."""
        with self._locked():
            entries = self.read()
            if entries.pop(name, None) is None:
                return False
            self._write(entries)
            return True

    def _write(self, entries: dict[str, dict[str, Any]]) -> None:
        if self.path is None:
            self._memory = entries
            return
        payload = json.dumps(entries, indent=1, sort_keys=True).encode()
        write_atomically(self.path, payload)  # mkstemp: created 0600
        os.chmod(self.path, 0o600)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self.path is None:
            yield
            return
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _secrets_of(entries: Any) -> list[str]:
    found: list[Any] = []
    for entry in entries:
        tokens = entry.get("tokens") or {}
        client = entry.get("client") or {}
        found += [tokens.get("access_token"), tokens.get("refresh_token"), client.get("client_secret")]
    return [value for value in found if isinstance(value, str) and value]


class StoredTokens(TokenStorage):
    """The SDK's `TokenStorage` over one upstream's entry of the `TokenStore`.

    `expires_in` is stored as an absolute `expires_at` and handed back as the seconds left, so a
    token loaded later keeps its expiry. A configured client (client_id) is never written.
    """

    def __init__(
        self, store: TokenStore, name: str, url: str | None, client: OAuthClientInformationFull | None
    ) -> None:
        self._store = store
        self._name = name
        self._url = url
        self._client = client

    async def get_tokens(self) -> OAuthToken | None:
        entry = self._store.entry(self._name, self._url)
        try:
            tokens = OAuthToken.model_validate(entry["tokens"]) if "tokens" in entry else None
        except ValidationError:
            return None
        if tokens is not None and isinstance(expires_at := entry.get("expires_at"), int | float):
            tokens.expires_in = int(expires_at - time.time())
        return tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        expires_at = time.time() + int(tokens.expires_in) if tokens.expires_in is not None else None
        self._store.update(
            self._name, self._url, tokens=tokens.model_dump(mode="json", exclude_none=True), expires_at=expires_at
        )

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        if self._client is not None:
            return self._client
        entry = self._store.entry(self._name, self._url)
        try:
            return OAuthClientInformationFull.model_validate(entry["client"]) if "client" in entry else None
        except ValidationError:
            return None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        if self._client is None:
            self._store.update(self._name, self._url, client=client_info.model_dump(mode="json", exclude_none=True))


# ---------------------------------------------------------------- the sign-in step


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
    """

    def __init__(
        self,
        name: str,
        port: int,
        interactive: bool,
        browser: str | None,
        refused: Callable[[str], None] = lambda url: None,
    ) -> None:
        self.name = name
        self.port = port
        self.interactive = interactive
        self.browser = browser
        self.refused = refused
        self._listener: anyio.abc.SocketListener | None = None
        self._browser: anyio.abc.Process | None = None  # the AGGREGATOR_BROWSER command, while it runs

    @property
    def redirect_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}{CALLBACK_PATH}"

    async def redirect(self, url: str) -> None:
        if not self.interactive:
            self.refused(url)
            raise SignInRequired(self.name)
        try:
            listeners = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=self.port)
        except OSError as exc:
            raise SignInRequired(
                self.name, f" (the sign-in port 127.0.0.1:{self.port} is busy: {exc.strerror})"
            ) from None
        listener = listeners.listeners[0]
        assert isinstance(listener, anyio.abc.SocketListener)
        self._listener = listener
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
                        result = await _answer_callback(stream)
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


async def _answer_callback(stream: anyio.abc.SocketStream) -> AuthorizationCodeResult | None:
    """Read one HTTP request; the redirect's parameters if it is the callback (else None, 404)."""
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
    if "error" in query:
        await _respond(stream, "400 Bad Request", "Sign-in refused. You can close this tab.")
        description = query.get("error_description", "")
        raise PermissionError(f"the authorization server refused the sign-in: {query['error']} {description}".strip())
    if "code" not in query:
        await _respond(stream, "400 Bad Request", "No authorization code in this request.")
        return None
    await _respond(stream, "200 OK", "Signed in. You can close this tab.")
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


# ---------------------------------------------------------------- providers


@dataclass
class Authenticator:
    """Builds each remote upstream's `httpx2.Auth` over one token store.

    `interactive`: a sign-in may open a browser (the `auth login` command, and one-shot CLI
    commands when `AGGREGATOR_BROWSER` is set); otherwise one that is needed fails at once.
    """

    store: TokenStore = field(default_factory=lambda: TokenStore(None))
    interactive: bool = False
    browser: str | None = None

    def auth_for(self, config: UpstreamConfig) -> httpx2.Auth | None:
        if not uses_oauth(config):
            return None
        assert config.url is not None
        storage = StoredTokens(self.store, config.name, config.url, _configured_client(config))
        wanted = self.store.entry(config.name, config.url).get("wanted_scope")
        scope = union_scopes(" ".join(config.scopes) or None, wanted if isinstance(wanted, str) else None)
        provider: OAuthProvider | ClientCredentialsProvider | PrivateKeyJWTProvider
        if config.auth == "identity_assertion":
            return _identity_assertion(config, storage, scope)
        if config.auth == "client_credentials":
            provider = _client_credentials(config, storage, scope)
        else:
            step = BrowserStep(
                config.name,
                self._redirect_port(config),
                self.interactive,
                self.browser,
                refused=lambda url: self._remember_scope(config, url),
            )
            provider = OAuthProvider(
                server_url=config.url,
                client_metadata=OAuthClientMetadata(
                    client_name=CLIENT_NAME,
                    redirect_uris=[AnyUrl(step.redirect_uri)],
                    grant_types=["authorization_code", "refresh_token"],
                    response_types=["code"],
                ),
                storage=storage,
                redirect_handler=step.redirect,
                callback_handler=step.callback,
                client_metadata_url=config.client_metadata_url,
            )
        provider.extra_scope = scope
        return provider

    def _remember_scope(self, config: UpstreamConfig, url: str) -> None:
        """Keep the scopes of a sign-in that could not happen (e.g. a step-up while serving), so that
        `auth login` asks for them."""
        scope = parse_qs(urlsplit(url).query).get("scope")
        if scope:
            wanted = self.store.entry(config.name, config.url).get("wanted_scope")
            before = wanted if isinstance(wanted, str) else None
            self.store.update(config.name, config.url, wanted_scope=union_scopes(before, scope[0]))

    def _redirect_port(self, config: UpstreamConfig) -> int:
        """The port the registered client's redirect URI names, so one registration serves every sign-in;
        a free one when there is no registration yet (or, signing in, its port is taken: then the
        registration is dropped and made anew)."""
        entry = self.store.entry(config.name, config.url)
        uris = (entry.get("client") or {}).get("redirect_uris") or [""]
        port = urlsplit(str(uris[0])).port
        if port is not None and (not self.interactive or port_is_free(port)):
            return port
        if port is not None and config.client_id is None:
            self.store.update(config.name, config.url, client=None)
        return free_port()


def cli_authenticator(data_dir: Path, settings: Settings) -> Authenticator:
    """One-shot commands (call, tools, list-upstreams) sign in on their own only when
    `AGGREGATOR_BROWSER` says how; otherwise a needed sign-in fails at once, naming the command."""
    return Authenticator(TokenStore.in_data_dir(data_dir), interactive=bool(settings.browser), browser=settings.browser)


TOKEN_EXCHANGE_GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
ID_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:id_token"
ID_JAG_TYPE = "urn:ietf:params:oauth:token-type:id-jag"


def _identity_assertion(config: UpstreamConfig, storage: StoredTokens, scope: str | None) -> httpx2.Auth:
    """SEP-990 enterprise-managed sign-in: the IdP's ID token is exchanged (RFC 8693) at the IdP for an
    ID-JAG, which the SDK presents to the MCP authorization server (RFC 7523 jwt-bearer grant)."""
    assert config.url is not None
    needed = {"client_id": config.client_id, "client_secret": config.client_secret, "issuer": config.issuer}
    needed |= {"idp_token_endpoint": config.idp_token_endpoint, "idp_id_token": config.idp_id_token}
    missing = [key for key, value in needed.items() if not value]
    if missing:
        raise SignInRequired(config.name, f" (auth: identity_assertion needs {', '.join(missing)})")
    assert config.client_id and config.client_secret and config.issuer

    async def id_jag(audience: str, resource: str) -> str:
        form = {
            "grant_type": TOKEN_EXCHANGE_GRANT,
            "subject_token": config.idp_id_token or "",
            "subject_token_type": ID_TOKEN_TYPE,
            "requested_token_type": ID_JAG_TYPE,
            "audience": audience,
            "resource": resource,
        }
        form |= {"client_id": config.idp_client_id} if config.idp_client_id else {}
        form |= {"scope": scope} if scope else {}
        async with httpx2.AsyncClient(timeout=config.timeouts.connect) as client:
            response = await client.post(config.idp_token_endpoint or "", data=form)
        if response.status_code != 200:
            raise OAuthTokenError(f"the identity provider refused the token exchange ({response.status_code})")
        token = response.json().get("access_token")
        if not isinstance(token, str):
            raise OAuthTokenError("the identity provider's token exchange answer has no access_token")
        register_secrets([token])
        return token

    return IdentityAssertionOAuthProvider(
        config.url,
        storage,
        config.client_id,
        config.client_secret,
        config.issuer,
        id_jag,
        scope=scope,
        token_endpoint_auth_method="client_secret_basic",
    )


def _configured_client(config: UpstreamConfig) -> OAuthClientInformationFull | None:
    if config.client_id is None or config.auth in ("client_credentials", "identity_assertion"):
        return None
    secret = config.client_secret
    return OAuthClientInformationFull(
        client_id=config.client_id,
        client_secret=secret,
        redirect_uris=None,
        token_endpoint_auth_method="client_secret_basic" if secret else "none",
    )


def _client_credentials(
    config: UpstreamConfig, storage: StoredTokens, scope: str | None
) -> ClientCredentialsProvider | PrivateKeyJWTProvider:
    assert config.url is not None
    if config.client_id is None:
        raise SignInRequired(config.name, " (auth: client_credentials needs client_id)")
    if config.client_private_key is not None:
        jwt = SignedJWTParameters(
            issuer=config.client_id,
            subject=config.client_id,
            signing_key=config.client_private_key,
            signing_algorithm=config.client_signing_algorithm,
        )
        return PrivateKeyJWTProvider(
            config.url, storage, config.client_id, jwt.create_assertion_provider(), scope=scope, issuer=config.issuer
        )
    if config.client_secret is None:
        raise SignInRequired(config.name, " (auth: client_credentials needs client_secret or client_private_key)")
    return ClientCredentialsProvider(
        config.url, storage, config.client_id, config.client_secret, scope=scope, issuer=config.issuer
    )
