"""Each SDK internal that `aggregator.sdk` reaches, exercised for real over an in-memory connection.

If an SDK upgrade renames or reshapes one of them, the test named after it fails here, with the
internal's name in the message, instead of a proxy feature failing somewhere far away.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.server import Server, ServerRequestContext
from mcp.shared.memory import create_client_server_memory_streams

from aggregator import sdk
from aggregator.sdk import oauth


async def _run(server: Server[Any], body: Any, **client_kwargs: Any) -> None:
    """Serve `server` in memory, open a legacy-era ClientSession on it, and run `body(session)`."""
    async with (
        create_client_server_memory_streams() as (client_streams, server_streams),
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(lambda: server.run(*server_streams, server.create_initialization_options()))
        async with ClientSession(*client_streams, **client_kwargs) as session:
            await session.initialize()
            with anyio.fail_after(10):
                await body(session)
        tg.cancel_scope.cancel()


async def test_raw_request_returns_the_result_unvalidated() -> None:
    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="t", input_schema={"type": "object"})])

    server: Server[Any] = Server("s", on_list_tools=list_tools)
    got: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        got.update(await sdk.raw_request(session, "tools/list", None))

    await _run(server, body)
    assert isinstance(got.get("tools"), list), "ClientSession._stamp/_dispatcher.send_raw_request changed"
    assert got["tools"][0]["name"] == "t"
    assert got["tools"][0]["inputSchema"] == {"type": "object"}  # wire shape, not a model


async def test_raw_notify_sends_any_notification() -> None:
    heard = anyio.Event()

    async def roots_changed(ctx: Any, params: Any) -> None:
        heard.set()

    server: Server[Any] = Server("s")
    server.add_notification_handler("notifications/roots/list_changed", types.NotificationParams, roots_changed)

    async def body(session: ClientSession) -> None:
        await sdk.raw_notify(session, "notifications/roots/list_changed", None)
        await heard.wait()

    await _run(server, body)
    assert heard.is_set(), "ClientSession._dispatcher.notify changed"


async def test_client_connection_and_request_sender_reach_the_calling_client() -> None:
    seen: dict[str, Any] = {}

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        seen["connection"] = sdk.client_connection(ctx.session)
        sampled = await sdk.request_sender(ctx.session)(
            "sampling/createMessage",
            {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 5},
            {"timeout": 5},
        )
        seen["sampled"] = sampled
        return types.CallToolResult(content=[])

    async def sampling(ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="yo"), model="m")

    server: Server[Any] = Server("s", on_call_tool=call_tool)

    async def body(session: ClientSession) -> None:
        await sdk.raw_request(session, "tools/call", {"name": "x", "arguments": {}})

    await _run(server, body, sampling_callback=sampling)
    assert seen["connection"] is not None, "ServerSession._connection changed"
    assert seen["sampled"]["content"]["text"] == "yo", "ServerSession._request_outbound.send_raw_request changed"


def test_client_connection_of_something_else_is_none() -> None:
    assert sdk.client_connection(object()) is None


def test_without_tracing_removes_only_the_sdk_span() -> None:
    server: Server[Any] = Server("s")
    before = list(server.middleware)
    kept = sdk.without_tracing(before)
    assert len(kept) == len(before) - 1, "the low-level Server no longer adds mcp.server._otel.OpenTelemetryMiddleware"


def test_http_timeouts_match_the_sdk_defaults() -> None:
    utils = pytest.importorskip("mcp.shared._httpx_utils")
    assert sdk.HTTP_TIMEOUT_SECONDS == utils.MCP_DEFAULT_TIMEOUT
    assert sdk.SSE_READ_TIMEOUT_SECONDS == utils.MCP_DEFAULT_SSE_READ_TIMEOUT


# ---------------------------------------------------------------- the OAuth providers' private steps


class _Storage:
    """The SDK's TokenStorage protocol in memory."""

    def __init__(self, tokens: Any = None, client: Any = None) -> None:
        self.tokens, self.client = tokens, client

    async def get_tokens(self) -> Any:
        return self.tokens

    async def set_tokens(self, tokens: Any) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> Any:
        return self.client

    async def set_client_info(self, client: Any) -> None:
        self.client = client


def _provider(storage: _Storage, redirect: Any = None) -> oauth.OAuthProvider:
    from mcp.shared.auth import OAuthClientMetadata
    from pydantic import AnyUrl

    async def callback() -> Any:
        raise AssertionError("no callback expected")

    return oauth.OAuthProvider(
        server_url="http://rs.test/mcp",
        client_metadata=OAuthClientMetadata(redirect_uris=[AnyUrl("http://127.0.0.1:1/callback")]),
        storage=storage,  # type: ignore[arg-type]
        redirect_handler=redirect,
        callback_handler=callback,
    )


def _signed_in(expires_in: int) -> _Storage:
    from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

    return _Storage(
        OAuthToken(access_token="old", refresh_token="r1", expires_in=expires_in),
        OAuthClientInformationFull(client_id="c", redirect_uris=None),
    )


def _server(seen: list[str]) -> Any:
    import httpx2

    def handle(request: httpx2.Request) -> httpx2.Response:
        seen.append(f"{request.method} {request.url.path} {request.headers.get('authorization', '-')}")
        if request.url.path == "/token":
            return httpx2.Response(200, json={"access_token": "new", "token_type": "Bearer", "expires_in": 3600})
        if request.headers.get("authorization") == "Bearer new":
            return httpx2.Response(200, json={})
        return httpx2.Response(401)

    return httpx2.AsyncClient(transport=httpx2.MockTransport(handle))


async def test_oauth_provider_keeps_a_stored_expiry_and_refreshes_before_using_an_expired_token() -> None:
    seen: list[str] = []
    storage = _signed_in(expires_in=-5)  # as TokenStore hands back a token past its expires_at
    async with _server(seen) as client:
        response = await client.get("http://rs.test/mcp", auth=_provider(storage))
    assert response.status_code == 200
    assert seen == ["POST /token -", "GET /mcp Bearer new"], "OAuthClientProvider._initialize changed"
    assert storage.tokens.access_token == "new"


async def test_oauth_provider_refreshes_a_token_the_server_refuses_before_asking_for_sign_in() -> None:
    seen: list[str] = []
    storage = _signed_in(expires_in=3600)
    async with _server(seen) as client:
        response = await client.get("http://rs.test/mcp", auth=_provider(storage))
    assert response.status_code == 200
    assert seen == ["GET /mcp Bearer old", "POST /token -", "GET /mcp Bearer new"], (
        "OAuthClientProvider._auth_flow changed"
    )


async def test_oauth_provider_takes_tokens_stored_meanwhile_before_refreshing() -> None:
    import httpx2
    from mcp.shared.auth import OAuthToken

    seen: list[str] = []
    accepted = {"Bearer old"}

    def handle(request: httpx2.Request) -> httpx2.Response:
        seen.append(f"{request.method} {request.url.path} {request.headers.get('authorization', '-')}")
        return httpx2.Response(200 if request.headers.get("authorization") in accepted else 401)

    storage = _signed_in(expires_in=3600)
    provider = _provider(storage)
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(handle)) as client:
        assert (await client.get("http://rs.test/mcp", auth=provider)).status_code == 200
        storage.tokens = OAuthToken(access_token="newer", refresh_token="r2", expires_in=3600)  # a sign-in elsewhere
        accepted = {"Bearer newer"}  # ... after which the server refuses the old token
        response = await client.get("http://rs.test/mcp", auth=provider)
    assert response.status_code == 200
    assert seen == ["GET /mcp Bearer old", "GET /mcp Bearer old", "GET /mcp Bearer newer"], (
        "OAuthClientProvider.context changed"
    )
    assert provider.context.current_tokens is not None and provider.context.current_tokens.refresh_token == "r2"


async def test_oauth_provider_adds_the_configured_scopes_to_the_challenged_ones() -> None:
    from urllib.parse import parse_qs, urlsplit

    import httpx2

    urls: list[str] = []

    async def redirect(url: str) -> None:
        urls.append(url)
        raise RuntimeError("stop here")

    def handle(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/mcp":
            return httpx2.Response(401, headers={"WWW-Authenticate": 'Bearer scope="read"'})
        if request.url.path == "/register":
            return httpx2.Response(201, json={"client_id": "c", "redirect_uris": ["http://127.0.0.1:1/callback"]})
        return httpx2.Response(404)

    provider = _provider(_Storage(), redirect)
    provider.extra_scope = "write"
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(handle)) as client:
        with pytest.raises(RuntimeError, match="stop here"):
            await client.get("http://rs.test/mcp", auth=provider)
    [url] = urls
    assert parse_qs(urlsplit(url).query)["scope"] == ["read write"], (
        "OAuthClientProvider._perform_authorization changed"
    )


def test_defer_wire_model_builds_builds_each_model_on_first_use() -> None:
    """In a fresh interpreter: deferred before `mcp` is imported, an era's models are classes without
    validators until used, then validate exactly as before; once imported, deferring is refused."""
    script = """
import sys
from aggregator import sdk
assert sdk.defer_wire_model_builds() is True
import mcp
import mcp_types._v2025_11_25 as legacy, mcp_types._v2026_07_28 as modern
assert not legacy.Tool.__pydantic_complete__, "mcp_types._wire_base.WireModel ignored defer_build"
assert not modern.Tool.__pydantic_complete__
tool = legacy.Tool.model_validate({"name": "t", "inputSchema": {"type": "object"}})
assert tool.name == "t" and legacy.Tool.__pydantic_complete__
assert not modern.Tool.__pydantic_complete__
assert sdk.defer_wire_model_builds() is False
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


async def test_untraced_upstream_requests_replaces_the_client_span_and_requests_still_work() -> None:
    import mcp.shared.jsonrpc_dispatcher as dispatcher

    saved = dispatcher.otel_span, dispatcher.inject_trace_context, dispatcher.SpanKind, dispatcher.StatusCode
    try:
        sdk.untraced_upstream_requests()
        assert dispatcher.otel_span is not saved[0] and dispatcher.inject_trace_context is not saved[1]

        async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            return types.ListToolsResult(tools=[types.Tool(name="t", input_schema={"type": "object"})])

        got: dict[str, Any] = {}

        async def body(session: ClientSession) -> None:
            got.update(await sdk.raw_request(session, "tools/list", None))

        await _run(Server("s", on_list_tools=list_tools), body)
        assert [tool["name"] for tool in got["tools"]] == ["t"]
    finally:  # the names the patch replaces
        dispatcher.otel_span, dispatcher.inject_trace_context, dispatcher.SpanKind, dispatcher.StatusCode = saved


def _fresh(script: str) -> None:
    """Run `script` in a fresh interpreter (the deferral must come before `mcp` is imported)."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


def test_defer_mcpserver_keeps_the_package_and_cryptography_out_until_used() -> None:
    """`mcp.server.mcpserver` (MCPServer, request_state, cryptography) is not imported with `mcp`;
    `isinstance` against the placeholder loads nothing; subclassing loads the real class, which
    then replaces the placeholder in every SDK module that bound it, and `mcp.Client` serves it."""
    _fresh("""
import sys, anyio
from aggregator.sdk.deferred import PLACEHOLDER, defer_mcpserver
assert defer_mcpserver() is True
import mcp, mcp.server, mcp.client.client
from mcp.server import Server
heavy = ("cryptography", "mcp.server.request_state", "mcp.server.mcpserver.server")
assert not any(name in sys.modules for name in heavy), [n for n in heavy if n in sys.modules]
assert mcp.server.MCPServer is PLACEHOLDER and mcp.client.client.MCPServer is PLACEHOLDER
assert not isinstance(Server("low"), mcp.server.MCPServer) and not any(n in sys.modules for n in heavy)
import inspect; inspect.getmodule(Server)  # reads every module's __file__: must load nothing
assert not any(name in sys.modules for name in heavy)

class Mine(mcp.server.MCPServer):
    pass

assert all(name in sys.modules for name in heavy)
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
assert MCPServer is sys.modules["mcp.server.mcpserver.server"].MCPServer is mcp.client.client.MCPServer
assert issubclass(Mine, MCPServer) and isinstance(Mine("m"), PLACEHOLDER)
server = Mine("s")

@server.tool()
def echo(message: str) -> str:
    return message

async def main():
    async with mcp.Client(server) as client:
        result = await client.call_tool("echo", {"message": "hi"})
    assert result.content[0].text == "hi", result

anyio.run(main)
assert defer_mcpserver() is False
print("ok")
""")


def test_defer_mcpserver_placeholder_builds_a_real_server_and_submodules_import() -> None:
    _fresh("""
import sys
from aggregator.sdk.deferred import defer_mcpserver
assert defer_mcpserver() is True
import mcp.server
import mcp.server.mcpserver.utilities.types as utility_types  # a submodule alone, under the stand-in
assert utility_types.Image
server = mcp.server.MCPServer("s")  # calling the placeholder
assert type(server).__name__ == "MCPServer" and isinstance(server, mcp.server.MCPServer)
assert "cryptography" in sys.modules and sys.modules["mcp.server.mcpserver"].MCPServer is type(server)
print("ok")
""")


def test_sse_starlette_imports_without_uvicorn_and_the_http_transport_hooks_it_back() -> None:
    """sse_starlette hooks uvicorn's exit handler at import when uvicorn is importable; `serve` imports it
    with uvicorn hidden, and the HTTP transport installs the same hook, once, when it loads uvicorn."""
    _fresh("""
import sys
from aggregator.sdk.deferred import import_sse_without_uvicorn, restore_sse_drain
assert import_sse_without_uvicorn() is True
import mcp, mcp.server.streamable_http
from sse_starlette.sse import AppStatus
assert "uvicorn" not in sys.modules and AppStatus.original_handler is None
assert import_sse_without_uvicorn() is False
from uvicorn.main import Server
original = Server.handle_exit
import aggregator.downstream.http
assert Server.handle_exit is AppStatus.handle_exit and AppStatus.original_handler is original
restore_sse_drain()
assert Server.handle_exit is AppStatus.handle_exit and AppStatus.original_handler is original
print("ok")
""")
    _fresh("""
import mcp
from sse_starlette.sse import AppStatus
from uvicorn.main import Server
assert Server.handle_exit is AppStatus.handle_exit and AppStatus.original_handler is not None  # what we restate
print("ok")
""")


def test_defer_http_clients_keeps_httpx2_out_until_a_remote_client_is_used() -> None:
    """`import mcp` imports `mcp.client.session_group` and `mcp.client.streamable_http`, and with them
    httpx2; deferred, both are stand-ins whose eagerly read names (`ClientSessionGroup`,
    `streamable_http_client`) are placeholders for the SDK modules that bind them: `isinstance` loads
    nothing, any other use loads the real module and gives the real names back to those modules; a
    module that is not one of them gets the real module at once (no placeholder is left unbound)."""
    _fresh("""
import sys
from aggregator.sdk.deferred import defer_http_clients, defer_mcpserver, placeholder
assert defer_http_clients() is True and defer_mcpserver() is True  # MCPServer's resources import httpx2 too
import mcp, mcp.client.client
heavy = ("httpx2", "mcp.shared._httpx_utils", "mcp.client.sse")
assert not any(name in sys.modules for name in heavy), [n for n in heavy if n in sys.modules]
group = placeholder("mcp.client.session_group", "ClientSessionGroup")
connect = placeholder("mcp.client.streamable_http", "streamable_http_client")
assert mcp.ClientSessionGroup is group and mcp.client.client.streamable_http_client is connect
assert not isinstance(object(), mcp.ClientSessionGroup) and not any(name in sys.modules for name in heavy)

client = mcp.Client("http://127.0.0.1:9/mcp")  # the SDK calls streamable_http_client: the real one loads
real = sys.modules["mcp.client.streamable_http"]
assert "httpx2" in sys.modules and real.streamable_http_client is mcp.client.client.streamable_http_client
assert mcp.client.streamable_http is real and type(real).__name__ == "module"
assert mcp.ClientSessionGroup is group  # the other module stays deferred until it is used
from mcp.client.session_group import ClientSessionGroup  # asked by a module that binds no placeholder
assert ClientSessionGroup is sys.modules["mcp.client.session_group"].ClientSessionGroup is mcp.ClientSessionGroup
assert isinstance(ClientSessionGroup(), group)
assert defer_http_clients() is False
print("ok")
""")


def test_defer_http_server_keeps_starlette_out_until_the_http_app_is_built() -> None:
    """`mcp.server.lowlevel.server` imports starlette, the SDK's session manager and its server-side OAuth
    for `Server.streamable_http_app` only; deferred, none of them loads until that app is built, its
    default arguments are the SDK's own values, and the app it builds serves a real HTTP client."""
    _fresh("""
import sys, anyio, httpx2
from aggregator.sdk import deferred
assert deferred.defer_http_server() and deferred.defer_mcpserver() and deferred.defer_http_clients()  # as serve
import mcp, mcp.server.lowlevel.server as lowlevel
from mcp.server import Server
assert not any(name.split(".")[0] in ("starlette", "sse_starlette") and not type(module).__name__ == "_StandIn"
               for name, module in sys.modules.items()), "starlette imported"
assert "mcp.server.auth.routes" not in sys.modules or type(sys.modules["mcp.server.auth.routes"]).__name__ == "_StandIn"
import inspect
parameters = inspect.signature(lowlevel.Server.streamable_http_app).parameters
restated = [parameters[name].default for name in ("max_request_body_size", "session_idle_timeout", "max_sessions")]
import mcp.server.streamable_http_manager as manager, mcp.server.transport_security as security  # the real ones
real = [security.DEFAULT_MAX_REQUEST_BODY_SIZE, manager.DEFAULT_SESSION_IDLE_TIMEOUT, manager.DEFAULT_MAX_SESSIONS]
assert restated == real, (restated, real)  # the SDK's defaults, restated in aggregator.sdk.deferred

import mcp.types as types

async def list_tools(ctx, params):
    return types.ListToolsResult(tools=[types.Tool(name="t", input_schema={"type": "object"})])

server = Server("s", on_list_tools=list_tools)
app = server.streamable_http_app(streamable_http_path="/mcp", stateless_http=True, json_response=True)
from starlette.applications import Starlette
assert isinstance(app, Starlette) and lowlevel.Starlette is Starlette

async def main():
    async with server.session_manager.run():
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http:
            headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
            init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
                    "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
            answer = await http.post("/mcp", json=init, headers=headers)
            assert answer.status_code == 200 and answer.json()["result"]["serverInfo"]["name"] == "s", answer.text
            listed = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                                     headers={**headers, "mcp-protocol-version": "2025-06-18"})
            assert [tool["name"] for tool in listed.json()["result"]["tools"]] == ["t"], listed.text

anyio.run(main)
assert deferred.defer_http_server() is False
print("ok")
""")


def test_defer_tracing_keeps_opentelemetry_out_until_a_span_is_made() -> None:
    """`mcp.shared.jsonrpc_dispatcher` and `mcp.server._otel` bind OpenTelemetry's `SpanKind`, `StatusCode`
    and the span helpers of `mcp.shared._otel`; deferred, a server and client with the spans taken out (as
    `serve` with no OTEL endpoint) talk without loading either, and a server that keeps the SDK's span
    middleware loads both with its first span and serves as before."""
    _fresh("""
import sys, anyio
from aggregator import sdk
from aggregator.sdk import deferred
assert deferred.defer_tracing() and deferred.defer_mcpserver() and deferred.defer_http_clients()  # as serve
import mcp, mcp.types as types
from mcp import ClientSession
from mcp.server import Server
from mcp.shared.memory import create_client_server_memory_streams

def loaded(name):
    return name in sys.modules and type(sys.modules[name]).__name__ != "_StandIn"

async def list_tools(ctx, params):
    return types.ListToolsResult(tools=[types.Tool(name="t", input_schema={"type": "object"})])

async def round_trip(server):
    async with create_client_server_memory_streams() as (ours, theirs), anyio.create_task_group() as tg:
        tg.start_soon(lambda: server.run(*theirs, server.create_initialization_options()))
        async with ClientSession(*ours) as session:
            await session.initialize()
            listed = await session.list_tools()
        tg.cancel_scope.cancel()
    return [tool.name for tool in listed.tools]

assert not loaded("opentelemetry.trace") and not loaded("mcp.shared._otel")
untraced = Server("s", on_list_tools=list_tools)
untraced.middleware = sdk.without_tracing(untraced.middleware)  # as serve with no OTEL endpoint
sdk.untraced_upstream_requests()
assert anyio.run(round_trip, untraced) == ["t"]
assert not loaded("opentelemetry.trace") and not loaded("mcp.shared._otel")

traced = Server("s", on_list_tools=list_tools)  # keeps the SDK's span per request: its first span loads the API
assert anyio.run(round_trip, traced) == ["t"]
import opentelemetry.trace, mcp.server._otel as server_otel, mcp.shared._otel as shared_otel
assert loaded("opentelemetry.trace") and loaded("mcp.shared._otel")
assert server_otel.SpanKind is opentelemetry.trace.SpanKind and server_otel.otel_span is shared_otel.otel_span
assert deferred.defer_tracing() is False
print("ok")
""")


def test_defer_package_metadata_keeps_importlib_metadata_out_and_pydantic_working() -> None:
    """pydantic binds `entry_points` (`pydantic.plugin._loader`) and `version` (`pydantic.networks`) from
    `importlib.metadata`; deferred (no pydantic plugin installed), models build and validate without
    loading it, the loader's private `_plugins` cache says "no plugin" as its scan would, and any
    other use of the module (or of a placeholder) loads the real one."""
    _fresh("""
import sys
from aggregator.sdk import deferred
assert deferred.defer_package_metadata()

def loaded(name):
    return name in sys.modules and type(sys.modules[name]).__name__ != "_StandIn"

import pydantic
from pydantic.plugin import _loader
import pydantic.networks

class M(pydantic.BaseModel):
    x: int

assert M.model_validate({"x": "3"}).x == 3 and list(_loader.get_plugins()) == []
assert not loaded("importlib.metadata") and "email" not in sys.modules and "zipfile" not in sys.modules
assert _loader._plugins == {}  # the private cache the loader reads first
import importlib.metadata
assert importlib.metadata.version("pydantic") == pydantic.VERSION  # another module: the real one
assert loaded("importlib.metadata")
assert pydantic.networks.version("pydantic") == pydantic.VERSION  # the placeholder was rebound
assert pydantic.networks.version is importlib.metadata.version
print("ok")
""")


def test_defer_package_metadata_leaves_an_installed_pydantic_plugin_working(tmp_path: Path) -> None:
    """A distribution declaring a `pydantic` entry point: nothing is deferred, and pydantic loads it."""
    (tmp_path / "myplugin-1.0.dist-info").mkdir()
    (tmp_path / "myplugin-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: myplugin\nVersion: 1.0\n"
    )
    (tmp_path / "myplugin-1.0.dist-info" / "entry_points.txt").write_text(
        "[other]\nx = y\n\n[pydantic]\nmine = myplugin:plugin\n"
    )
    (tmp_path / "myplugin.py").write_text(
        "seen = []\nclass _P:\n    def new_schema_validator(self, schema, *args, **kwargs):\n"
        "        seen.append(schema)\n        return None, None, None\nplugin = _P()\n"
    )
    script = f"""
import sys
sys.path.insert(0, {str(tmp_path)!r})
from aggregator.sdk import deferred
assert not deferred.defer_package_metadata()
import pydantic, myplugin

class M(pydantic.BaseModel):
    x: int

assert myplugin.seen, "the plugin was not loaded"
print("ok")
"""
    _fresh(script)


@pytest.mark.parametrize(
    ("layout", "readable"),
    [
        ("myplugin-1.0.DIST-INFO", True),  # importlib.metadata matches the suffix in any case
        ("myplugin-1.0-py3.12.egg/EGG-INFO", True),  # an egg: its metadata one level down
        ("myplugin-1.0.dist-info", False),  # metadata that cannot be read
    ],
)
def test_defer_package_metadata_counts_every_plugin_layout_importlib_metadata_finds_as_a_maybe(
    tmp_path: Path, layout: str, readable: bool
) -> None:
    """Where importlib.metadata would find a pydantic plugin, or the scan cannot tell, nothing is deferred."""
    metadata = tmp_path / layout
    metadata.mkdir(parents=True)
    (metadata / ("PKG-INFO" if "EGG" in layout else "METADATA")).write_text(
        "Metadata-Version: 2.1\nName: myplugin\nVersion: 1.0\n"
    )
    (metadata / "entry_points.txt").write_bytes(
        b"[pydantic]\nmine = myplugin:plugin\n" if readable else b"[pydantic]\n\xff\xfe not text\n"
    )
    on_path = metadata.parent if "EGG" in layout else tmp_path  # an egg is on sys.path itself
    script = f"""
import sys
sys.path.insert(0, {str(on_path)!r})
from aggregator.sdk import deferred
assert not deferred.defer_package_metadata()
if {readable!r}:  # it is a plugin importlib.metadata (so pydantic) finds
    import importlib.metadata
    assert [ep.name for ep in importlib.metadata.entry_points(group="pydantic")] == ["mine"]
print("ok")
"""
    _fresh(script)


def test_defer_pickle_keeps_pickle_out_of_structlog_until_something_pickles() -> None:
    """structlog's `_output` binds `PicklingError` at import; deferred, structlog logs without loading
    pickle, a logger that refuses to be pickled raises the real `PicklingError`, and pickling works."""
    _fresh("""
import io, sys
from aggregator.sdk import deferred
assert deferred.defer_pickle()
import aggregator.log  # structlog as serve imports it: without rich, which would import pickle itself
import structlog

def loaded(name):
    return name in sys.modules and type(sys.modules[name]).__name__ != "_StandIn"

out = io.StringIO()
structlog.PrintLogger(out).msg("hello")
assert out.getvalue() == "hello\\n" and not loaded("pickle") and "_pickle" not in sys.modules
import pickle
try:
    structlog.PrintLogger(out).__getstate__()
except Exception as exc:  # the real class, loaded by the placeholder's call
    assert type(exc) is sys.modules["pickle"].PicklingError, type(exc)
else:
    raise AssertionError("a PrintLogger to a StringIO was pickled")
assert pickle.loads(pickle.dumps({"a": 1})) == {"a": 1} and loaded("pickle")
print("ok")
""")
