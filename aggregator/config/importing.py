"""Client servers → entries of aggregator.yaml: translation, conflicts, and the plan `import` shows.

Each client entry is translated to our shape with its values as written (``${VAR}`` stays a
reference), validated by the same builder the loader uses (with every variable taken as set), and
then compared with what the config already has: a new name is added; the same name with the same
endpoint (command/args/env/cwd/url/headers/transport) is merged (nothing to write); the same name
with a different endpoint is renamed ``NAME-CLIENT``; an entry that starts the aggregator itself, a
disabled one, or one we cannot express is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import PurePath
from typing import Any, Literal

from aggregator.config.client_files import ClientServers
from aggregator.config.errors import ConfigError
from aggregator.config.expand import required_variables
from aggregator.config.load import parse_config
from aggregator.config.models import NAME_PATTERN, RESERVED_NAME

__all__ = [
    "ENDPOINT_KEYS",
    "ImportItem",
    "ImportPlan",
    "carried_variables",
    "client_only_variable",
    "everything_set",
    "is_aggregator_entry",
    "mcp_remote",
    "plan_import",
    "translate",
]

ENDPOINT_KEYS = ("command", "args", "env", "cwd", "url", "headers", "transport")

Action = Literal["add", "same", "rename", "skip"]


@dataclass(frozen=True)
class ImportItem:
    action: Action
    name: str  # the name in aggregator.yaml (after a rename)
    original: str  # the name in the client file
    client: str
    source: str  # the client file
    note: str = ""
    entry: dict[str, Any] = field(default_factory=dict)
    # Variables the entry refers to (``${AUTH_TOKEN}`` in a header) whose values the client's entry
    # holds in its `env`: they stay out of aggregator.yaml; the aggregator needs them in its environment
    # (install puts them in the env of its entry in the client's file). Never printed.
    carried: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class ImportPlan:
    target: str
    section: str
    items: list[ImportItem]

    def additions(self) -> dict[str, dict[str, Any]]:
        return {item.name: item.entry for item in self.items if item.action in ("add", "rename")}

    def counts(self) -> dict[str, int]:
        return {
            action: sum(item.action == action for item in self.items) for action in ("add", "same", "rename", "skip")
        }


class _EverySet(Mapping[str, str]):
    """An environment where every variable is set: validates shape without needing the user's values."""

    def __getitem__(self, key: str) -> str:
        return "x"

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def get(self, key: str, default: Any = None) -> str:  # type: ignore[override]
        return "x"


def everything_set() -> Mapping[str, str]:
    """An environment in which every ``${VAR}`` is set (to check a config's shape, not its values)."""
    return _EverySet()


def is_aggregator_entry(entry: Mapping[str, Any]) -> bool:
    """True if the entry starts this aggregator (`aggregator serve`, `python -m aggregator`, ...)."""
    command = entry.get("command")
    args = [str(a) for a in entry.get("args") or [] if isinstance(a, str | int)]
    if not isinstance(command, str):
        return False
    program = PurePath(command.replace("\\", "/")).name.lower().removesuffix(".exe")
    if program == RESERVED_NAME:
        return True
    words = [program, *args]
    return any(words[i] == "-m" and words[i + 1] == RESERVED_NAME for i in range(len(words) - 1)) or (
        program in ("uvx", "pipx") and RESERVED_NAME in args[:2]
    )


def translate(entry: Any, client: str) -> tuple[dict[str, Any] | None, str]:
    """A client's entry in our shape, or None and why not. Codex (TOML) keys are mapped too."""
    if not isinstance(entry, Mapping):
        return None, "not a mapping of settings"
    if entry.get("disabled") is True or entry.get("enabled") is False:
        return None, "disabled in the client"
    if entry.get("envFile") is not None:
        return None, "uses envFile, which aggregator.yaml does not read: copy its variables into env:"
    remote = mcp_remote(entry)
    if remote is not None:
        entry = remote
    out: dict[str, Any] = {}
    for key in ("command", "args", "env", "cwd", "headers", "auth", "client_id", "client_secret"):
        if entry.get(key) not in (None, [], {}):
            out[key] = entry[key]
    url = entry.get("url", entry.get("serverUrl"))
    if url is not None:
        out["url"] = url
    if client == "codex":
        _codex_keys(entry, out)
    kind = entry.get("type", entry.get("transportType", entry.get("transport")))
    shape = {"mcpServers": {"s": {k: v for k, v in out.items() if k != "transport"}}}
    if isinstance(kind, str):
        shape["mcpServers"]["s"]["type"] = kind
    try:
        checked = parse_config(json.dumps(shape), "<client>.json", environ=everything_set(), strict=True)
        resolved = checked.upstreams["s"]
    except ConfigError as exc:
        return None, f"{exc.problem}; fix: {exc.fix}"
    if resolved.transport != "stdio" and not (resolved.transport == "http" and kind is None):
        out["transport"] = resolved.transport
    return out, ""


_LAUNCHERS = ("npx", "bunx", "pnpx", "pnpm", "yarn", "dlx")
_REMOTE_TRANSPORTS = {"sse-only": "sse", "http-only": "http"}


def mcp_remote(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """A `npx mcp-remote URL [--header K:V] [--transport sse-only|http-only] [--static-oauth-client-info
    JSON]` entry as the native remote upstream it wraps (`url:` with `auth: oauth`), else None.

    `${VAR}` in a header is mcp-remote's reference to the entry's `env`: it stays a reference (the
    value is a secret the user kept out of the arguments; `carried_variables` says where it is).
    """
    command = entry.get("command")
    args = [str(a) for a in entry.get("args") or [] if isinstance(a, str | int)]
    program = PurePath(str(command).replace("\\", "/")).name.lower().removesuffix(".cmd").removesuffix(".exe")
    tool = next((i for i, a in enumerate(args) if re.fullmatch(r"mcp-remote(@[\w.^~-]+)?", a)), None)
    if program not in _LAUNCHERS or tool is None:
        return None
    rest = args[tool + 1 :]
    url = next((a for a in rest if re.match(r"https?://", a)), None)
    if url is None:
        return None
    out: dict[str, Any] = {"url": url, "auth": "oauth"}
    for flag, value in itertools.pairwise(rest):
        if flag == "--header" and ":" in value:
            key, _, text = value.partition(":")
            out.setdefault("headers", {})[key.strip()] = text.strip()
        elif flag == "--transport" and value in _REMOTE_TRANSPORTS:
            out["type"] = _REMOTE_TRANSPORTS[value]
        elif flag == "--static-oauth-client-info":
            with contextlib.suppress(ValueError, AttributeError):
                info = json.loads(value)
                out |= {k: str(info[k]) for k in ("client_id", "client_secret") if info.get(k)}
    if any(key.lower() == "authorization" for key in out.get("headers", {})):
        del out["auth"]  # a static token: no sign-in
    return out


def carried_variables(raw: Any, entry: Mapping[str, Any]) -> dict[str, str]:
    """The variables a remote `entry` (translated from the client's `raw`) refers to in its url or
    headers whose values `raw`'s `env` holds: what the aggregator's environment must supply."""
    env = raw.get("env") if isinstance(raw, Mapping) else None
    if "command" in entry or not isinstance(env, Mapping):
        return {}
    texts = [entry.get("url"), *(entry.get("headers") or {}).values()]
    names = {name for text in texts if isinstance(text, str) for name in required_variables(text)}
    return {name: str(env[name]) for name in sorted(names) if isinstance(env.get(name), str | int | float)}


def _codex_keys(entry: Mapping[str, Any], out: dict[str, Any]) -> None:
    """Codex's config.toml keys that have a counterpart of ours."""
    token_var = entry.get("bearer_token_env_var")
    if isinstance(token_var, str):
        out.setdefault("headers", {})["Authorization"] = f"Bearer ${{{token_var}}}"
    if isinstance(entry.get("http_headers"), Mapping):
        out["headers"] = {**entry["http_headers"], **out.get("headers", {})}
    for name in entry.get("env_vars") or []:
        if isinstance(name, str):
            out.setdefault("env", {}).setdefault(name, f"${{{name}}}")
    timeouts = {
        ours: entry[theirs]
        for ours, theirs in (("connect", "startup_timeout_sec"), ("call", "tool_timeout_sec"))
        if isinstance(entry.get(theirs), int | float)
    }
    if timeouts:
        out["timeouts"] = timeouts
    tools = {
        ours: entry[theirs]
        for ours, theirs in (("allow", "enabled_tools"), ("deny", "disabled_tools"))
        if theirs in entry
    }
    if tools:
        out["tools"] = tools


# Variables the client itself fills in (VS Code, Cursor, Claude Code plugins); the aggregator's
# environment does not have them, so an entry using one must stay in the client.
_CLIENT_VARIABLE = re.compile(
    r"\$\{(?:workspaceFolder\w*|workspaceRoot|userHome|cwd|file\w*|relativeFile\w*|lineNumber|selectedText"
    r"|execPath|defaultBuildTask|pathSeparator|/|CLAUDE_PLUGIN_ROOT|CLAUDE_PROJECT_DIR"
    r"|(?:input|config|command):[^}]*)\}"
)


def client_only_variable(entry: Any) -> str | None:
    """The first ``${...}`` in `entry`'s strings that only the client defines (``${workspaceFolder}``)."""
    if isinstance(entry, str):
        match = _CLIENT_VARIABLE.search(entry)
        return match.group(0) if match else None
    values = entry.values() if isinstance(entry, Mapping) else entry if isinstance(entry, list) else ()
    return next((found for value in values if (found := client_only_variable(value)) is not None), None)


def endpoint(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The keys that decide whether two entries are the same server."""
    return {key: entry[key] for key in ENDPOINT_KEYS if entry.get(key) not in (None, [], {})}


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_") or "server"


class _Names:
    """The names (case-folded) and endpoints of the config so far, existing and planned."""

    def __init__(self, existing: Mapping[str, Any]) -> None:
        self.entries: dict[str, tuple[str, dict[str, Any]]] = {}
        for name, entry in existing.items():
            self.take(str(name), dict(entry) if isinstance(entry, Mapping) else {})

    def take(self, name: str, entry: dict[str, Any]) -> None:
        self.entries[name.casefold()] = (name, entry)

    def free(self, name: str) -> bool:
        return name.casefold() != RESERVED_NAME and name.casefold() not in self.entries

    def same_server(self, entry: Mapping[str, Any]) -> str | None:
        wanted = endpoint(entry)
        return next((name for name, other in self.entries.values() if endpoint(other) == wanted), None)


def plan_import(
    existing: Mapping[str, Any],
    sources: Iterable[ClientServers],
    *,
    target: str,
    section: str,
    carried: Mapping[str, str] | None = None,
) -> ImportPlan:
    """What importing `sources` into a config whose servers are `existing` would do; `carried`: the
    variables already carried to the aggregator (its entry's env), which a new one must not change."""
    names = _Names(existing)
    items: list[ImportItem] = []
    taken = dict(carried or {})  # variables carried so far, and their values
    for source in sources:
        client, where = source.file.client, str(source.file.path)
        for raw_name, raw in source.servers.items():
            original = str(raw_name)
            name = safe_name(original)
            if isinstance(raw, Mapping) and is_aggregator_entry(raw):
                items.append(ImportItem("skip", name, original, client, where, "already the aggregator"))
                continue
            entry, why = translate(raw, client)
            needs = client_only_variable(raw)
            if needs is not None:
                entry, why = None, f"uses {needs}, which only {client} defines: kept in the client"
            if entry is None:
                items.append(ImportItem("skip", name, original, client, where, why))
                continue
            entry, carried = _own_variables(entry, carried_variables(raw, entry), name, taken)
            item = _place(ImportItem("add", name, original, client, where, entry=entry, carried=carried), names)
            items.append(_say_carried(item))
    return ImportPlan(target=target, section=section, items=items)


def _own_variables(
    entry: dict[str, Any], carried: dict[str, str], name: str, taken: dict[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """`entry` and its carried variables, a variable renamed ``VAR_NAME`` where an earlier entry carries the
    same variable with another value (two clients' ``AUTH_TOKEN``s); `taken` records what is carried."""
    own: dict[str, str] = {}
    for variable, value in carried.items():
        chosen, number = variable, 2
        suffix = re.sub(r"\W", "_", name).upper()
        while taken.get(chosen, value) != value:
            chosen = f"{variable}_{suffix}" + (f"_{number - 1}" if number > 2 else "")
            number += 1
        if chosen != variable:
            entry = _renamed_variable(entry, variable, chosen)
        taken[chosen] = own[chosen] = value
    return entry, own


def _renamed_variable(entry: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """`entry` with its url's and headers' references to `old` made references to `new`."""
    pattern = re.compile(r"\$\{(env:)?" + re.escape(old) + r"(?=[}:])")

    def swap(text: str) -> str:
        return pattern.sub(lambda m: "${" + (m.group(1) or "") + new, text)

    out = dict(entry)
    if isinstance(out.get("url"), str):
        out["url"] = swap(out["url"])
    if isinstance(out.get("headers"), Mapping):
        out["headers"] = {k: swap(v) if isinstance(v, str) else v for k, v in out["headers"].items()}
    return out


def _say_carried(item: ImportItem) -> ImportItem:
    """The item's note names the variables the aggregator's environment must hold (not their values)."""
    if not item.carried:
        return item
    names = ", ".join(item.carried)
    said = f"{names} stay{'s' if len(item.carried) == 1 else ''} in the client's env: the aggregator needs it"
    said += " in its environment (install puts it in the aggregator's entry)"
    return replace(item, note=f"{item.note}; {said}" if item.note else said)


def _place(item: ImportItem, names: _Names) -> ImportItem:
    """Add under its name, merge with an identical server, or rename after the client."""
    same = names.same_server(item.entry)
    if same is not None:
        note = "the same server is already in the config" + (f" as {same!r}" if same != item.name else "")
        return replace(item, action="same", name=same, note=note, entry={})
    if names.free(item.name):
        names.take(item.name, item.entry)
        if item.name != item.original:
            return replace(item, note=f"renamed from {item.original!r}: names use letters, digits, '_' and '-'")
        return item
    base = f"{item.name}-{safe_name(item.client)}"
    candidate, number = base, 2
    while not names.free(candidate) or not NAME_PATTERN.fullmatch(candidate):
        candidate, number = f"{base}-{number}", number + 1
    names.take(candidate, item.entry)
    why = "the name is reserved" if item.name.casefold() == RESERVED_NAME else f"{item.name!r} names a different server"
    return replace(item, action="rename", name=candidate, note=f"{why}; imported as {candidate!r}")
