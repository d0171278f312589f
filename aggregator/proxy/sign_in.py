"""A call that needs an upstream's OAuth sign-in: the link for a client that can open one.

A client that declared `elicitation.url` (MCP 2025-11-25) gets the JSON-RPC error -32042
(`UrlElicitationRequiredError`) carrying the authorization URL; once the user has signed in,
`notifications/elicitation/complete` with the same `elicitationId` goes to that client alone, on
its own connection, and the client retries. Every other client (no such capability, a 2026-07-28
client, a client other than the one a sign-in under way was offered to) gets the fault that names
`aggregator auth login NAME`. The sign-in itself is `upstream/oauth_offers.py`.
"""

from __future__ import annotations

from typing import Any

import mcp.types as types
from mcp.server.connection import Connection
from mcp.shared.exceptions import UrlElicitationRequiredError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from aggregator.faults import Fault, SignInNeeded
from aggregator.log import get_logger
from aggregator.proxy.relay import origin_client
from aggregator.upstream.oauth_offers import Offer
from aggregator.upstream.pool import UpstreamPool

__all__ = ["RETRY", "offer_sign_in", "sign_in_link"]

log = get_logger(__name__)

RETRY = object()
"""`offer_sign_in`'s answer when the stored tokens serve after all: run the call again."""

COMPLETE = "notifications/elicitation/complete"


def opens_links(connection: Any) -> bool:
    """A handshake-era client that declared URL-mode elicitation (it can be told of the completion later)."""
    if not isinstance(connection, Connection) or connection.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return False
    caps = connection.client_capabilities
    return caps is not None and caps.elicitation is not None and caps.elicitation.url is not None


async def offer_sign_in(pool: UpstreamPool, fault: SignInNeeded, origin: Any) -> Any:
    """Raise -32042 with the sign-in link for the client of `origin`, or the `Fault` to answer it with;
    `RETRY` if no sign-in is needed after all. Waits for the authorization URL, never for the user."""
    offer = await _offer(pool, fault, origin)
    if offer is None:
        raise fault
    if isinstance(offer, str):
        raise Fault("upstream_unavailable", f"{fault.message} ({offer})")
    if offer.url is None:
        return RETRY
    link = types.ElicitRequestURLParams(
        message=f"Sign in to {fault.upstream!r} to use its tools; then retry.",
        url=offer.url,
        elicitation_id=offer.elicitation_id,
    )
    raise UrlElicitationRequiredError([link], f"sign-in to upstream {fault.upstream!r} needed: open the link")


async def sign_in_link(pool: UpstreamPool, fault: SignInNeeded, origin: Any) -> dict[str, str] | str | None:
    """The sign-in link offered to the client of `origin` alone, for an answer that must not fail as a
    whole because of one upstream (`catalog_search_tools` with `load: true` lists it beside that
    upstream): `{url, elicitation_id}`; the completion reaches that client as for -32042. A sentence
    when no link can be offered to it now (another client's sign-in is under way); None when the
    client does not open links or the stored tokens serve after all: the fault's message stands."""
    offer = await _offer(pool, fault, origin)
    if offer is None or isinstance(offer, str):
        return offer
    return None if offer.url is None else {"url": offer.url, "elicitation_id": offer.elicitation_id}


async def _offer(pool: UpstreamPool, fault: SignInNeeded, origin: Any) -> Offer | str | None:
    """The sign-in offered to the client of `origin` (`SignInOffers.offer`); None if it cannot open links."""
    connection = origin_client(origin)
    config = pool.connection(fault.upstream).config
    if not opens_links(connection) or config.auth not in (None, "oauth"):  # only a browser sign-in has a link
        return None
    assert isinstance(connection, Connection)

    async def done(elicitation_id: str) -> None:
        try:
            await connection.notify(COMPLETE, {"elicitationId": elicitation_id})
        except Exception as exc:  # the client went away meanwhile: the sign-in still stands
            log.debug("elicitation completion not delivered", upstream=fault.upstream, error=str(exc)[:200])

    return await pool.sign_ins.offer(config, connection, done)
