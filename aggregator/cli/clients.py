"""`aggregator import`, `install`, `uninstall`: move a client's servers behind the aggregator.

Without ``--write`` it only shows the plan (what would be added, merged, renamed or skipped, and
why); with it the servers are merged into the config file, comments and order kept, after a
backup beside it. The config written is the one the aggregator would load (``--config`` >
``AGGREGATOR_CONFIG`` > ./aggregator.yaml > the user config file, created if none exists).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from aggregator.cli.progress import progress_line
from aggregator.config import ConfigError, find_config_path, parse_config, user_config_file
from aggregator.config.clients import (
    CLIENTS,
    ClientFile,
    ClientServers,
    Places,
    client_files,
    file_client,
    parse_document,
    read_client_file,
)
from aggregator.config.files import read_text
from aggregator.config.importing import ImportPlan, everything_set, plan_import
from aggregator.config.installing import (
    aggregator_entry,
    backup_path,
    content_hash,
    find_backup,
    restore_text,
    rewrite,
    servers_in,
)
from aggregator.config.load import written_servers
from aggregator.config.models import RESERVED_NAME
from aggregator.config.roundtrip import backup, merge_servers_yaml, write_atomic
from aggregator.settings import Settings
from aggregator.suggest import did_you_mean
from aggregator.table import count, render_table

__all__ = ["register"]

EXIT_USAGE = 2


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    imp = sub.add_parser(
        "import",
        parents=[common],
        help="show (or --write) the servers of installed MCP clients as aggregator upstreams",
        description=f"Clients: {', '.join(CLIENTS)}; or give config files. Without any, every client found.",
    )
    imp.add_argument("sources", nargs="*", metavar="CLIENT|FILE", help="a client name or a config file (default: all)")
    imp.add_argument("--write", action="store_true", help="merge them into the config file (a backup is kept)")
    imp.add_argument("--json", action="store_true", help="print the plan as JSON")
    imp.set_defaults(standalone=_import)

    install = sub.add_parser(
        "install",
        parents=[common],
        help="put a client's servers behind one aggregator entry (imports them first; backs the file up)",
        description="Import the client's servers into the aggregator's config, then leave one aggregator entry "
        "in the client's config (the original is kept beside it; undo with: aggregator uninstall CLIENT).",
    )
    install.add_argument("client", choices=CLIENTS, help=f"one of {', '.join(CLIENTS)}")
    install.add_argument("--dry-run", action="store_true", help="show what would change; write nothing")
    install.set_defaults(standalone=_install)

    uninstall = sub.add_parser(
        "uninstall",
        parents=[common],
        help="restore a client's config from install's backup",
        description="Give the client its servers back from install's backup; changes made since are kept.",
    )
    uninstall.add_argument("client", choices=CLIENTS, help=f"one of {', '.join(CLIENTS)}")
    uninstall.set_defaults(standalone=_uninstall)


# ---------------------------------------------------------------- the config being written


def target_config(explicit: Path | None, places: Places) -> Path:
    """The config file the aggregator would load, or the user config file when there is none.

    A ``--config`` path that does not exist yet is the file to create.
    """
    if explicit is not None and not explicit.expanduser().exists():
        path = explicit.expanduser()
        return path if path.is_absolute() else places.cwd / path
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
    section, servers = written_servers(text, str(path))
    return section, servers, text


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


def unknown_sources(words: list[str], places: Places) -> str | None:
    """One line naming the first word that is neither a client nor a file (a typo: exit 2), or None."""
    for word in words:
        path = Path(word).expanduser()
        if word not in CLIENTS and not (path if path.is_absolute() else places.cwd / path).is_file():
            return (
                f"{word!r} is neither a client nor a file{did_you_mean(word, CLIENTS)}; clients: {', '.join(CLIENTS)}"
            )
    return None


def read_sources(files: list[ClientFile]) -> tuple[list[ClientServers], list[str]]:
    read: list[ClientServers] = []
    problems: list[str] = []
    with progress_line("reading client configs", len(files)) as advance:
        for file in files:
            try:
                read.append(read_client_file(file))
            except ConfigError as exc:
                problems.append(f"{file.path}: not read ({exc.problem}); fix it in {file.client} first")
            advance(file.label)
    return read, problems


# ---------------------------------------------------------------- the command


async def _import(args: argparse.Namespace, settings: Settings) -> int:
    places = Places.here()
    unknown = unknown_sources(args.sources, places)
    if unknown:
        print(f"aggregator import: {unknown}", file=sys.stderr)
        return EXIT_USAGE
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


def render_plan(
    plan: ImportPlan,
    files: list[ClientFile],
    problems: list[str],
    wrote: bool,
    saved: Path | None,
    hint: str = "run with --write to add them to",
) -> str:
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
        lines.append(f"{summary}; {hint} {plan.target}")
    return "\n".join(lines)


# ---------------------------------------------------------------- install / uninstall


def user_file(client: str, places: Places) -> ClientFile:
    """The client's user-level config file (the one install edits)."""
    return next(f for f in client_files(places, (client,)) if f.scope == "user")


async def _install(args: argparse.Namespace, settings: Settings) -> int:
    places = Places.here()
    file = user_file(args.client, places)
    try:
        target = target_config(getattr(args, "config", None), places)
        section, existing, config_text = existing_servers(target)
        original = read_text(file.path) if file.path.exists() else None
        source = read_client_file(file) if original is not None else ClientServers(file, {})
    except ConfigError as exc:
        print(f"aggregator: not changing anything: {exc}", file=sys.stderr)
        return EXIT_USAGE
    plan = plan_import(existing, [source], target=str(target), section=section)
    keep = {
        item.original: source.servers[item.original]
        for item in plan.items
        if item.action == "skip" and item.note != "already the aggregator"
    }
    entry = aggregator_entry(file, target)
    if original is not None and servers_in(parse_document(original, file), file) == {RESERVED_NAME: entry, **keep}:
        print(f"{file.client}: already installed in {file.path}; nothing to change")
        return 0
    new_text = rewrite(original or "", file, keep, entry)
    if args.dry_run:
        print(render_plan(plan, [file], [], False, None, hint="install would add them to"))
        print(f"\nwould write {file.path}:\n{new_text}")
        return 0
    if plan.additions():
        write_plan(plan, target, config_text)
    elif not target.exists():
        write_atomic(target, "upstreams: {}\n")
    saved = _keep_original(file.path, content_hash(new_text))
    write_atomic(file.path, new_text)
    moved = len(plan.items) - len(keep)
    print(
        f"{file.client}: {file.path} now starts the aggregator with {target}; {count(moved, 'server')} moved behind it"
        + (f", {len(keep)} kept in the client ({', '.join(keep)}: see import)" if keep else "")
        + f". Original kept as {saved}; undo with: aggregator uninstall {file.client}"
    )
    return 0


def _keep_original(path: Path, installed_hash: str) -> Path:
    """The first install's backup holds the original; a later install only renames it (new hash)."""
    previous = find_backup(path)
    if previous is not None:
        renamed = backup_path(path, installed_hash, previous.absent)
        previous.path.rename(renamed)
        return renamed
    saved = backup_path(path, installed_hash, not path.exists())
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        shutil.copy2(path, saved)
    else:
        saved.write_bytes(b"")
    return saved


async def _uninstall(args: argparse.Namespace, settings: Settings) -> int:
    file = user_file(args.client, Places.here())
    saved = find_backup(file.path)
    if saved is None:
        print(f"aggregator: {args.client}: no backup beside {file.path}: install did not write it", file=sys.stderr)
        return 1
    current = file.path.read_bytes() if file.path.exists() else None
    unchanged = current is None or content_hash(current.decode("utf-8", "replace")) == saved.installed_hash
    if unchanged:
        if saved.absent:
            file.path.unlink(missing_ok=True)
            saved.path.unlink()
        else:
            os.replace(saved.path, file.path)
        print(f"{file.client}: {file.path} restored as it was before install")
        return 0
    try:
        merged = restore_text(read_text(file.path), saved.path.read_text(encoding="utf-8-sig"), file)
    except ConfigError as exc:
        print(f"aggregator: not changing anything: {exc}", file=sys.stderr)
        return EXIT_USAGE
    write_atomic(file.path, merged)
    saved.path.unlink()
    print(f"{file.client}: {file.path} changed since install: its servers are back, later changes kept")
    return 0
