"""`aggregator import`: bring the servers of installed MCP clients into aggregator.yaml.

Without ``--write`` it only shows the plan (what would be added, merged, renamed or skipped, and
why); with it the servers are merged into the config file, comments and order kept, after a
backup beside it. The config written is the one the aggregator would load (``--config`` >
``AGGREGATOR_CONFIG`` > ./aggregator.yaml > the user config file, created if none exists).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from aggregator.config import ConfigError, find_config_path, parse_config, user_config_file
from aggregator.config.clients import (
    CLIENTS,
    ClientFile,
    ClientServers,
    Places,
    client_files,
    file_client,
    read_client_file,
)
from aggregator.config.files import read_text
from aggregator.config.importing import ImportPlan, everything_set, plan_import
from aggregator.config.roundtrip import backup, merge_servers_yaml, write_atomic
from aggregator.config.yamlfile import parse_yaml
from aggregator.settings import Settings
from aggregator.table import render_table

__all__ = ["register"]

EXIT_USAGE = 2
_SECTIONS = ("upstreams", "mcpServers", "servers")


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    imp = sub.add_parser(
        "import",
        parents=[common],
        help="show (or --write) the servers of installed MCP clients as aggregator upstreams",
        description=f"Clients: {', '.join(CLIENTS)}; or give config files. Without any, every client found.",
    )
    imp.add_argument("sources", nargs="*", metavar="CLIENT|FILE")
    imp.add_argument("--write", action="store_true", help="merge them into the config file (a backup is kept)")
    imp.add_argument("--json", action="store_true", help="print the plan as JSON")
    imp.set_defaults(standalone=_import)


# ---------------------------------------------------------------- the config being written


def target_config(explicit: Path | None, places: Places) -> Path:
    """The config file the aggregator would load, or the user config file when there is none."""
    found = find_config_path(explicit, places.environ or os.environ, places.cwd)
    return found if found is not None else user_config_file()


def existing_servers(path: Path) -> tuple[str, dict[str, Any], str]:
    """(section, servers as written, text) of the config at `path`; empty when it does not exist.

    The file must be a valid config (variables aside): nothing is written into a broken one.
    """
    if not path.exists():
        return "upstreams", {}, ""
    text = read_text(path)
    parse_config(text, str(path), environ=everything_set())
    data = parse_yaml(text, str(path))[0] if path.suffix.lower() != ".json" else json.loads(text or "{}")
    data = data if isinstance(data, dict) else {}
    section = next((key for key in _SECTIONS if key in data), "upstreams")
    return section, dict(data.get(section) or {}), text


# ---------------------------------------------------------------- sources


def resolve_sources(words: list[str], places: Places) -> tuple[list[ClientFile], list[str]]:
    """Client names → their files that exist; other words → files. Unknown words are problems."""
    files: list[ClientFile] = []
    problems: list[str] = []
    for word in words or list(CLIENTS):
        if word in CLIENTS:
            files += [f for f in client_files(places, (word,)) if f.path.is_file()]
            continue
        path = Path(word).expanduser()
        path = path if path.is_absolute() else places.cwd / path
        if not path.is_file():
            problems.append(f"{word}: neither a client ({', '.join(CLIENTS)}) nor a file")
            continue
        try:
            files.append(file_client(path))
        except ConfigError as exc:
            problems.append(f"{path}: not read: {exc.problem}")
    return files, problems


def read_sources(files: list[ClientFile]) -> tuple[list[ClientServers], list[str]]:
    read: list[ClientServers] = []
    problems: list[str] = []
    for file in files:
        try:
            read.append(read_client_file(file))
        except ConfigError as exc:
            problems.append(f"{file.path}: not read ({exc.problem}); fix it in {file.client} first")
    return read, problems


# ---------------------------------------------------------------- the command


async def _import(args: argparse.Namespace, settings: Settings) -> int:
    places = Places.here()
    try:
        target = target_config(getattr(args, "config", None), places)
        section, existing, text = existing_servers(target)
    except ConfigError as exc:
        print(f"aggregator: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    files, problems = resolve_sources(args.sources, places)
    sources, unreadable = read_sources(files)
    problems += unreadable
    plan = plan_import(existing, sources, target=str(target), section=section)
    written: Path | None = None
    saved: Path | None = None
    if args.write and plan.additions():
        try:
            written, saved = write_plan(plan, target, text)
        except ConfigError as exc:
            print(f"aggregator: config error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    if args.json:
        payload = {
            "config": str(target),
            "section": section,
            "sources": [str(f.path) for f in files],
            "items": [{k: v for k, v in asdict(item).items()} for item in plan.items],
            "problems": problems,
            "written": written is not None,
            "backup": str(saved) if saved else None,
        }
        print(json.dumps(payload, indent=2, ensure_ascii=False))
    else:
        print(render_plan(plan, files, problems, args.write, saved))
    return 0


def write_plan(plan: ImportPlan, target: Path, text: str) -> tuple[Path, Path | None]:
    """Merge the plan's additions into `target` (checked before it replaces the file)."""
    if target.suffix.lower() == ".json":
        raise ConfigError(str(target), None, "import --write edits YAML configs only", "convert it to YAML first")
    new_text = merge_servers_yaml(text, str(target), plan.section, plan.additions())
    parse_config(new_text, str(target), environ=everything_set())  # never write a config we could not load
    saved = backup(target) if target.exists() else None
    write_atomic(target, new_text)
    return target, saved


def render_plan(plan: ImportPlan, files: list[ClientFile], problems: list[str], wrote: bool, saved: Path | None) -> str:
    lines = [f"read {f.label}: {f.path}" for f in files] or ["no client config found"]
    rows = [[item.action, item.name, item.client, item.note] for item in plan.items]
    if rows:
        lines += ["", render_table(["action", "name", "from", "note"], rows)]
    lines += [f"problem: {problem}" for problem in problems]
    counts = plan.counts()
    summary = (
        f"{counts['add']} to add, {counts['rename']} renamed, {counts['same']} already there, {counts['skip']} skipped"
    )
    lines.append("")
    if not plan.additions():
        lines.append(f"{summary}; nothing to write into {plan.target}")
    elif wrote:
        kept = f" (backup: {saved})" if saved else " (a new file)"
        lines.append(f"{summary}; written into {plan.target}{kept}")
    else:
        lines.append(f"{summary}; run with --write to add them to {plan.target}")
    return "\n".join(lines)
