"""Keep what `import mcp` loads but a stdio `serve` never uses out of its memory (issue 24).

`MCPServer`: `import mcp` runs `mcp/server/__init__.py`, which imports `mcp.server.mcpserver` for the name
`MCPServer`; that package imports `mcp.server.request_state`, and with it `cryptography` (its Rust
extension alone is 6.4 MB resident). `serve` uses the low-level `Server` only: measured on a stdio
`serve`, the deferral takes 9 MB off the aggregator's RSS.

`defer_mcpserver()`, called before anything imports `mcp`, puts a stand-in package in
`sys.modules["mcp.server.mcpserver"]`. Its one eagerly read name, `MCPServer`, is a placeholder the
SDK's own modules bind (`mcp.server`, `mcp.client.client`, `mcp.client._memory`: type hints and
`isinstance` checks). Anything else asked of the stand-in, the name asked by any other module (it
gets the real one: no placeholder is bound where nothing would rebind it), or any use of the
placeholder (calling,
subclassing, an attribute, a subscript), imports the real package and puts the real class back in
those modules, so code that does use `MCPServer` behaves as without the deferral, only later. An
`isinstance` check against the placeholder loads nothing: without the real class there can be no
instance of it.

The HTTP client (httpx2, with idna and `importlib.metadata`, ~3 MB RSS): `import mcp` imports
`mcp.client.session_group` (for the name `ClientSessionGroup`) and `mcp.client.streamable_http`
(for `streamable_http_client`, bound by `mcp.client.client`), and both import httpx2 at their top.
A stdio `serve` with no remote upstream never uses them: `defer_http_clients()` gives both modules
the same kind of stand-in, so httpx2 loads with the first remote upstream (or `mcp.Client(url)`).

The HTTP server (starlette, sse-starlette, python-multipart, the SDK's session manager and its
server-side OAuth: 2.8 MB RSS): `mcp.server.lowlevel.server` imports them at its top for
`Server.streamable_http_app` only. `defer_http_server()` gives those twelve modules stand-ins whose
names the low-level server binds; three of the names are numbers used as default argument values
(no placeholder can be a number), so their values are restated here, checked against the SDK's by
`tests/test_sdk_adapter.py`. `--transport http` loads them when it builds the app.

OpenTelemetry's API (0.4 MB traced): `mcp.shared.jsonrpc_dispatcher` and `mcp.server._otel` bind
`SpanKind` and `StatusCode` from `opentelemetry.trace` and the span helpers of `mcp.shared._otel` (which
makes its tracer at import), for a span per request. `serve` with no `OTEL_EXPORTER_OTLP_ENDPOINT`
takes those spans out on both legs (`sdk.without_tracing`, `sdk.untraced_upstream_requests`), so
`defer_tracing()` gives both modules stand-ins; a span the SDK still makes (a server the aggregator
did not strip) loads the real ones, and the span with them.

`importlib.metadata` (with email, zipfile, csv, bz2, lzma and calendar: 1.3 MB RSS): pydantic imports it at
its top for two names, `entry_points` (`pydantic.plugin._loader`, to find pydantic plugins when it builds
its first model) and `version` (`pydantic.networks`, for email-validator's version when an email address
is validated). `defer_package_metadata()` gives it a stand-in when no installed distribution declares a
`pydantic` entry point (read as importlib.metadata's path finder reads them: each `sys.path` directory's
`*.dist-info` and `*.egg-info` `entry_points.txt`; a zip on the path or another distribution finder
counts as "maybe", and then nothing is deferred), and tells pydantic's loader what its scan would have
found: no plugin. Any other use loads the real module.

`pickle` (0.2 MB RSS with `_pickle`): structlog's `_output` imports `PicklingError` from it to refuse
pickling a logger; `defer_pickle()` gives it a stand-in, and that name a placeholder.

uvicorn: `mcp.server.streamable_http` imports `sse_starlette`, whose import imports uvicorn (click,
multiprocessing, logging.config: 2.5 MB RSS) only to hook uvicorn's exit handler. When the HTTP
server cannot be deferred, `import_sse_without_uvicorn` imports `sse_starlette` with uvicorn
hidden, so the hook is skipped; `restore_sse_drain` installs the same hook when the HTTP transport
imports uvicorn itself (`downstream/http.py`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import types
from dataclasses import dataclass
from importlib.machinery import ModuleSpec, PathFinder
from typing import Any


@dataclass(frozen=True)
class Deferral:
    """An SDK module kept out until first use, and the names the SDK reads from it at import."""

    module: str
    names: tuple[str, ...]  # read eagerly by `binders`: placeholders until the module loads
    binders: tuple[str, ...]  # SDK modules that bind those names (given the real ones on load)
    home: str = ""  # the module that defines the names, if a submodule (importable under the stand-in)
    constants: tuple[tuple[str, Any], ...] = ()  # values `binders` read eagerly, restated (a test
    # in tests/test_sdk_adapter.py checks them against the SDK's): a placeholder cannot be a number

    @property
    def defines(self) -> str:
        return self.home or self.module


MCPSERVER = Deferral(
    "mcp.server.mcpserver",
    ("MCPServer",),
    ("mcp.server", "mcp.client.client", "mcp.client._memory"),
    home="mcp.server.mcpserver.server",
)
HTTP_CLIENTS = (
    Deferral("mcp.client.session_group", ("ClientSessionGroup",), ("mcp",)),
    Deferral("mcp.client.streamable_http", ("streamable_http_client",), ("mcp.client.client",)),
)
_LOWLEVEL = ("mcp.server.lowlevel.server",)  # binds names of these only for `Server.streamable_http_app`
HTTP_SERVER = (
    Deferral("starlette.applications", ("Starlette",), _LOWLEVEL),
    Deferral("starlette.middleware", ("Middleware",), _LOWLEVEL),
    Deferral("starlette.middleware.authentication", ("AuthenticationMiddleware",), _LOWLEVEL),
    Deferral("starlette.routing", ("Mount", "Route"), _LOWLEVEL),
    Deferral("mcp.server.auth.middleware.auth_context", ("AuthContextMiddleware",), _LOWLEVEL),
    Deferral("mcp.server.auth.middleware.bearer_auth", ("BearerAuthBackend", "RequireAuthMiddleware"), _LOWLEVEL),
    Deferral("mcp.server.auth.provider", ("OAuthAuthorizationServerProvider", "TokenVerifier"), _LOWLEVEL),
    Deferral(
        "mcp.server.auth.routes",
        ("build_resource_metadata_url", "create_auth_routes", "create_protected_resource_routes"),
        _LOWLEVEL,
    ),
    Deferral("mcp.server.auth.settings", ("AuthSettings",), _LOWLEVEL),
    Deferral("mcp.server.streamable_http", ("EventStore",), _LOWLEVEL),
    Deferral(
        "mcp.server.streamable_http_manager",
        ("StreamableHTTPASGIApp", "StreamableHTTPSessionManager"),
        _LOWLEVEL,
        constants=(("DEFAULT_MAX_SESSIONS", 10_000), ("DEFAULT_SESSION_IDLE_TIMEOUT", 30 * 60)),
    ),
    Deferral(
        "mcp.server.transport_security",
        ("TransportSecuritySettings",),
        _LOWLEVEL,
        constants=(("DEFAULT_MAX_REQUEST_BODY_SIZE", 4 * 1024 * 1024),),
    ),
)
_TRACED = ("mcp.shared.jsonrpc_dispatcher", "mcp.server._otel")  # the SDK modules that make spans
TRACING = (
    Deferral("opentelemetry.trace", ("SpanKind", "StatusCode"), _TRACED),
    Deferral("mcp.shared._otel", ("extract_trace_context", "inject_trace_context", "otel_span"), _TRACED),
)
PACKAGE_METADATA = Deferral(
    "importlib.metadata", ("entry_points", "version"), ("pydantic.plugin._loader", "pydantic.networks")
)
PICKLE = Deferral("pickle", ("PicklingError",), ("structlog._output",))
_PLUGIN_SECTION = re.compile(r"^\s*\[\s*pydantic\s*\]\s*$", re.MULTILINE | re.IGNORECASE)  # an entry point group header
_DEFERRALS = {
    deferral.module: deferral
    for deferral in (MCPSERVER, *HTTP_CLIENTS, *HTTP_SERVER, *TRACING, PACKAGE_METADATA, PICKLE)
}
_IMPORT_SYSTEM = "importlib._bootstrap"  # its `from package import name` asks `hasattr` first


def defer_mcpserver() -> bool:
    """Install the stand-in; False (and nothing done) once `mcp` or the real package is imported."""
    return _defer(MCPSERVER)


def defer_http_clients() -> bool:
    """Keep httpx2 out until a remote transport is used; False (nothing done) once `mcp` is imported.

    The SDK's `MCPServer` package imports httpx2 as well: with `defer_mcpserver()` only."""
    if "mcp" in sys.modules:
        return False
    return all([_defer(deferral) for deferral in HTTP_CLIENTS])


def defer_http_server() -> bool:
    """Keep starlette and the SDK's HTTP server (its app, session manager, OAuth routes) out until
    `Server.streamable_http_app` runs (`--transport http`); False (nothing done) once `mcp` is imported."""
    if "mcp" in sys.modules or "starlette" in sys.modules:
        return False
    return all([_defer(deferral) for deferral in HTTP_SERVER])


def defer_tracing() -> bool:
    """Keep OpenTelemetry's API out until a span is made; False (nothing done) once `mcp` or it is imported.

    For a `serve` that takes the SDK's spans out (no `OTEL_EXPORTER_OTLP_ENDPOINT`): it then makes none."""
    if "mcp" in sys.modules or "opentelemetry.trace" in sys.modules:
        return False
    return all([_defer(deferral) for deferral in TRACING])


def defer_package_metadata() -> bool:
    """Keep `importlib.metadata` out of a process with no pydantic plugin installed; False (nothing done)
    once pydantic or it is imported, or when a plugin is, or may be, installed."""
    if "pydantic" in sys.modules or "importlib.metadata" in sys.modules or _pydantic_plugins_may_exist():
        return False
    if not _defer(PACKAGE_METADATA):
        return False
    importlib.metadata = sys.modules["importlib.metadata"]  # type: ignore[attr-defined]  # `import importlib.metadata`
    from pydantic.plugin import _loader  # binds the placeholder     # then reads it from the package

    _loader._plugins = {}  # what its scan would find: no plugin (the scan itself would load the module)
    return True


def defer_pickle() -> bool:
    """Keep `pickle` out until something pickles (or a structlog logger refuses to be pickled); False
    (nothing done) once structlog or pickle is imported."""
    if "structlog" in sys.modules or "pickle" in sys.modules:
        return False
    return _defer(PICKLE)


def _pydantic_plugins_may_exist() -> bool:
    """Whether an installed distribution declares a `pydantic` entry point, or might: found where
    importlib.metadata's path finder looks (plain directories on `sys.path`, names in any case, as it
    matches them); a zip on the path, an ``.egg`` (its metadata in ``EGG-INFO``), metadata that cannot
    be read or a distribution finder of another kind is a "maybe"."""
    if any(hasattr(finder, "find_distributions") and finder is not PathFinder for finder in sys.meta_path):
        return True
    for entry in sys.path:
        folder = entry or "."
        if os.path.isfile(folder) or folder.lower().rstrip("/").endswith(".egg"):
            return True
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            lower = name.lower()
            if lower.endswith(".egg"):
                return True
            if lower.endswith((".dist-info", ".egg-info")):
                found = _entry_points(folder, name)
                if found is None or _PLUGIN_SECTION.search(found):
                    return True
    return False


def _entry_points(folder: str, distribution: str) -> str | None:
    """A distribution's entry_points.txt; "" when it has none (or is an .egg-info file: no entry points),
    None when it cannot be read (a "maybe")."""
    try:
        with open(os.path.join(folder, distribution, "entry_points.txt"), encoding="utf-8") as fh:
            return fh.read()
    except (FileNotFoundError, NotADirectoryError):
        return ""
    except (OSError, UnicodeDecodeError):
        return None


def _defer(deferral: Deferral) -> bool:
    if "mcp" in sys.modules or deferral.module in sys.modules:
        return False
    spec = _module_spec(deferral.module)
    if spec is None:
        return False
    stand_in = importlib.util.module_from_spec(spec)  # its __path__ and __file__, read by the import
    stand_in.__class__ = _StandIn  # system and by `inspect`, are the real ones: reading them loads nothing
    sys.modules[deferral.module] = stand_in
    return True


def _module_spec(name: str) -> ModuleSpec | None:
    """The real module's spec, found on the path as the import system would, importing nothing."""
    parts = name.split(".")
    top = PathFinder.find_spec(parts[0])
    if top is None or len(parts) == 1:
        return top
    if not top.submodule_search_locations:
        return None
    locations = list(top.submodule_search_locations)
    for part in parts[1:-1]:
        locations = [os.path.join(location, part) for location in locations]
    return PathFinder.find_spec(name, locations)


def _load(module: str) -> Any:
    """Import the real module in place of its stand-in and rebind the names where the SDK bound them."""
    if isinstance(sys.modules.get(module), _StandIn):
        sys.modules.pop(module, None)  # pop: another thread may be loading it too
    real = importlib.import_module(module)
    deferral = _DEFERRALS[module]
    for binder_name in deferral.binders:
        binder = sys.modules.get(binder_name)
        for name in deferral.names:
            if binder is not None and getattr(binder, name, None) is placeholder(module, name):
                setattr(binder, name, getattr(real, name))
    parent, _, child = module.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, real)
    return real


def _loaded(deferral: Deferral, name: str) -> Any:
    """The real object if the module defining it is loaded (without loading anything), else None."""
    home = sys.modules.get(deferral.defines)
    if home is None or isinstance(home, _StandIn):
        return None
    return getattr(home, name, None)


class _StandIn(types.ModuleType):
    """A deferred module until anything but one of its eagerly read names is asked of it, or asked
    by a module other than the SDK's binders (which then gets the real module: a placeholder is
    never bound where nothing rebinds it)."""

    def __getattr__(self, name: str) -> Any:
        if name == "__path__":  # asked by `from module import name`: a plain module has none (a
            raise AttributeError(name)  # package's is set on the stand-in, so never asked here)
        deferral = _DEFERRALS[self.__name__]
        asking = sys._getframe(1).f_globals.get("__name__")
        if asking in deferral.binders or asking == _IMPORT_SYSTEM:
            if name in deferral.names:
                return placeholder(self.__name__, name)
            constants = dict(deferral.constants)
            if name in constants:
                return constants[name]
        return getattr(_load(self.__name__), name)


class _Deferred:
    """Stands for a name of a deferred module; every use but an `isinstance` check loads the real one."""

    def __init__(self, deferral: Deferral, name: str) -> None:
        self._deferral = deferral
        self._name = name

    def _real(self) -> Any:
        return getattr(_load(self._deferral.module), self._name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._real()(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real(), name)

    def __getitem__(self, item: Any) -> Any:
        return self._real()[item]

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[Any, ...]:
        return (self._real(),)

    def __instancecheck__(self, instance: Any) -> bool:
        real = _loaded(self._deferral, self._name)  # not loaded: there can be no instance of it
        return real is not None and isinstance(instance, real)

    def __subclasscheck__(self, subclass: Any) -> bool:
        real = _loaded(self._deferral, self._name)
        return real is not None and issubclass(subclass, real)

    def __or__(self, other: Any) -> Any:
        return self._real() | other

    def __ror__(self, other: Any) -> Any:
        return other | self._real()

    def __repr__(self) -> str:
        return f"<{self._name}, imported on first use (aggregator.sdk.deferred)>"


_PLACEHOLDERS = {
    (deferral.module, name): _Deferred(deferral, name) for deferral in _DEFERRALS.values() for name in deferral.names
}


def placeholder(module: str, name: str) -> _Deferred:
    """The one stand-in object for `name` of a deferred `module`."""
    return _PLACEHOLDERS[(module, name)]


PLACEHOLDER = placeholder(MCPSERVER.module, "MCPServer")


def import_sse_without_uvicorn() -> bool:
    """Import `sse_starlette.sse` with uvicorn hidden (it is optional there); False if already imported."""
    if "sse_starlette.sse" in sys.modules or "uvicorn" in sys.modules:
        return False
    sys.modules["uvicorn"] = None  # type: ignore[assignment]  # None: "import uvicorn" raises ImportError
    try:
        importlib.import_module("sse_starlette.sse")
    except ImportError:
        return False
    finally:
        del sys.modules["uvicorn"]
    return True


def restore_sse_drain() -> None:
    """Hook `sse_starlette` into uvicorn's exit handler as its import does when uvicorn is importable
    (on shutdown its open event streams end instead of waiting); a no-op when already hooked."""
    sse = sys.modules.get("sse_starlette.sse")
    if sse is None:
        return
    from uvicorn.main import Server

    status = sse.AppStatus
    if status.original_handler is None:
        status.original_handler = Server.handle_exit
        Server.handle_exit = status.handle_exit  # type: ignore[method-assign]
