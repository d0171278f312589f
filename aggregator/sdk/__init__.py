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
- `untraced_upstream_requests`: the client side does the same, one span and one trace-context
  injection per request sent to an upstream, from module globals of the private dispatcher.
- `oauth` (a submodule, `aggregator.sdk.oauth`): the SDK's OAuth providers with three private steps
  extended (stored expiry kept, refresh before expiry and on 401, configured scopes added).
- `defer_wire_model_builds`: the SDK's ~570 generated wire models (both protocol eras) build their
  pydantic validators at import; deferred, each builds on its first use, so an era no client speaks
  costs only its class definitions. It must run before `mcp` is imported, so this module imports
  the SDK only inside its functions.
- `deferred` (a submodule, `aggregator.sdk.deferred`): `import mcp` imports the high-level
  `MCPServer` package and with it `cryptography` (9 MB RSS), the HTTP clients with httpx2 (2.4) and
  the low-level server's HTTP app with starlette (2.8); a stdio `serve` uses none of them, so each
  gets a stand-in until first use.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp.client.session import ClientSession

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
    from mcp.server._otel import OpenTelemetryMiddleware

    return [m for m in middleware if not isinstance(m, OpenTelemetryMiddleware)]


def untraced_upstream_requests() -> None:
    """Skip the SDK client's per-request OpenTelemetry span and trace-context injection (for `serve`
    when no tracing is configured: with no tracer both are pure per-call cost, 3.5 % of a proxied call).

    Imports no OpenTelemetry: the names the dispatcher reads per request (`SpanKind.CLIENT`,
    `StatusCode.ERROR`) are rebound too, so a deferred API (`deferred.defer_tracing`) stays unloaded."""
    from contextlib import contextmanager

    import mcp.shared.jsonrpc_dispatcher as dispatcher

    @contextmanager
    def no_span(*_args: Any, **_kwargs: Any) -> Any:
        yield _UNTRACED

    dispatcher.otel_span = no_span  # type: ignore[assignment]
    dispatcher.inject_trace_context = lambda meta: None
    dispatcher.SpanKind = dispatcher.StatusCode = _Untraced  # type: ignore[assignment,misc]


class _Untraced:
    """The span of an untraced request, and the span kind and status the dispatcher hands it: all dropped."""

    CLIENT = ERROR = None

    def set_attributes(self, *_args: Any) -> None:
        pass

    def set_status(self, *_args: Any) -> None:
        pass


_UNTRACED = _Untraced()


def defer_wire_model_builds() -> bool:
    """Build the SDK's generated wire models (`mcp_types._v*`) on first use instead of at import.

    Call before anything imports `mcp`; afterwards it changes nothing (the models are built) and
    says so by returning False. Pydantic builds a deferred model on its first validation or schema
    use, so behaviour is unchanged; only the cost moves to the era a client actually speaks.
    """
    import sys

    if any(name.startswith("mcp_types._v") for name in sys.modules):
        return False
    from mcp_types._wire_base import WireModel

    WireModel.model_config["defer_build"] = True
    return True
