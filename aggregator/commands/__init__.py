"""Subcommands beyond serve/list-upstreams/search, one module per group.

Each module's ``register(sub, common)`` adds its subparsers and sets ``handler`` (an async
``(args, config, settings) -> exit code`` run with the loaded config) or ``standalone`` (an async
``(args, settings) -> exit code`` that reads the config itself, e.g. to report on a broken one).
"""

from __future__ import annotations

import argparse
from typing import Any

from aggregator.commands import calls, clients, doctor

__all__ = ["register_commands"]


def register_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    for module in (calls, clients, doctor):
        module.register(sub, common)
