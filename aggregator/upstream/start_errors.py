"""Why an upstream's start failed, in one line a user can act on."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from urllib.parse import urlsplit

from mcp.shared.exceptions import MCPError

from aggregator.config import UpstreamConfig
from aggregator.upstream.oauth_signin import describe_auth_error

# The launchers MCP servers are usually started with, and what provides each (a new machine often lacks one).
_PROVIDERS = {
    "uvx": "uv, which provides uvx: https://docs.astral.sh/uv/",
    "uv": "uv: https://docs.astral.sh/uv/",
    "npx": "Node.js, which provides npx: https://nodejs.org",
    "node": "Node.js: https://nodejs.org",
    "bunx": "Bun, which provides bunx: https://bun.sh",
    "pipx": "pipx: https://pipx.pypa.io",
    "docker": "Docker: https://docs.docker.com/get-docker/",
}


def install_hint(command: str) -> str:
    """ "install uv, which provides uvx: URL" for a usual launcher that is missing, else ''."""
    name = os.path.basename(command.replace("\\", "/")).lower().removesuffix(".exe").removesuffix(".cmd")
    provider = _PROVIDERS.get(name)
    return f"install {provider}" if provider else ""


def describe_start_error(exc: BaseException, config: UpstreamConfig) -> str:
    """What went wrong (at most 500 characters); the caller adds the tail of the child's stderr."""
    leaves = list(leaf_exceptions(exc))
    first = leaves[0] if leaves else exc
    if (signing_in := describe_auth_error(first)) is not None:
        what = signing_in
    elif isinstance(first, TimeoutError):
        what = f"no handshake within {config.timeouts.connect:g}s"
    elif isinstance(first, FileNotFoundError | NotADirectoryError) and not _is_dir(config.cwd):
        what = f"working directory not found: {config.cwd}"
    elif isinstance(first, FileNotFoundError):
        hint = install_hint(config.command or "")
        what = f"command not found: {config.command}" + (f" ({hint})" if hint else "")
    elif isinstance(first, PermissionError):
        what = f"command not executable: {config.command}"
    elif isinstance(first, MCPError):
        what = f"handshake failed: {first.message}"
    elif (unreachable := _unreachable(first, config)) is not None:
        what = unreachable
    else:
        what = f"{type(first).__name__}: {first}".strip()
    return what[:500]


def leaf_exceptions(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions inside `exc`, exception groups flattened."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from leaf_exceptions(inner)
    else:
        yield exc


def _unreachable(exc: BaseException, config: UpstreamConfig) -> str | None:
    """`HOST:PORT is not reachable` for a remote upstream nothing answers at (the URL's path and query may
    hold secrets: never shown). httpx2 is looked up, not imported: if it is not loaded, `exc` is not its."""
    httpx2 = sys.modules.get("httpx2")
    if config.url is None or httpx2 is None or not isinstance(exc, httpx2.ConnectError):
        return None
    where = urlsplit(config.url)
    try:
        port = where.port or (443 if where.scheme == "https" else 80)
    except ValueError:
        return None
    return f"{where.hostname}:{port} is not reachable ({exc})"


def _is_dir(path: str | None) -> bool:
    return path is None or os.path.isdir(path)
