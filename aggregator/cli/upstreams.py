"""`aggregator list-upstreams`, `search`, `refresh`: the upstreams and their catalogs from a shell.

`list-upstreams` shows each upstream's state, tool count and snapshot (starting them only with
`--probe`); `search` ranks their tools as catalog_search_tools does; `refresh` starts upstreams,
rewrites their catalog snapshots and stops them. The parser and dispatch are `cli/commands.py`'s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from aggregator.cli.exit_codes import EXIT_USAGE
from aggregator.cli.progress import progress_line
from aggregator.config import AggregatorConfig
from aggregator.settings import Settings, data_dir_of
from aggregator.table import count, render_table

# ---------------------------------------------------------------- list-upstreams


async def list_upstreams(args: argparse.Namespace, config: AggregatorConfig, settings: Settings) -> int:
    from aggregator.upstream.oauth_providers import cli_authenticator
    from aggregator.upstream.pool import UpstreamPool

    data_dir = data_dir_of(args, settings)
    async with UpstreamPool.running(config, data_dir, authenticator=cli_authenticator(data_dir, settings)) as pool:
        started = time.monotonic()
        if args.probe:
            with progress_line("probing upstreams", len(pool.upstream_names())) as advance:
                await pool.start_all(on_done=advance)
        rows = [_status_row(status) for status in pool.statuses()]
        rows += [_broken_row(name, problem) for name, problem in config.broken.items()]
        elapsed = time.monotonic() - started
    if args.json:
        print(json.dumps({"config": config.source, "upstreams": rows}, indent=2, ensure_ascii=False))
    else:
        print(f"config: {config.source}")
        columns = ["name", "transport", "state", "tools", "catalog_age", "handshake", "snapshot", "last_error"]
        print(_table(rows, columns))
        if args.probe:
            failed = [row for row in rows if row["state"] not in ("ready",)]
            print(f"\nprobed {count(len(rows), 'upstream')} in {elapsed:.2f} s; {len(rows) - len(failed)} ready")
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
        "snapshot_tools": status.snapshot_tool_count,
        "snapshot_age": None if status.snapshot_age is None else round(status.snapshot_age, 1),
        "snapshot": _snapshot_cell(status),
    }


def _broken_row(name: str, problem: str) -> dict[str, Any]:
    """A row for an upstream left out because its entry cannot be used here."""
    empty = dict.fromkeys(("transport", "description", "tools", "catalog_age", "handshake", "snapshot_tools"))
    return {
        **empty,
        "name": name,
        "state": "disabled",
        "last_error": problem,
        "stderr_tail": [],
        "snapshot_age": None,
        "snapshot": None,
    }


def _snapshot_cell(status: Any) -> str | None:
    """`12 tools, 3h old`, or why there is no usable snapshot."""
    from aggregator.catalog.model import age_text

    if status.snapshot_tool_count is not None:
        return f"{count(status.snapshot_tool_count, 'tool')}, {age_text(status.snapshot_age or 0.0)} old"
    return f"ignored: {status.snapshot_note}" if status.snapshot_note else None


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """One line per row; the last column (an error, a note) is never cut, the others at 70 characters."""

    def cell(column: str, value: Any) -> str:
        if isinstance(value, int | float) and column in _UNITS:
            value = _UNITS[column](value)
        text = "-" if value is None else (str(value).splitlines() or [""])[0]
        return text if column == columns[-1] or len(text) <= 70 else text[:69] + "…"

    return render_table(columns, [[cell(c, row[c]) for c in columns] for row in rows])


def _age(seconds: float) -> str:
    from aggregator.catalog.model import age_text

    return age_text(seconds)


_UNITS: dict[str, Callable[[float], str]] = {"handshake": lambda s: f"{s:.2f} s", "catalog_age": _age}
"""Table cells shown with their unit (the JSON keeps plain numbers of seconds)."""


# ---------------------------------------------------------------- search


async def search(args: argparse.Namespace, config: AggregatorConfig, settings: Settings) -> int:
    from aggregator.catalog.search import ToolSearchIndex
    from aggregator.tools.catalog_search import format_explanation, format_results_table, search_tools
    from aggregator.upstream.oauth_providers import cli_authenticator
    from aggregator.upstream.pool import UpstreamPool

    data_dir = data_dir_of(args, settings)  # --load signs in as call does: with AGGREGATOR_BROWSER set
    async with UpstreamPool.running(config, data_dir, authenticator=cli_authenticator(data_dir, settings)) as pool:
        index = ToolSearchIndex()
        for name in pool.upstream_names():
            index.set_server_metadata(name, *pool.metadata(name))
        index.attach(pool.store)
        with progress_line("loading upstreams", None) if args.load else nullcontext():
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
        print(f"aggregator search: {payload.get('error', {}).get('message', 'search failed')}", file=sys.stderr)
    else:
        print(format_results_table(payload))
        if explanation:
            print(explanation)
    return EXIT_USAGE if result.is_error else 0


# ---------------------------------------------------------------- refresh


async def refresh(args: argparse.Namespace, config: AggregatorConfig, settings: Settings) -> int:
    """Start the named upstreams (default: all) concurrently, rewrite their snapshots, stop them."""
    from aggregator.upstream.oauth_providers import cli_authenticator
    from aggregator.upstream.pool import UpstreamPool

    names = _resolve_names(config, args.names)
    if isinstance(names, str):
        print(f"aggregator: {names}", file=sys.stderr)
        return EXIT_USAGE
    data_dir = data_dir_of(args, settings)
    async with UpstreamPool.running(config, data_dir, authenticator=cli_authenticator(data_dir, settings)) as pool:
        started = time.monotonic()
        with progress_line("refreshing upstreams", len(names)) as advance:
            outcome = await pool.start_all(names, on_done=advance)
        await pool.flush_snapshots()
        elapsed = time.monotonic() - started
        rows = [_refresh_row(pool, name, fault) for name, fault in outcome.items()]
    if args.json:
        print(json.dumps({"config": config.source, "data_dir": str(data_dir), "upstreams": rows}, indent=2))
    else:
        print(f"snapshots: {data_dir / 'catalogs'}")
        print(_table(rows, ["name", "state", "tools", "handshake", "snapshot"]))
        done = sum(1 for row in rows if row["written"])
        print(f"\nrefreshed {done} of {count(len(rows), 'snapshot')} in {elapsed:.2f} s")
    return 0 if all(row["written"] for row in rows) else 1


def _resolve_names(config: AggregatorConfig, names: list[str]) -> list[str] | str:
    """Configured names (matched ignoring case), or the message naming an unknown one."""
    by_folded = {name.casefold(): name for name in config.upstreams}
    unknown = [name for name in names if name.casefold() not in by_folded]
    if unknown:
        known = ", ".join(config.upstreams) or "none configured"
        return f"no upstream named {', '.join(unknown)} (known: {known})"
    return list(dict.fromkeys(by_folded[name.casefold()] for name in names)) or list(config.upstreams)


def _refresh_row(pool: Any, name: str, fault: Any) -> dict[str, Any]:
    status = pool.status(name)
    path = pool.snapshot_writes.get(name)
    if fault is not None:
        snapshot = f"not refreshed: {fault.message}"
    elif not pool.config.upstreams[name].snapshots:
        snapshot = "not written: snapshots: false"
    elif path is None:
        snapshot = "not written (see the warning above)"
    else:
        snapshot = f"written: {path.name}"
    return {
        "name": name,
        "state": "failed" if fault is not None else "ready",
        "tools": status.tool_count,
        "handshake": None if status.handshake_seconds is None else round(status.handshake_seconds, 3),
        "snapshot": snapshot,
        "written": fault is None and path is not None,
    }
