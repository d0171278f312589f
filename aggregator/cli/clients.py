"""`aggregator import`, `install`, `uninstall`: move a client's servers behind the aggregator.

Without ``--write`` it only shows the plan (what would be added, merged, renamed or skipped, and
why); with it the servers are merged into the config file, comments and order kept, after a
backup beside it. The config written is the one the aggregator would load (``--config`` >
``AGGREGATOR_CONFIG`` > ./aggregator.yaml > the user config file, created if none exists).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from aggregator.cli.exit_codes import EXIT_USAGE
from aggregator.cli.progress import progress_line
from aggregator.config import ConfigError, find_config_path, parse_config, user_config_file
from aggregator.config.client_files import (
    CLIENTS,
    ClientFile,
    ClientServers,
    Places,
    client_files,
    file_client,
    parse_document,
    read_client_file,
)
from aggregator.config.config_file import decode_text, read_text
from aggregator.config.importing import ImportPlan, everything_set, is_aggregator_entry, plan_import
from aggregator.config.installing import (
    Backup,
    aggregator_entry,
    backup_path,
    content_hash,
    find_backup,
    installed_path,
    merge_back,
    rewrite,
    servers_in,
)
from aggregator.config.load import written_servers
from aggregator.config.models import RESERVED_NAME
from aggregator.config.roundtrip import FileChanged, backup, current_text, merge_servers_yaml, write_atomic
from aggregator.files import write_atomically
from aggregator.log import REDACTED, redacted
from aggregator.settings import Settings
from aggregator.suggest import did_you_mean
from aggregator.table import count, render_table

__all__ = ["register"]

_T = TypeVar("_T")
ATTEMPTS = 3  # a file another program keeps rewriting: re-read and re-plan this many times, then refuse


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
    install.add_argument("--serve", action="store_true", help="a private `serve` for this client, not `connect`")
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
    files, problems = resolve_sources(args.sources, places)
    sources, unreadable = read_sources(files)
    problems += unreadable
    explicit = getattr(args, "config", None)
    try:
        target, section, plan, written, saved = _retried(lambda: import_once(explicit, places, sources, args.write))
    except ConfigError as exc:
        print(f"aggregator: config error: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, FileChanged) else EXIT_USAGE
    if args.json:
        payload = {
            "config": str(target),
            "section": section,
            "sources": [str(f.path) for f in files],
            "items": [
                {**asdict(item), "entry": shown_entry(item.entry), "carried": list(item.carried)} for item in plan.items
            ],
            "problems": problems,
            "written": written is not None,
            "backup": str(saved) if saved else None,
        }
        print(json.dumps(payload, indent=2, ensure_ascii=False))
    else:
        print(render_plan(plan, files, problems, args.write, saved))
    return 0


Imported = tuple[Path, str, ImportPlan, Path | None, Path | None]


def shown_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """An entry to import as it may be printed: the values of secret-looking headers and
    variables, and a client secret, masked (an `mcp-remote` entry's token comes out of the
    client's `env` into its header). What `--write` puts into the config is the entry itself."""
    shown = dict(entry)
    for key in ("headers", "env"):
        if isinstance(shown.get(key), dict):
            shown[key] = redacted(shown[key])
    if "client_secret" in shown:
        shown["client_secret"] = REDACTED
    return shown


def import_once(explicit: Path | None, places: Places, sources: list[ClientServers], write: bool) -> Imported:
    """(config, section, plan, written, backup) of importing `sources`; `FileChanged` if raced."""
    target = target_config(explicit, places)
    section, existing, text = existing_servers(target)
    plan = plan_import(existing, sources, target=str(target), section=section)
    written, saved = write_plan(plan, target, text) if write and plan.additions() else (None, None)
    return target, section, plan, written, saved


def _retried(edit: Callable[[], _T]) -> _T:
    """`edit()`, run again from a fresh read while another program changes a file meanwhile."""
    for _attempt in range(ATTEMPTS - 1):
        try:
            return edit()
        except FileChanged:
            continue
    return edit()


def write_plan(plan: ImportPlan, target: Path, text: str) -> tuple[Path, Path | None]:
    """Merge the plan's additions into `target` (checked before it replaces the file)."""
    if target.suffix.lower() == ".json":
        raise ConfigError(str(target), None, "import --write edits YAML configs only", "convert it to YAML first")
    new_text = merge_servers_yaml(text, str(target), plan.section, plan.additions())
    parse_config(new_text, str(target), environ=everything_set())  # never write a config we could not load
    expected = None if text == "" and not target.exists() else text
    saved = backup(target) if expected is not None else None
    try:
        write_atomic(target, new_text, expected=expected)
    except BaseException:
        if saved is not None:
            saved.unlink(missing_ok=True)
        raise
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
    code = _retrying(
        file, lambda: install_client(file, getattr(args, "config", None), places, args.dry_run, shared=not args.serve)
    )
    if code == 0 and not args.dry_run:
        print(_guard_line())
    return code


def _guard_line() -> str:
    """Build the C guard now, so the first session already runs it (docs/guard.md); what runs, and why."""
    from aggregator.upstream import guard_build

    if guard_build.mode() != "python":
        guard_build.build()
    choice = guard_build.choose(start_build=False)
    return f"guard: {'C' if choice.kind == 'c' else 'Python'} ({choice.reason})"


async def _uninstall(args: argparse.Namespace, settings: Settings) -> int:
    file = user_file(args.client, Places.here())
    return _retrying(file, lambda: uninstall_client(file))


class NotInstalled(Exception):
    """Uninstall without install's backup."""


def _retrying(file: ClientFile, edit: Callable[[], str]) -> int:
    """Print what `edit` did (retried while raced); its refusal as one line and an exit code."""
    try:
        print(_retried(edit))
        return 0
    except NotInstalled as exc:
        print(f"aggregator: {exc}", file=sys.stderr)
        return 1
    except FileChanged as exc:
        print(f"aggregator: {file.client}: is {file.client} running? {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:
        print(f"aggregator: not changing anything: {exc}", file=sys.stderr)
        return EXIT_USAGE


def install_client(
    file: ClientFile, explicit: Path | None, places: Places, dry_run: bool, *, shared: bool = True
) -> str:
    """Put `file`'s servers behind the aggregator; the line to print. `FileChanged` if raced.

    `shared`: the entry runs `aggregator connect` (the per-user service), else a private `serve`.
    """
    target = target_config(explicit, places)
    section, existing, config_text = existing_servers(target)
    original = current_text(file.path)
    source = read_client_file(file) if original is not None else ClientServers(file, {})
    if current_text(file.path) != original:
        raise FileChanged(file.path)
    before = installed_env(source)
    plan = plan_import(existing, [source], target=str(target), section=section, carried=before)
    keep = {
        item.original: source.servers[item.original]
        for item in plan.items
        if item.action == "skip" and item.note != "already the aggregator"
    }
    env = before | {name: value for item in plan.items for name, value in item.carried.items()}
    entry = aggregator_entry(file, target, shared=shared, env=env)
    if original is not None and servers_in(parse_document(original, file), file) == {RESERVED_NAME: entry, **keep}:
        return f"{file.client}: already installed in {file.path}; nothing to change"
    new_text = rewrite(original or "", file, keep, entry)
    if dry_run:
        shown = render_plan(plan, [file], [], False, None, hint="install would add them to")
        masked = aggregator_entry(file, target, shared=shared, env=dict.fromkeys(env, REDACTED))
        return f"{shown}\n\nwould write {file.path}:\n{rewrite(original or '', file, redacted(keep), masked)}"
    if plan.additions():
        write_plan(plan, target, config_text)
    elif not target.exists():
        write_atomic(target, "upstreams: {}\n", expected=None)
    saved = _write_client(file, original, new_text)
    moved = len(plan.items) - len(keep)
    return (
        f"{file.client}: {file.path} now starts the aggregator with {target}; {count(moved, 'server')} moved behind it"
        + (f", {len(keep)} kept in the client ({', '.join(keep)}: see import)" if keep else "")
        + f". Original kept as {saved}; undo with: aggregator uninstall {file.client}"
        + (_shared_env_note(env, file.client) if shared else "")
    )


def _shared_env_note(env: dict[str, str], client: str) -> str:
    """The shared service has the environment of the `connect` that started it: variables carried into this
    client's entry reach it only when this client starts it (docs/import-secrets.md)."""
    if not env:
        return ""
    names = ", ".join(sorted(env))
    them = "it" if len(env) == 1 else "them"
    return (
        f"\nnote: the aggregator entry's env holds {names}; the shared service sees {them} only if {client} starts "
        f"it (stop a running one with: aggregator service stop; or use: aggregator install {client} --serve)"
    )


def installed_env(source: ClientServers) -> dict[str, str]:
    """The env of the aggregator's entry in the client's file: the values an earlier install carried there
    (or the user put there). A new install keeps them, and adds what the servers it imports refer to."""
    entry = source.servers.get(RESERVED_NAME)
    env = entry.get("env") if isinstance(entry, dict) and is_aggregator_entry(entry) else None
    return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}


def _write_client(file: ClientFile, original: str | None, new_text: str) -> Path:
    """Write install's `new_text` over `original` with its backup beside it; the backup's path.

    The backup holds what uninstall should give back: the file before the first install, or,
    when the file was edited after an earlier install, that install undone on the latest edits
    (never the older original over newer edits).
    """
    previous = find_backup(file.path, original)
    before, absent = _before_install(file, original, previous)
    installed_hash = content_hash(new_text)
    saved, record = backup_path(file.path, installed_hash, absent), installed_path(file.path, installed_hash)
    kept = {path: path.read_bytes() for path in (saved, record) if path.exists()}
    write_atomically(saved, before)
    write_atomically(record, new_text.encode("utf-8"))
    try:
        write_atomic(file.path, new_text, expected=original)
    except BaseException:
        for path in (saved, record):
            if path in kept:
                write_atomically(path, kept[path])
            else:
                path.unlink(missing_ok=True)
        raise
    if previous is not None:
        for path in (previous.path, installed_path(file.path, previous.installed_hash)):
            if path not in (saved, record):
                path.unlink(missing_ok=True)
    return saved


def _before_install(file: ClientFile, original: str | None, previous: Backup | None) -> tuple[bytes, bool]:
    """(the bytes uninstall should restore, whether that is "no file")."""
    if previous is None:
        if original is None:
            return b"", True
        raw = file.path.read_bytes()
        try:
            unchanged = decode_text(raw) == original
        except UnicodeDecodeError:
            unchanged = False
        if not unchanged:
            raise FileChanged(file.path)
        return raw, False
    older = previous.path.read_bytes()
    if original is not None and content_hash(original) == previous.installed_hash:
        return older, previous.absent  # untouched since that install: its original still stands
    if original is None:
        return older, previous.absent  # the file was deleted since: the original is all there is
    merged = merge_back(older.decode("utf-8-sig"), previous.installed(file.path), original, file)
    return merged.encode("utf-8"), False


def uninstall_client(file: ClientFile) -> str:
    """Undo install: the original back if the file is as install wrote it, else a three-way merge."""
    current = current_text(file.path)
    saved = find_backup(file.path, current)
    if saved is None:
        raise NotInstalled(f"{file.client}: no backup beside {file.path}: install did not write it")
    original = saved.path.read_bytes()
    if current is None or content_hash(current) == saved.installed_hash:
        if saved.absent:
            _remove(file.path, current)
        else:
            write_atomic(file.path, original, expected=current)
        message = f"{file.client}: {file.path} restored as it was before install"
    else:
        merged = merge_back(original.decode("utf-8-sig"), saved.installed(file.path), current, file)
        write_atomic(file.path, merged, expected=current)
        message = f"{file.client}: {file.path} changed since install: its servers are back, later changes kept"
    saved.path.unlink(missing_ok=True)
    installed_path(file.path, saved.installed_hash).unlink(missing_ok=True)
    return message


def _remove(path: Path, expected: str | None) -> None:
    """Delete the file install created (through a symlink, the link left as it was), if unchanged."""
    if expected is None:
        return
    if current_text(path) != expected:
        raise FileChanged(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.realpath(path))
