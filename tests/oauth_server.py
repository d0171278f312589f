"""A protected MCP server with its own OAuth authorization server, for the OAuth tests.

    python tests/oauth_server.py PORT [--token-seconds N] [--resource URL] [--scopes a,b] [--sse]

Built on the SDK's server-side auth (`mcp.server.auth`): RFC 9728 protected-resource metadata,
RFC 8414 metadata, dynamic client registration, PKCE-checked authorization codes, refresh tokens,
tokens bound to the RFC 8707 `resource` they were issued for. The authorization endpoint approves
at once (it redirects straight back with a code), so a "browser" that only follows redirects
completes a sign-in. `--resource` makes the server announce another resource than its own URL.

Test hooks: `POST /test/revoke` forgets every token (access and refresh); `GET /test/stats`
answers how many tokens of each grant were issued.
"""

from __future__ import annotations

import argparse
import secrets
import time
from typing import Any

import uvicorn
from mcp.server import MCPServer
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    TokenError,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from starlette.requests import Request
from starlette.responses import JSONResponse, Response


class Provider:
    """In-memory authorization server state; approves every authorization request."""

    def __init__(self, token_seconds: int, resource: str) -> None:
        self.token_seconds = token_seconds
        self.resource = resource
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.issued = {"authorization_code": 0, "refresh_token": 0}

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        assert client_info.client_id is not None
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        code = secrets.token_urlsafe(16)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or [],
            expires_at=time.time() + 300,
            client_id=client.client_id or "",
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client: OAuthClientInformationFull, code: str) -> AuthorizationCode | None:
        return self.codes.get(code)

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
    ) -> OAuthToken:
        del self.codes[authorization_code.code]
        self.issued["authorization_code"] += 1
        return self._issue(client, authorization_code.scopes, authorization_code.resource)

    async def load_refresh_token(self, client: OAuthClientInformationFull, refresh_token: str) -> RefreshToken | None:
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        del self.refresh[refresh_token.token]
        self.issued["refresh_token"] += 1
        return self._issue(client, scopes or refresh_token.scopes, refresh_token.resource)

    async def load_access_token(self, token: str) -> AccessToken | None:
        access = self.access.get(token)
        if access is None or (access.expires_at is not None and access.expires_at < time.time()):
            return None
        return access

    async def revoke_token(self, token: Any) -> None:
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)

    def _issue(self, client: OAuthClientInformationFull, scopes: list[str], resource: str | None) -> OAuthToken:
        if resource != self.resource:
            raise TokenError("invalid_target", f"tokens here are for {self.resource}, not {resource}")
        access, refresh = "at-" + secrets.token_urlsafe(24), "rt-" + secrets.token_urlsafe(24)
        client_id = client.client_id or ""
        expires = int(time.time()) + self.token_seconds
        self.access[access] = AccessToken(
            token=access, client_id=client_id, scopes=scopes, expires_at=expires, resource=resource
        )
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes, resource=resource)
        return OAuthToken(
            access_token=access,
            expires_in=self.token_seconds,
            refresh_token=refresh,
            scope=" ".join(scopes) or None,
        )


def build(port: int, token_seconds: int, scopes: list[str], path: str = "/mcp") -> MCPServer:
    base = f"http://127.0.0.1:{port}"
    announced = f"{base}{path}"
    provider = Provider(token_seconds, announced)
    server = MCPServer(
        "oauth-test",
        auth_server_provider=provider,
        auth=AuthSettings(
            issuer_url=base,  # type: ignore[arg-type]
            resource_server_url=announced,  # type: ignore[arg-type]
            validate_token_resource=True,
            required_scopes=scopes or None,
            client_registration_options=ClientRegistrationOptions(enabled=True, valid_scopes=scopes or None),
        ),
    )

    @server.tool()
    def echo(text: str) -> str:
        """Say the text back."""
        return text

    @server.custom_route("/test/revoke", methods=["POST"])
    async def revoke(request: Request) -> Response:
        provider.access.clear()
        provider.refresh.clear()
        return JSONResponse({"revoked": True})

    @server.custom_route("/test/stats", methods=["GET"])
    async def stats(request: Request) -> Response:
        return JSONResponse(provider.issued)

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--token-seconds", type=int, default=3600)
    parser.add_argument("--resource")
    parser.add_argument("--scopes", default="")
    parser.add_argument("--sse", action="store_true", help="serve legacy HTTP+SSE at /sse instead of /mcp")
    args = parser.parse_args()
    scopes = [s for s in args.scopes.split(",") if s]
    server = build(args.port, args.token_seconds, scopes, "/sse" if args.sse else "/mcp")
    app: Any = server.sse_app(host="127.0.0.1") if args.sse else server.streamable_http_app(host="127.0.0.1")
    if args.resource:
        app = announcing(app, args.port, args.resource)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


def announcing(app: Any, port: int, resource: str) -> Any:
    """The app, with protected-resource metadata that names `resource` instead of this server."""
    metadata = {"resource": resource, "authorization_servers": [f"http://127.0.0.1:{port}"]}

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/.well-known/oauth-protected-resource"):
            await JSONResponse(metadata)(scope, receive, send)
            return
        await app(scope, receive, send)

    return wrapped


if __name__ == "__main__":
    main()
