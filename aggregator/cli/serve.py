"""`aggregator serve`: the pool, the aggregator's server, and the client side it is served on.

Over stdio (the default), streamable HTTP (`--transport http`, with its banner on stderr) or the
per-user service's socket (`--transport socket`, `cli/service.py`). SIGTERM/SIGINT end the serving;
the pool then stops every upstream in order. The parser and the dispatch stay in `cli/commands.py`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from aggregator import sdk
from aggregator.cli.exit_codes import EXIT_USAGE
from aggregator.config import AggregatorConfig, ConfigError
from aggregator.heap import release_freed_memory
from aggregator.log import get_logger
from aggregator.settings import Settings, resolve_data_dir
from aggregator.startup import settled_imports

log = get_logger(__name__)


async def serve(args: argparse.Namespace, config: AggregatorConfig, settings: Settings) -> int:
    with settled_imports():  # the server's modules, frozen with the rest (issue 24: start-up)
        from aggregator.proxy.server import AggregatorServer
        from aggregator.upstream.pool import UpstreamPool
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):  # as the server side does (proxy/server.py)
        sdk.untraced_upstream_requests()

    data_dir = resolve_data_dir(args.data_dir, settings)
    token = settings.token.get_secret_value() if settings.token else None
    sock = None
    if args.transport == "http":  # uvicorn and starlette's app only when serving HTTP
        from aggregator.downstream.http import (
            HttpConfigError,
            HttpLimits,
            bind_socket,
            build_app,
            check_bind,
            serve_http,
        )

        try:
            check_bind(args.host, token)
            sock = bind_socket(args.host, args.port)
        except HttpConfigError as exc:
            print(f"aggregator: {exc}", file=sys.stderr)
            return EXIT_USAGE
    claim = None
    if args.transport == "socket":  # the per-user service's module only when serving as it
        from aggregator.cli import service

        claim = service.claim_service(args, config.source)
    if isinstance(claim, str):
        print(f"aggregator: {claim}", file=sys.stderr)
        return 0
    if sock is not None:
        print(_http_banner(sock, token), file=sys.stderr, flush=True)
    log.info("starting", config=config.source, upstreams=len(config.upstreams), transport=args.transport)
    serving = anyio.CancelScope()  # a signal ends the serving only: the pool then stops its upstreams in order
    status = 0
    async with anyio.create_task_group() as tg:
        tg.start_soon(_stop_on_signal, serving)
        watch = Path(config.source) if Path(config.source).is_file() else None  # not the built-in default
        async with UpstreamPool.running(config, data_dir, watch=watch) as pool:
            try:
                server = AggregatorServer(
                    pool,
                    data_dir=data_dir,
                    max_result_bytes=config.max_result_bytes,
                    search_max_k=settings.search_max_k,
                )
            except ConfigError as exc:  # names two upstreams claim (known from their snapshots)
                print(f"aggregator: config error: {exc}", file=sys.stderr)
                status = EXIT_USAGE
                tg.cancel_scope.cancel()
                await anyio.lowlevel.checkpoint()  # the cancellation unwinds the pool and the task group
            async with server.running():
                release_freed_memory()  # what the imports and the start freed: 0.x MB the C heap would keep
                with serving:
                    if claim is not None:
                        await _run_service(server, claim, settings)
                    elif sock is None:
                        await _serve_stdio(server, settings)
                    else:
                        limits = HttpLimits(
                            max_sessions=settings.http_max_sessions,
                            max_sessions_per_client=settings.http_max_sessions_per_client,
                            session_idle_seconds=settings.http_session_idle_seconds,
                            header_timeout=settings.http_header_timeout,
                            body_timeout=settings.http_body_timeout,
                        )
                        app = build_app(
                            server,
                            host=args.host,
                            port=args.port,
                            token=token,
                            allowed_hosts=args.allow_host,
                            limits=limits,
                        )
                        await serve_http(app, sock, limits=limits)
        tg.cancel_scope.cancel()
    return status


def _http_banner(sock: Any, token: str | None) -> str:
    """Where clients connect, and where the bearer token comes from (never the token itself)."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    auth = (
        "clients send 'Authorization: Bearer <the value of AGGREGATOR_TOKEN>'"
        if token
        else "no token required (set AGGREGATOR_TOKEN to require one)"
    )
    return f"aggregator: serving MCP at http://{shown}:{port}/mcp; {auth}; Ctrl-C stops"


async def _run_service(server: Any, claim: Any, settings: Settings) -> None:
    from aggregator.cli import service

    await service.run_service(server, claim, settings)


async def _serve_stdio(server: Any, settings: Settings) -> None:
    from aggregator.downstream.stdio import StdioLimits, stdio_streams

    limits = StdioLimits(max_in_flight=settings.max_in_flight, drain_seconds=settings.drain_seconds)
    async with stdio_streams(limits, lanes=server.raw.lane) as (read, write):
        await server.lowlevel.run(read, write, server.lowlevel.create_initialization_options())


async def _stop_on_signal(scope: anyio.CancelScope) -> None:
    """SIGTERM/SIGINT end the serve loop; the pool then stops every upstream's process group."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("stopping on signal", signal=signal.Signals(signum).name)
            scope.cancel()
            return
