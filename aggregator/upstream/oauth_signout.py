"""`UntilSignedOut`: an upstream's OAuth provider that follows `auth logout` at once.

Apart from `oauth_providers.py` because it is an `httpx2.Auth`: importing it imports httpx2, which a
`serve` with no remote upstream never loads (issue 24, memory).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable

import httpx2

from aggregator.upstream.oauth_tokens import StoredTokens

__all__ = ["UntilSignedOut"]


class UntilSignedOut(httpx2.Auth):
    """An upstream's OAuth provider that is replaced by a new one once `auth logout` (here or in another
    process) removed the tokens it holds: the SDK's provider keeps its tokens in memory until they expire,
    while the new one reads the store, finds none, and needs a sign-in on the very next request. Checking
    costs one `stat` of the store's stamp per request (`StoredTokens.signed_out`)."""

    requires_response_body = True  # as the SDK's providers: their flow reads error bodies

    def __init__(self, build: Callable[[], tuple[httpx2.Auth, StoredTokens]]) -> None:
        self._build = build
        self._provider, self._storage = build()

    @property
    def provider(self) -> httpx2.Auth:
        """The SDK provider in use now."""
        return self._provider

    async def async_auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        if self._storage.signed_out():
            self._provider, self._storage = self._build()
        flow = self._provider.async_auth_flow(request)
        try:
            outgoing = await flow.__anext__()
            while True:
                response = yield outgoing
                outgoing = await flow.asend(response)
        except StopAsyncIteration:
            return
        finally:
            await flow.aclose()
