"""Command line: `aggregator serve`, `aggregator list-upstreams`, `aggregator search`.

Every command loads the config the same way (DESIGN §1); a broken config
prints one line naming the file, the key and the fix, and exits with code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import typing
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from aggregator import __version__
from aggregator.config import AggregatorConfig, ConfigError, load_config
from aggregator.log import configure_logging, get_logger
from aggregator.settings import Settings, load_settings, resolve_data_dir
from aggregator.table import render_table

log = get_logger(__name__)

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (exit 2), like config errors; subcommand parsers are made of it too."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0-65535)")
    return port


def build_parser() -> argparse.ArgumentParser:
    # SUPPRESS: an option given before the subcommand is not reset by the subcommand's default.
    common = _Parser(add_help=False, argument_default=argparse.SUPPRESS)
    common.add_argument("--config", type=Path, help="YAML (or mcpServers JSON) config file")
    common.add_argument("--log-level", help="debug, info, warning (default), error")
    common.add_argument("--log-file", type=Path, help="write logs to this file instead of stderr")

    parser = _Parser(prog="aggregator", description="One MCP entry for many MCP servers.", parents=[common])
    parser.add_argument("--version", action="version", version=f"aggregator {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", parents=[common], help="serve MCP over stdio (default) or streamable HTTP")
    serve.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    serve.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8765, help="HTTP port (default 8765)")
    serve.add_argument("--allow-host", action="append", default=[], help="extra Host header value to accept")
    serve.add_argument("--data-dir", type=Path, help="where persistent search indexes live")

    upstreams = sub.add_parser("list-upstreams", parents=[common], help="show configured upstreams")
    upstreams.add_argument("--probe", action="store_true", help="start every upstream concurrently and report")
    upstreams.add_argument("--json", action="store_true", help="print JSON instead of a table")

    search = sub.add_parser("search", parents=[common], help="rank upstream tools for a query")
    search.add_argument("query")
    search.add_argument("--load", action="store_true", help="start upstreams whose catalogs are not loaded")
    search.add_argument("--limit", type=int, default=8)
    search.add_argument("--json", action="store_true", help="print the tool's JSON result")
    search.add_argument("--explain", action="store_true", help="show how each result's score is made")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
        configure_logging(
            getattr(args, "log_level", None) or settings.log_level,
            getattr(args, "log_file", None) or settings.log_file,
        )
        config = load_config(getattr(args, "config", None))  # reads AGGREGATOR_CONFIG itself
    except ConfigError as exc:
        print(f"aggregator: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, OSError) as exc:
        print(f"aggregator: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if settings.max_result_bytes is not None:
        config = config.model_copy(update={"max_result_bytes": settings.max_result_bytes})
    commands: dict[str, Callable[[argparse.Namespace, AggregatorConfig, Settings], Awaitable[int]]] = {
        "serve": _serve,
        "list-upstreams": _list_upstreams,
        "search": _search,
    }
    try:
        return anyio.run(commands[args.command], args, config, settings, backend_options=_backend_options())
    except KeyboardInterrupt:
        return 130


def _backend_options() -> dict[str, Any]:
    """uvloop when installed: a proxy's latency is mostly event-loop turns."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return {}
    return {"use_uvloop": os.environ.get("AGGREGATOR_UVLOOP", "1") != "0"}


# ---------------------------------------------------------------- serve


async def _serve(args: argparse.Namespace, config: AggregatorConfig, settings: Settings) -> int:
    from aggregator.http import HttpConfigError, bind_socket, build_app, check_bind, serve_http
    from aggregator.server import AggregatorServer
    from aggregator.upstream.pool import UpstreamPool

    data_dir = resolve_data_dir(args.data_dir, settings)
    token = settings.token.get_secret_value() if settings.token else None
    sock = None
    if args.transport == "http":
        try:
            check_bind(args.host, token)
            sock = bind_socket(args.host, args.port)
        except HttpConfigError as exc:
            print(f"aggregator: {exc}", file=sys.stderr)
            return EXIT_USAGE
    log.info("starting", config=config.source, upstreams=len(config.upstreams), transport=args.transport)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_stop_on_signal, tg.cancel_scope)
        async with UpstreamPool.running(config) as pool:
            server = AggregatorServer(pool, data_dir=data_dir, max_result_bytes=config.max_result_bytes)
            async with server.running():
                if sock is None:
                    await _serve_stdio(server)
                else:
                    app = build_app(server, host=args.host, port=args.port, token=token, allowed_hosts=args.allow_host)
                    await serve_http(app, sock)
        tg.cancel_scope.cancel()
    return 0


async def _serve_stdio(server: Any) -> None:
    from aggregator.stdio import stdio_streams

    async with stdio_streams() as (read, write):
        await server.lowlevel.run(read, write, server.lowlevel.create_initialization_options())


async def _stop_on_signal(scope: anyio.CancelScope) -> None:
    """SIGTERM/SIGINT end the serve loop; the pool then stops every upstream's process group."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("stopping on signal", signal=signal.Signals(signum).name)
            scope.cancel()
            return


# ---------------------------------------------------------------- list-upstreams


async def _list_upstreams(args: argparse.Namespace, config: AggregatorConfig, settings: Settings) -> int:
    from aggregator.upstream.pool import UpstreamPool

    async with UpstreamPool.running(config) as pool:
        started = time.monotonic()
        if args.probe:
            await pool.start_all()
        rows = [_status_row(status) for status in pool.statuses()]
        elapsed = time.monotonic() - started
    if args.json:
        print(json.dumps({"config": config.source, "upstreams": rows}, indent=2, ensure_ascii=False))
    else:
        print(f"config: {config.source}")
        print(_table(rows, ["name", "transport", "state", "tools", "catalog_age", "handshake", "last_error"]))
        if args.probe:
            failed = [row for row in rows if row["state"] not in ("ready",)]
            print(f"\nprobed {len(rows)} upstreams in {elapsed:.2f}s; {len(rows) - len(failed)} ready")
            for row in failed:
                if row["stderr_tail"]:
                    print(f"\n--- {row['name']} stderr (last lines) ---")
                    print("\n".join(row["stderr_tail"]))
    if args.probe and any(row["state"] != "ready" for row in rows):
        return 1
    return 0


def _status_row(status: Any) -> dict[str, Any]:
    return {
        "name": status.name,
        "transport": status.transport,
        "state": status.state,
        "description": status.description,
        "tools": status.tool_count,
        "catalog_age": None if status.catalog_age is None else round(status.catalog_age, 1),
        "handshake": None if status.handshake_seconds is None else round(status.handshake_seconds, 3),
        "last_error": status.last_error,
        "stderr_tail": status.stderr_tail,
    }


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def cell(value: Any) -> str:
        text = "-" if value is None else (str(value).splitlines() or [""])[0]
        return text if len(text) <= 70 else text[:69] + "…"

    return render_table(columns, [[cell(row[c]) for c in columns] for row in rows])


# ---------------------------------------------------------------- search


async def _search(args: argparse.Namespace, config: AggregatorConfig, settings: Settings) -> int:
    from aggregator.catalog.search import ToolSearchIndex
    from aggregator.tools.catalog_search import format_explanation, format_results_table, search_tools
    from aggregator.upstream.pool import UpstreamPool

    async with UpstreamPool.running(config) as pool:
        index = ToolSearchIndex()
        for name in pool.upstream_names():
            index.set_server_metadata(name, *pool.metadata(name))
        index.attach(pool.store)
        result = await search_tools(
            pool,
            index,
            {"query": args.query, "limit": args.limit, "load": args.load},
            config.max_result_bytes,
        )
        payload = result.structured_content or {}
        explanation = format_explanation(index, args.query, payload) if args.explain else ""
    if args.json:
        print(json.dumps(payload, indent=2, ensure_ascii=False))
    elif result.is_error:
        print(payload.get("error", {}).get("message", "search failed"), file=sys.stderr)
    else:
        print(format_results_table(payload))
        if explanation:
            print(explanation)
    return EXIT_USAGE if result.is_error else 0


if __name__ == "__main__":  # pragma: no cover
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
