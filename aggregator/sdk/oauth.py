"""The SDK's OAuth providers, with three of their private steps extended (part of the SDK adapter,
`aggregator.sdk`; each extension is exercised by `tests/test_sdk_adapter.py`).

`_initialize`, `_auth_flow` and `_perform_authorization` of `mcp.client.auth.OAuthClientProvider`:
a token loaded from storage keeps its expiry (the SDK forgets it, so a stored token would never be
refreshed before the server refuses it), a token close to expiry and a token the server answers 401
to are refreshed before a new sign-in is asked for (a 401 first looks for tokens another sign-in
stored meanwhile), and configured scopes join the scopes the server asks for. A module of its own
because subclassing needs the SDK at import, and `aggregator.sdk` imports none (its start-up rule);
only HTTP upstreams with `auth:` import this.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator

import httpx2
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider, PrivateKeyJWTOAuthProvider
from mcp.client.auth.utils import union_scopes

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
            adopted = False
            try:
                outgoing = await flow.__anext__()
                while True:
                    response = yield outgoing
                    if may_refresh and outgoing is request and response.status_code == 401:
                        adopted = await self._adopt_stored_tokens()
                        if adopted or self.context.can_refresh_token():
                            break  # refused: try the tokens stored meanwhile, else refresh; then ask again
                    outgoing = await flow.asend(response)
            except StopAsyncIteration:
                return
            finally:
                await flow.aclose()
            may_refresh = False
            if not adopted:
                self._expire_soon()

    async def _adopt_stored_tokens(self) -> bool:
        """Take the tokens (and client) in storage if they are not the ones held: a sign-in elsewhere
        (`auth login`, or one offered to a client while serving) stored them after this provider loaded."""
        stored = await self.context.storage.get_tokens()
        held = self.context.current_tokens
        if stored is None or (held is not None and stored.access_token == held.access_token):
            return False
        self.context.current_tokens = stored
        self.context.client_info = await self.context.storage.get_client_info() or self.context.client_info
        if stored.expires_in is not None:
            self.context.update_token_expiry(stored)
        return True


class OAuthProvider(_TokenLifetime, OAuthClientProvider):
    """The authorization-code flow (PKCE, discovery, registration, step-up) of the SDK."""


class ClientCredentialsProvider(_TokenLifetime, ClientCredentialsOAuthProvider):
    """The client-credentials grant with a client secret."""


class PrivateKeyJWTProvider(_TokenLifetime, PrivateKeyJWTOAuthProvider):
    """The client-credentials grant authenticated with a signed JWT (private_key_jwt)."""
