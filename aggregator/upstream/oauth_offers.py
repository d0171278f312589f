"""Sign-in offered to a client while serving (URL-mode elicitation, MCP 2025-11-25).

While serving nobody can be sent to a browser, but a client that declared `elicitation.url` can
show the user a link. `SignInOffers.offer` starts the sign-in the way `auth login` does (the same
provider and loopback listener on 127.0.0.1, state and PKCE checked by the SDK), stops as soon as
the authorization URL is known and returns it; the proxy answers the client's call with it
(error -32042). The rest runs in a task of its own: when the browser comes back, the SDK exchanges
the code and the token store keeps the tokens, `on_signed_in` starts the upstream, and `done`
tells that one client (`notifications/elicitation/complete`).

One sign-in per upstream at a time, owned by the client it was offered to: that client asking
again gets the same link; another client gets no link (it would see someone else's sign-in) but
the sign-in-needed message, and the next link once this one ends. A sign-in nobody finishes ends
after `timeout` seconds, or when its client goes away: the listener closes, its port is free, one
line is logged, and the next need offers a new link.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from mcp import ClientSession

from aggregator.config import UpstreamConfig
from aggregator.log import get_logger
from aggregator.upstream.oauth_providers import Authenticator
from aggregator.upstream.oauth_signin import CALLBACK_TIMEOUT_SECONDS, describe_auth_error
from aggregator.upstream.start_errors import leaf_exceptions
from aggregator.upstream.transports import StderrTail, open_transport

__all__ = ["Offer", "SignInOffers"]

log = get_logger(__name__)

Done = Callable[[str], Awaitable[None]]  # told the elicitation id once the sign-in is complete


@dataclass(eq=False)
class Offer:
    """One sign-in under way: the link offered to `client`, until it completes or ends."""

    upstream: str
    client: Any
    elicitation_id: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    url: str | None = None  # the authorization URL, once known
    known: anyio.Event = field(default_factory=anyio.Event)  # the URL is known, or the sign-in ended
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    signed_in: bool = False
    gone: bool = False  # its client went away
    error: str | None = None


class SignInOffers:
    """The sign-ins offered while serving, one per upstream at most, each in a task of `task_group`."""

    def __init__(
        self,
        authenticator: Authenticator,
        task_group: anyio.abc.TaskGroup,
        on_signed_in: Callable[[str], Awaitable[Any]],
        timeout: float = CALLBACK_TIMEOUT_SECONDS,
    ) -> None:
        self._authenticator = authenticator
        self._tg = task_group
        self._on_signed_in = on_signed_in
        self.timeout = timeout
        self._offers: dict[str, Offer] = {}

    def pending(self, upstream: str) -> Offer | None:
        return self._offers.get(upstream)

    async def offer(self, config: UpstreamConfig, client: Any, done: Done) -> Offer | str:
        """The sign-in link for `client` (an `Offer` with its URL), or why there is none (a sentence).

        An `Offer` without a URL means no sign-in was needed after all (the stored tokens served):
        the caller may simply retry.
        """
        offer = self._offers.get(config.name)
        if offer is not None and offer.client is not client:
            return "a sign-in to it is under way in another client; retry once it is done"
        if offer is None:
            offer = self._offers[config.name] = Offer(config.name, client)
            self._tg.start_soon(self._sign_in, offer, config, done, name=f"sign-in-{config.name}")
        with anyio.move_on_after(config.timeouts.connect):
            await offer.known.wait()
        if offer.url is None and not offer.signed_in:
            return offer.error or f"the sign-in did not start within {config.timeouts.connect:g}s"
        return offer

    def client_gone(self, client: Any) -> None:
        """End the sign-ins offered to a client that went away (nobody is left to be told)."""
        for offer in list(self._offers.values()):
            if offer.client is client:
                offer.gone = True
                offer.scope.cancel()

    async def _sign_in(self, offer: Offer, config: UpstreamConfig, done: Done) -> None:
        """Discovery and registration within the connect timeout; then `timeout` for the browser to come back."""

        async def publish(url: str) -> None:
            offer.url = url
            offer.scope.deadline = anyio.current_time() + self.timeout
            offer.known.set()

        before = self._tokens(config)
        offer.scope.deadline = anyio.current_time() + config.timeouts.connect
        try:
            with offer.scope:
                await self._handshake(config, self._authenticator.auth_for(config, offer=publish))
                offer.signed_in = True
            if offer.scope.cancelled_caught:
                waited = f"no answer from the browser within {self.timeout:g}s" if offer.url else "no authorization URL"
                offer.error = "its client went away" if offer.gone else waited
        except Exception as exc:
            leaves = list(leaf_exceptions(exc)) or [exc]
            offer.error = describe_auth_error(leaves[0]) or f"{type(leaves[0]).__name__}: {leaves[0]}"[:300]
            # the tokens came and only the handshake after them failed: signed in all the same
            offer.signed_in = offer.url is not None and self._tokens(config) not in (None, before)
        finally:
            if self._offers.get(offer.upstream) is offer:
                del self._offers[offer.upstream]
            offer.known.set()
        if not offer.signed_in:
            log.info("sign-in offered to a client ended unfinished", upstream=offer.upstream, reason=offer.error)
            return
        if offer.url is None:
            return  # the stored tokens served: nobody was asked, nobody is told
        log.info("signed in through the client", upstream=offer.upstream)
        try:
            await self._on_signed_in(offer.upstream)
        except Exception as exc:  # a task of the pool must never fail: the start's error is in its status
            log.warning("upstream did not start after its sign-in", upstream=offer.upstream, error=type(exc).__name__)
        await done(offer.elicitation_id)

    def _tokens(self, config: UpstreamConfig) -> Any:
        """The upstream's stored tokens (to tell whether a sign-in stored new ones); None if unreadable."""
        try:
            return self._authenticator.store.entry(config.name, config.url).get("tokens")
        except Exception:  # e.g. the chosen keyring is unusable: the sign-in itself will say so
            return None

    @staticmethod
    async def _handshake(config: UpstreamConfig, auth: Any) -> None:
        """Open the upstream with `auth` and shake hands: the OAuth flow runs on its first 401."""
        async with AsyncExitStack() as stack:
            handle = await stack.enter_async_context(open_transport(config, StderrTail(config.name), auth))
            session = await stack.enter_async_context(ClientSession(handle.read, handle.write))
            await session.initialize()
