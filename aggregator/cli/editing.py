"""`aggregator init`, `add NAME -- COMMAND ARGS…` / `add NAME URL`, `remove NAME`: the config from a shell.

The file edited is the one the aggregator loads (``--config`` > ``AGGREGATOR_CONFIG`` >
./aggregator.yaml > the user config file, which `init` and a first `add` create). Comments and order
are kept; the new text must load before it replaces the file, and a file changed by someone else
while we edited it is left alone (run the command again).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from aggregator.cli.clients import existing_servers, read_sources, resolve_sources, target_config, write_plan
from aggregator.cli.doctor import command_problem
from aggregator.cli.exit_codes import EXIT_USAGE
from aggregator.config import ConfigError, parse_config, user_config_file
from aggregator.config.client_files import CLIENTS, Places
from aggregator.config.config_file import read_text
from aggregator.config.importing import everything_set, plan_import
from aggregator.config.roundtrip import write_atomic
from aggregator.config.yaml_edits import STARTER, add_server, check_name, entry_from_words, remove_server, server_key
from aggregator.settings import Settings
from aggregator.suggest import did_you_mean

__all__ = ["register"]


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    init = sub.add_parser(
        "init",
        parents=[common],
        help="create a commented starter config (and offer to import your clients' servers)",
        description=f"Write a commented starter config at the user config path ({user_config_file()}), or "
        "at --config. On a terminal it offers to import the servers your MCP clients already have.",
    )
    choice = init.add_mutually_exclusive_group()
    choice.add_argument(
        "--import", dest="import_servers", action="store_true", default=None, help="import, no question"
    )
    choice.add_argument("--no-import", dest="import_servers", action="store_false", help="do not import; no question")
    init.set_defaults(standalone=_init)

    add = sub.add_parser(
        "add",
        parents=[common],
        help="add an upstream: add NAME -- COMMAND [ARG...], or add NAME URL",
        description="Add an upstream to the config, comments and order kept. A local server: "
        "`aggregator add git -- uvx mcp-server-git --repository .` (relative paths become absolute). "
        "A remote one: `aggregator add docs https://example.com/mcp`.",
    )
    add.add_argument("name", help="its name (letters, digits, - and _), e.g. git")
    add.add_argument("words", nargs="+", metavar="COMMAND [ARG...] | URL", help="what starts it, or its URL")
    add.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="an environment variable for it")
    add.add_argument("--description", help="what it is for (searchable before the server starts)")
    add.add_argument("--replace", action="store_true", help="replace an entry of the same name")
    add.set_defaults(standalone=_add)

    remove = sub.add_parser(
        "remove",
        parents=[common],
        help="remove an upstream from the config",
        description="Remove one upstream's entry from the config; every other line stays as written.",
    )
    remove.add_argument("name", help="the upstream's name (see: aggregator list-upstreams)")
    remove.set_defaults(standalone=_remove)


# ---------------------------------------------------------------- init


async def _init(args: argparse.Namespace, settings: Settings) -> int:
    places = Places.here()
    explicit: Path | None = getattr(args, "config", None)
    target = (explicit.expanduser() if explicit else user_config_file()).absolute()
    if target.exists():
        print(f"{target} already exists; nothing changed. Add servers with: aggregator add NAME -- COMMAND")
        return 0
    if target.suffix.lower() == ".json":
        print(f"aggregator init: {target}: init writes YAML; give a .yaml path", file=sys.stderr)
        return EXIT_USAGE
    write_atomic(target, STARTER, expected=None)  # refused if someone created it meanwhile
    print(f"wrote {target}")
    files, _ = resolve_sources([], places)
    sources, _ = read_sources(files)
    plan = plan_import({}, sources, target=str(target), section="upstreams")
    found = plan.additions()
    if found and _wants_import(args.import_servers, len(found), sorted({s.file.client for s in sources})):
        write_plan(plan, target, STARTER)
        print(f"imported {_count(len(found), 'server')}: {', '.join(found)}")
    elif found:
        print(f"your clients have {_count(len(found), 'server')}; import them with: aggregator import --write")
    print(
        "next: aggregator add NAME -- COMMAND [ARG...]  (or add NAME URL), then aggregator install CLIENT "
        f"({', '.join(CLIENTS[:4])})"
    )
    return 0


def _wants_import(choice: bool | None, count: int, clients: list[str]) -> bool:
    """--import / --no-import, else ask on a terminal (no answer or no terminal: do not import)."""
    if choice is not None or not sys.stdin.isatty():
        return bool(choice)
    try:
        answer = input(f"import {_count(count, 'server')} from {', '.join(clients)}? [Y/n] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("", "y", "yes")


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


# ---------------------------------------------------------------- add / remove


async def _add(args: argparse.Namespace, settings: Settings) -> int:
    places = Places.here()
    try:
        check_name(args.name)
        env = dict(_pair(word) for word in args.env)
        entry = entry_from_words(args.words, places.cwd, env=env)
    except ValueError as exc:
        print(f"aggregator add: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.description:
        entry["description"] = args.description
    try:
        target = _yaml_target(getattr(args, "config", None), places)
        section, existing, text = existing_servers(target)
        taken = server_key(args.name, existing)
        if taken is not None and not args.replace:
            print(
                f"aggregator add: {target} already has an upstream named {taken!r}; "
                f"add --replace to replace it, or: aggregator remove {taken}",
                file=sys.stderr,
            )
            return EXIT_USAGE
        kept = remove_server(text, str(target), section, taken) if taken is not None else text
        _replace(target, text, add_server(kept, str(target), section, args.name, entry))
    except ConfigError as exc:
        print(f"aggregator add: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    what = entry.get("url") or " ".join([entry["command"], *entry.get("args", [])])
    print(f"{'replaced' if taken else 'added'} {args.name} ({what}) in {target}")
    note = _command_note(args.name, entry, target)
    if note is not None:  # written all the same: the user may install it next
        print(f"aggregator add: note: {note}", file=sys.stderr)
    sign_in = f"; if it asks for a sign-in: aggregator auth login {args.name}" if entry.get("url") else ""
    print(f"try: aggregator tools {args.name}{sign_in}")
    return 0


def _pair(word: str) -> tuple[str, str]:
    key, sep, value = word.partition("=")
    if not sep or not key:
        raise ValueError(f"--env {word!r} is not KEY=VALUE")
    return key, value


def _command_note(name: str, entry: dict[str, Any], target: Path) -> str | None:
    """What `doctor` would say about a new local entry's command (not on PATH, not executable), else None."""
    if "command" not in entry:
        return None
    try:
        config = parse_config(json.dumps({"upstreams": {name: entry}}), str(target), environ=os.environ)
    except ConfigError:
        return None  # e.g. a variable set only where the aggregator runs: doctor checks it there
    upstream = config.upstreams.get(name)
    finding = command_problem(upstream) if upstream is not None else None
    return None if finding is None else f"{finding.detail}; fix: {finding.fix}"


async def _remove(args: argparse.Namespace, settings: Settings) -> int:
    places = Places.here()
    try:
        target = _yaml_target(getattr(args, "config", None), places)
        if not target.exists():
            print(f"aggregator remove: no config at {target}; nothing to remove", file=sys.stderr)
            return EXIT_USAGE
        section, existing, text = existing_servers(target)
        key = server_key(args.name, existing)
        if key is None:
            known = ", ".join(existing) or "none"
            hint = did_you_mean(args.name, [str(name) for name in existing])
            print(
                f"aggregator remove: no upstream named {args.name!r}{hint} in {target}; known: {known}", file=sys.stderr
            )
            return EXIT_USAGE
        _replace(target, text, remove_server(text, str(target), section, key))
    except ConfigError as exc:
        print(f"aggregator remove: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"removed {key} from {target}")
    return 0


def _yaml_target(explicit: Path | None, places: Places) -> Path:
    target = target_config(explicit, places)
    if target.suffix.lower() == ".json":
        raise ConfigError(str(target), None, "add and remove edit YAML configs only", "convert it to YAML first")
    return target


def _replace(target: Path, before: str, after: str) -> None:
    """Write `after` if it loads and the file still holds `before` (else someone edited it meanwhile)."""
    parse_config(after, str(target), environ=everything_set())  # never write a config we could not load
    current = read_text(target) if target.exists() else None
    if (current or "") != before:
        raise ConfigError(str(target), None, "the file changed while it was being edited", "run the command again")
    write_atomic(target, after, expected=current)  # compare-and-swap: an edit made since is never overwritten
