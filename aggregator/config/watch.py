"""Watching the config file: a change (or SIGHUP) loads it again and hands it on.

A plain poll of the file's content fingerprint (no platform watcher to install or to miss an
editor's rename-into-place), plus SIGHUP where the platform has it. A broken edit is logged as its
one-line `ConfigError` and the running config stays; the next good save applies.
"""

from __future__ import annotations

import hashlib
import signal
from collections.abc import Callable
from pathlib import Path

import anyio

from aggregator.config.errors import ConfigError
from aggregator.config.load import load_config
from aggregator.config.models import AggregatorConfig
from aggregator.log import get_logger

__all__ = ["POLL_SECONDS", "watch_config"]

log = get_logger(__name__)

POLL_SECONDS = 0.5
SETTLE_SECONDS = 0.2  # an editor may write in steps: read once it has been quiet this long


def _fingerprint(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


async def watch_config(path: Path, apply: Callable[[AggregatorConfig], object], *, poll: float = POLL_SECONDS) -> None:
    """Call `apply` with the newly loaded config after every change of `path`, until cancelled."""
    seen = _fingerprint(path)

    def reload(reason: str) -> None:
        nonlocal seen
        seen = _fingerprint(path)
        try:
            config = load_config(path)
            apply(config)  # may refuse it too: a ConfigError about what is running (names claimed twice)
        except ConfigError as exc:
            log.error("config reload failed; the running config stays", reason=reason, error=str(exc))
            return
        log.info("config reloaded", reason=reason, config=str(path))
        for name, problem in config.broken.items():
            log.warning("upstream disabled: its entry cannot be used here", upstream=name, problem=problem)

    async with anyio.create_task_group() as tg:
        if hasattr(signal, "SIGHUP"):
            tg.start_soon(_on_sighup, reload)
        while True:
            await anyio.sleep(poll)
            current = _fingerprint(path)
            if current is None or current == seen:
                continue
            await anyio.sleep(SETTLE_SECONDS)
            reload("file changed")


async def _on_sighup(reload: Callable[[str], None]) -> None:
    with anyio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            reload("SIGHUP")
