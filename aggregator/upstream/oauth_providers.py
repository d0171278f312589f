"""OAuth for remote upstreams: which upstreams use it, and the `httpx2.Auth` each one gets.

The protocol itself (RFC 9728 / 8414 discovery, client ID metadata documents, dynamic client
registration, PKCE S256, RFC 8707 `resource`, scope selection and step-up, refresh, the
client-credentials grant) is the SDK's (`aggregator.sdk.oauth.OAuthProvider` and its siblings). What
is ours:

- `Authenticator`: the provider each upstream's `auth` asks for (browser sign-in, client
  credentials, private-key JWT, identity assertion), over one token store.
- The token store is `oauth_tokens.py`; the sign-in step and `SignInRequired`, `oauth_signin.py`.
"""

from __future__ import annotations

import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from mcp.shared.exceptions import MCPDeprecationWarning
from pydantic import AnyUrl

from aggregator.config import UpstreamConfig
from aggregator.log import register_secrets
from aggregator.settings import Settings
from aggregator.upstream.oauth_signin import BrowserStep, SignInRequired, free_port, port_is_free
from aggregator.upstream.oauth_tokens import StoredTokens, TokenStore

if TYPE_CHECKING:  # the providers load when an upstream signs in: their client-credentials module
    # imports PyJWT and with it `cryptography` (about 8 MB RSS a `serve` of stdio upstreams never uses);
    # httpx2 and the SDK's `mcp.client.auth` (which imports it) load with the first remote upstream too
    import httpx2
    from mcp.shared.auth import OAuthClientInformationFull

    from aggregator.sdk.oauth import ClientCredentialsProvider, OAuthProvider, PrivateKeyJWTProvider

__all__ = [
    "Authenticator",
    "cli_authenticator",
    "uses_oauth",
]

CLIENT_NAME = "aggregator"


def uses_oauth(config: UpstreamConfig) -> bool:
    """True for a remote upstream that signs in: `auth: oauth`/`client_credentials`, or unset without
    a configured Authorization header (then OAuth starts only if the server answers 401)."""
    if config.transport == "stdio" or config.auth == "none":
        return False
    if config.auth is not None:
        return True
    return not any(key.lower() == "authorization" for key in config.headers)


@dataclass
class Authenticator:
    """Builds each remote upstream's `httpx2.Auth` over one token store.

    `interactive`: a sign-in may open a browser (the `auth login` command, and one-shot CLI
    commands when `AGGREGATOR_BROWSER` is set); otherwise one that is needed fails at once.
    """

    store: TokenStore = field(default_factory=lambda: TokenStore(None))
    interactive: bool = False
    browser: str | None = None

    def auth_for(
        self, config: UpstreamConfig, offer: Callable[[str], Awaitable[None]] | None = None
    ) -> httpx2.Auth | None:
        """The upstream's provider; `offer`: a sign-in offered while serving, which hands the
        authorization URL to `offer` instead of a browser (`BrowserStep.offer`). It stops sending
        the tokens it holds as soon as `auth logout` removes them (`UntilSignedOut`)."""
        if not uses_oauth(config):
            return None
        from aggregator.upstream.oauth_signout import UntilSignedOut  # imports httpx2: remote upstreams only

        return UntilSignedOut(lambda: self._provider(config, offer))

    def _provider(
        self, config: UpstreamConfig, offer: Callable[[str], Awaitable[None]] | None
    ) -> tuple[httpx2.Auth, StoredTokens]:
        """A new provider of the upstream, which reads its tokens from the store, and its storage."""
        from mcp.client.auth.utils import union_scopes

        from aggregator.sdk.oauth import OAuthProvider

        assert config.url is not None
        storage = StoredTokens(self.store, config.name, config.url, _configured_client(config))
        wanted = self.store.entry(config.name, config.url).get("wanted_scope")
        scope = union_scopes(" ".join(config.scopes) or None, wanted if isinstance(wanted, str) else None)
        provider: OAuthProvider | ClientCredentialsProvider | PrivateKeyJWTProvider
        if config.auth == "identity_assertion":
            return _identity_assertion(config, storage, scope), storage
        if config.auth == "client_credentials":
            with warnings.catch_warnings():  # the SDK's warning when `issuer` is unset is a raw Python warning
                warnings.simplefilter("ignore", MCPDeprecationWarning)  # on stderr: `doctor` says it instead
                provider = _client_credentials(config, storage, scope)
        else:
            from mcp.shared.auth import OAuthClientMetadata  # here: the SDK's OAuth models (oauth_tokens.py)

            interactive = self.interactive or offer is not None
            step = BrowserStep(
                config.name,
                self._redirect_port(config, interactive),
                interactive,
                self.browser,
                refused=lambda url: self._remember_scope(config, url),
                offer=offer,
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
        return provider, storage

    def _remember_scope(self, config: UpstreamConfig, url: str) -> None:
        """Keep the scopes of a sign-in that could not happen (e.g. a step-up while serving), so that
        `auth login` asks for them."""
        from mcp.client.auth.utils import union_scopes

        scope = parse_qs(urlsplit(url).query).get("scope")
        if scope:
            wanted = self.store.entry(config.name, config.url).get("wanted_scope")
            before = wanted if isinstance(wanted, str) else None
            self.store.update(config.name, config.url, wanted_scope=union_scopes(before, scope[0]))

    def _redirect_port(self, config: UpstreamConfig, interactive: bool) -> int:
        """The port the registered client's redirect URI names, so one registration serves every sign-in;
        a free one when there is no registration yet (or, signing in, its port is taken: then the
        registration is dropped and made anew)."""
        entry = self.store.entry(config.name, config.url)
        uris = (entry.get("client") or {}).get("redirect_uris") or [""]
        port = urlsplit(str(uris[0])).port
        if port is not None and (not interactive or port_is_free(port)):
            return port
        if port is not None and config.client_id is None:
            self.store.update(config.name, config.url, client=None)
        return free_port()


def cli_authenticator(data_dir: Path, settings: Settings) -> Authenticator:
    """One-shot commands (call, tools, describe, list-upstreams, search, refresh) sign in on their own only when
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

    import httpx2
    from mcp.client.auth import OAuthTokenError

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

    from mcp.client.auth.extensions.identity_assertion import IdentityAssertionOAuthProvider

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
    from mcp.shared.auth import OAuthClientInformationFull

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
    from mcp.client.auth.extensions.client_credentials import SignedJWTParameters

    from aggregator.sdk.oauth import ClientCredentialsProvider, PrivateKeyJWTProvider

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
