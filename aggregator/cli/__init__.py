"""The command line: `main` parses and dispatches; one module per group of subcommands."""

from aggregator import sdk
from aggregator.startup import settled_imports

with settled_imports():
    sdk.defer_wire_model_builds()  # before anything imports the SDK
    from aggregator.cli.main import main

__all__ = ["main"]
