"""Every use of the mcp SDK's private internals, in one place, each with the reason.

The SDK's public API validates results against the protocol models and has no handle for a few
things a transparent proxy needs. What it lacks is reached here and nowhere else, so an SDK
upgrade that moves one of these breaks one module, and `tests/test_sdk_adapter.py` fails loudly
naming which internal changed (each function below has a test that exercises it for real).

- `raw_request` / `raw_notify`: send any method with no result validation (one malformed tool
  must not fail a whole `tools/list`, and a proxied `tools/call` result passes through untouched;
  `ClientSession.send_notification` takes typed notifications only, and a proxy forwards any).
- `client_connection` / `request_sender`: the downstream connection a request arrived on and the
  stream to ask that client on, so an upstream's sampling/elicitation/roots request reaches the
  client whose call caused it (the public `ServerRequestContext` exposes neither).
- `without_tracing`: the low-level server wraps every request in an OpenTelemetry span; with no
  tracer configured that is pure per-call cost, and the middleware class is private.
- `OAuthProvider` / `ClientCredentialsProvider` / `PrivateKeyJWTProvider`: the SDK's OAuth providers
  with three of their private steps extended (`_initialize`, `_auth_flow`, `_perform_authorization`):
  a token loaded from storage keeps its expiry (the SDK forgets it, so a stored token would never
  be refreshed before the server refuses it), a token close to expiry and a token the server
  answers 401 to are refreshed before a new sign-in is asked for, and configured scopes join the
  scopes the server asks for.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any

import httpx2
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider, PrivateKeyJWTOAuthProvider
from mcp.client.auth.utils import union_scopes
from mcp.client.session import ClientSession
from mcp.server._otel import OpenTelemetryMiddleware

# The SDK's HTTP client defaults (private `mcp.shared._httpx_utils`), restated rather than imported:
# a general operation's timeout and an SSE stream's read timeout, in seconds.
HTTP_TIMEOUT_SECONDS = 30.0
SSE_READ_TIMEOUT_SECONDS = 300.0

ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]
RawSender = Callable[[str, dict[str, Any] | None, dict[str, Any]], Awaitable[dict[str, Any]]]


async def raw_request(
    session: ClientSession,
    method: str,
    params: dict[str, Any] | None,
    progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """Send a request and return the raw result dict, with no result validation.

    The dispatcher's raw request skips the session's validation; the session's stamp still adds
    what the negotiated protocol era needs (`_meta` envelope, protocol version).
    """
    data: dict[str, Any] = {"method": method}
    if params is not None:
        data["params"] = params
    opts: dict[str, Any] = {}
    session._stamp(data, opts)  # type: ignore[arg-type]
    if progress is not None:
        opts["on_progress"] = progress
    result = await session._dispatcher.send_raw_request(method, data.get("params"), opts)  # type: ignore[arg-type]
    return dict(result)


async def raw_notify(session: ClientSession, method: str, params: dict[str, Any] | None) -> None:
    """Send any notification, typed or not (the public `send_notification` takes typed ones only)."""
    await session._dispatcher.notify(method, params)


def client_connection(server_session: Any) -> Any:
    """The downstream connection a server-side session belongs to (one per client), or None."""
    return getattr(server_session, "_connection", None)


def request_sender(server_session: Any) -> RawSender:
    """Send a request to the client on the stream of the request this session is handling."""
    return server_session._request_outbound.send_raw_request  # type: ignore[no-any-return]


def without_tracing(middleware: Sequence[Any]) -> list[Any]:
    """The server middleware less the SDK's per-request OpenTelemetry span."""
    return [m for m in middleware if not isinstance(m, OpenTelemetryMiddleware)]


REFRESH_MARGIN_SECONDS = 60.0  # a token this close to its expiry is refreshed before it is used ...
REFRESH_MARGIN_SHARE = 0.5  # ... or, for a short-lived one, when this share of its lifetime is left


class _TokenLifetime(OAuthClientProvider):
    """Expiry kept across restarts, refresh before expiry and on 401, configured scopes added.

    The storage's `get_tokens` returns `expires_in` as the seconds left (or None), so the expiry
    survives a restart. `extra_scope` is joined to whatever scope the SDK selects.
    """

    extra_scope: str | None = None

    async def _initialize(self) -> None:
        await super()._initialize()
        tokens = self.context.current_tokens
        if tokens is not None and tokens.expires_in is not None:
            self.context.update_token_expiry(tokens)

    async def _perform_authorization(self) -> httpx2.Request:
        self.context.client_metadata.scope = union_scopes(self.context.client_metadata.scope, self.extra_scope)
        return await super()._perform_authorization()

    def _expire_soon(self) -> None:
        """Mark the held token expired, so the next flow refreshes it (when it can) first."""
        self.context.token_expiry_time = 1.0

    async def _auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        tokens, expiry = self.context.current_tokens, self.context.token_expiry_time
        if tokens is not None and tokens.expires_in is not None and expiry is not None:
            margin = min(REFRESH_MARGIN_SECONDS, REFRESH_MARGIN_SHARE * tokens.expires_in)
            if expiry - time.time() < margin:
                self._expire_soon()
        may_refresh = True
        while True:
            flow = super()._auth_flow(request)
            try:
                outgoing = await flow.__anext__()
                while True:
                    response = yield outgoing
                    if (
                        may_refresh
                        and outgoing is request
                        and response.status_code == 401
                        and self.context.can_refresh_token()
                    ):
                        break  # the server refused a token we can refresh: refresh, then ask again
                    outgoing = await flow.asend(response)
            except StopAsyncIteration:
                return
            finally:
                await flow.aclose()
            may_refresh = False
            self._expire_soon()


class OAuthProvider(_TokenLifetime, OAuthClientProvider):
    """The authorization-code flow (PKCE, discovery, registration, step-up) of the SDK."""


class ClientCredentialsProvider(_TokenLifetime, ClientCredentialsOAuthProvider):
    """The client-credentials grant with a client secret."""


class PrivateKeyJWTProvider(_TokenLifetime, PrivateKeyJWTOAuthProvider):
    """The client-credentials grant authenticated with a signed JWT (private_key_jwt)."""
