"""The command line: `main` parses and dispatches; one module per group of subcommands.

`aggregator connect` is dispatched here, before the CLI (and with it the SDK) is imported:
a client pays for the standard library only (`aggregator.downstream.connect`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

__all__ = ["main"]

_VALUED = ("--config", "--log-level", "--log-file")  # options of every command that take a value


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    at = _command_index(words)
    if at is not None and words[at] == "connect":
        from aggregator.downstream.connect import main as connect_main

        return connect_main(words[:at] + words[at + 1 :])
    from aggregator.startup import settled_imports

    with settled_imports():  # no garbage collection over what the CLI imports (issue 24, start-up)
        if at is not None:  # a command will run (not `--version` or help, which import no SDK at all)
            from aggregator import sdk

            serving = words[at] == "serve"
            if serving:  # before pydantic is imported: no importlib.metadata without pydantic plugins
                from aggregator.sdk import deferred

                deferred.defer_package_metadata()
                deferred.defer_pickle()  # before structlog, which binds one name of it
            sdk.defer_wire_model_builds()  # before anything imports the SDK
            if serving:  # it builds no MCPServer: keep that package and cryptography out
                deferred.defer_mcpserver()
                deferred.defer_http_clients()  # httpx2 with the first remote upstream (upstream/http_transports.py)
                if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):  # serve then makes no span (sdk/__init__)
                    deferred.defer_tracing()
                if not deferred.defer_http_server():  # starlette and the HTTP app with --transport http only
                    deferred.import_sse_without_uvicorn()  # else at least no uvicorn (downstream/http.py)
        from aggregator.cli.commands import main as cli_main

    return cli_main(argv)


def _command_index(words: list[str]) -> int | None:
    """Where the subcommand is: the first word that is neither an option nor an option's value."""
    skip = False
    for index, word in enumerate(words):
        if skip:
            skip = False
        elif word in _VALUED:
            skip = True
        elif not word.startswith("-"):
            return index
    return None
