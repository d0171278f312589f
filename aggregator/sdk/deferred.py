"""Keep what `import mcp` loads but a stdio `serve` never uses out of its memory (issue 24).

`MCPServer`: `import mcp` runs `mcp/server/__init__.py`, which imports `mcp.server.mcpserver` for the name
`MCPServer`; that package imports `mcp.server.request_state`, and with it `cryptography` (its Rust
extension alone is 6.4 MB resident). `serve` uses the low-level `Server` only: measured on a stdio
`serve`, the deferral takes 9 MB off the aggregator's RSS.

`defer_mcpserver()`, called before anything imports `mcp`, puts a stand-in package in
`sys.modules["mcp.server.mcpserver"]`. Its one eagerly read name, `MCPServer`, is a placeholder the
SDK's own modules bind (`mcp.server`, `mcp.client.client`, `mcp.client._memory`: type hints and
`isinstance` checks). Anything else asked of the stand-in, or any use of the placeholder (calling,
subclassing, an attribute, a subscript), imports the real package and puts the real class back in
those modules, so code that does use `MCPServer` behaves as without the deferral, only later. An
`isinstance` check against the placeholder loads nothing: without the real class there can be no
instance of it.

uvicorn: `import mcp` imports `sse_starlette`, whose import imports uvicorn (click, multiprocessing,
logging.config: 2.5 MB RSS) only to hook uvicorn's exit handler. `import_sse_without_uvicorn`
imports `sse_starlette` with uvicorn hidden, so the hook is skipped; `restore_sse_drain` installs
the same hook when the HTTP transport imports uvicorn itself (`downstream/http.py`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from importlib.machinery import ModuleSpec, PathFinder
from typing import Any

PACKAGE = "mcp.server.mcpserver"
CLASS_MODULE = "mcp.server.mcpserver.server"  # where MCPServer is defined
BINDERS = ("mcp.server", "mcp.client.client", "mcp.client._memory")  # SDK modules that bind the name


def defer_mcpserver() -> bool:
    """Install the stand-in; False (and nothing done) once `mcp` or the real package is imported."""
    if "mcp" in sys.modules or PACKAGE in sys.modules:
        return False
    spec = _package_spec()
    if spec is None:
        return False
    stand_in = importlib.util.module_from_spec(spec)  # its __path__ and __file__, read by the import
    stand_in.__class__ = _StandIn  # system and by `inspect`, are the real ones: reading them loads nothing
    sys.modules[PACKAGE] = stand_in
    return True


def _package_spec() -> ModuleSpec | None:
    """The real package's spec, found on the path as the import system would, importing nothing."""
    top = PathFinder.find_spec("mcp")
    if top is None or not top.submodule_search_locations:
        return None
    server = [os.path.join(location, "server") for location in top.submodule_search_locations]
    return PathFinder.find_spec(PACKAGE, server)


def _load() -> Any:
    """Import the real package in place of the stand-in and rebind the class where the SDK bound it."""
    if isinstance(sys.modules.get(PACKAGE), _StandIn):
        sys.modules.pop(PACKAGE, None)  # pop: another thread may be loading it too
    real = importlib.import_module(PACKAGE)
    for name in BINDERS:
        binder = sys.modules.get(name)
        if binder is not None and getattr(binder, "MCPServer", None) is PLACEHOLDER:
            binder.MCPServer = real.MCPServer  # type: ignore[attr-defined]
    parent = sys.modules.get("mcp.server")
    if parent is not None:
        parent.mcpserver = real  # type: ignore[attr-defined]
    return real


class _StandIn(types.ModuleType):
    """`mcp.server.mcpserver` until something other than the name `MCPServer` is asked of it."""

    def __getattr__(self, name: str) -> Any:
        if name == "MCPServer":
            return PLACEHOLDER
        return getattr(_load(), name)


class _DeferredClass:
    """Stands for the class `MCPServer`; every use but an `isinstance` check loads the real one."""

    def _real(self) -> Any:
        return _load().MCPServer

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._real()(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real(), name)

    def __getitem__(self, item: Any) -> Any:
        return self._real()[item]

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[Any, ...]:
        return (self._real(),)

    def __instancecheck__(self, instance: Any) -> bool:
        real = getattr(sys.modules.get(CLASS_MODULE), "MCPServer", None)
        return real is not None and isinstance(instance, real)

    def __subclasscheck__(self, subclass: Any) -> bool:
        real = getattr(sys.modules.get(CLASS_MODULE), "MCPServer", None)
        return real is not None and issubclass(subclass, real)

    def __or__(self, other: Any) -> Any:
        return self._real() | other

    def __ror__(self, other: Any) -> Any:
        return other | self._real()

    def __repr__(self) -> str:
        return "<MCPServer, imported on first use (aggregator.sdk.deferred)>"


PLACEHOLDER = _DeferredClass()


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
