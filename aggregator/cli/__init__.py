"""The command line: `main` parses and dispatches; one module per group of subcommands."""

from aggregator.cli.main import main

__all__ = ["main"]
