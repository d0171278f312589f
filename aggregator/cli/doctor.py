"""`aggregator doctor`: is everything in place? One line per finding, each problem with its fix.

Checks, in order: which config file won the lookup and why; that it loads; for every upstream the
variables it references, its command on PATH (or its URL reachable) and a probe (handshake time,
tool count); that the data directory is writable; which MCP clients start the aggregator. Exit
code 0 only when there is no problem (notes do not count).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import anyio

from aggregator.cli.progress import progress_line
from aggregator.config import AggregatorConfig, ConfigError, UpstreamConfig, parse_config
from aggregator.config.client_files import Places, client_files, read_client_file
from aggregator.config.config_file import config_lookup, read_text
from aggregator.config.expand import required_variables
from aggregator.config.importing import everything_set, is_aggregator_entry
from aggregator.config.launcher import missing_command
from aggregator.config.load import load_config, written_servers
from aggregator.settings import Settings, data_dir_of
from aggregator.table import count
from aggregator.upstream.oauth_signin import login_command
from aggregator.upstream.start_errors import install_hint

__all__ = ["register"]

Level = Literal["ok", "note", "problem"]
_MARK = {"ok": "ok     ", "note": "note   ", "problem": "PROBLEM"}


@dataclass(frozen=True)
class Finding:
    level: Level
    subject: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        fix = f". Fix: {self.fix}" if self.fix else ""
        return f"{_MARK[self.level]} {self.subject}: {self.detail}{fix}"


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    doctor = sub.add_parser(
        "doctor",
        parents=[common],
        help="check config, upstreams, data dir and clients",
        description="Check the config, start every upstream (unless --no-probe), check the data dir and the "
        "clients' aggregator entries; one line per finding with its fix. Exit 1 when something is wrong.",
    )
    doctor.add_argument("--no-probe", action="store_true", help="do not start upstreams")
    doctor.add_argument("--json", action="store_true", help="print the findings as JSON")
    doctor.add_argument("--data-dir", type=Path, help="the data dir to check (as serve --data-dir)")
    doctor.set_defaults(standalone=_doctor)


async def _doctor(args: argparse.Namespace, settings: Settings) -> int:
    findings: list[Finding] = []
    clients = read_clients(Places.here())
    config = check_config(getattr(args, "config", None), os.environ, Path.cwd(), findings, set_by_clients(clients))
    data_dir = data_dir_of(args, settings)
    if config is not None:
        await check_upstreams(config, findings, probe=not args.no_probe, data_dir=data_dir)
    findings.append(check_data_dir(data_dir))
    findings += check_clients(clients)
    findings.append(check_service(args))
    findings.append(check_guard())
    problems = sum(f.level == "problem" for f in findings)
    if args.json:
        print(json.dumps({"ok": problems == 0, "findings": [asdict(f) for f in findings]}, indent=2))
    else:
        print("\n".join(f.line() for f in findings))
        print(f"\n{problems} problem{'s' if problems != 1 else ''}" if problems else "\nall well")
    return 1 if problems else 0


# ---------------------------------------------------------------- config


def check_config(
    explicit: Path | None,
    environ: Mapping[str, str],
    cwd: Path,
    findings: list[Finding],
    set_by_clients: Mapping[str, list[str]] | None = None,
) -> AggregatorConfig | None:
    """The config as it loads with the variables that are set; None when it cannot load at all.

    `set_by_clients`: variable → the clients whose aggregator entry sets it in its `env` (install carries
    a token there, docs/import-secrets.md): unset in this shell, it is a note rather than a problem."""
    try:
        path, why = config_lookup(explicit, environ, cwd)
    except ConfigError as exc:
        findings.append(Finding("problem", "config", f"{exc.file}: {exc.problem}", exc.fix))
        return None
    if path is None:
        findings.append(Finding("note", "config", f"the built-in default is used: {why}"))
        return load_config(None, environ=environ, cwd=cwd)
    findings.append(Finding("ok", "config", f"{path}, {why}"))
    try:
        text = read_text(path)
        shape = parse_config(text, str(path), environ=everything_set())  # shape first: unset variables come next
    except ConfigError as exc:
        findings.append(Finding("problem", "config", f"{exc.message.split(' Fix: ')[0]}", exc.fix))
        return None
    findings += _broken_entries(shape.broken)
    missing = _unset_variables(text, path, environ)
    findings.append(Finding("ok", "config", "valid" + (" (variables aside)" if missing else "")))
    for name, variables in missing.items():
        for variable in variables:
            clients = (set_by_clients or {}).get(variable)
            if clients:
                where = f"the aggregator entry of {', '.join(clients)} sets it, so the upstream works there"
                detail = f"${{{variable}}} is not set in this shell ({where}); not probed here"
                findings.append(Finding("note", f"upstream {name}", detail))
                continue
            findings.append(
                Finding(
                    "problem",
                    f"upstream {name}",
                    f"${{{variable}}} is referenced but {variable} is not set",
                    f"set {variable} in the aggregator's environment, or write ${{{variable}:-default}}",
                )
            )
    placeholders = {v: "" for variables in missing.values() for v in variables}
    config = parse_config(text, str(path), environ={**placeholders, **environ})
    complete = {name: up for name, up in config.upstreams.items() if name not in missing}
    return config.model_copy(update={"upstreams": complete})


def _broken_entries(broken: Mapping[str, str]) -> list[Finding]:
    """An entry this aggregator cannot use whatever the environment (`${input:...}`, unknown transport)."""
    findings = []
    for name, message in broken.items():
        problem, _, fix = message.partition(". Fix: ")
        findings.append(Finding("problem", f"upstream {name}", f"disabled: {problem}", fix.rstrip(".")))
    return findings


def _unset_variables(text: str, path: Path, environ: Mapping[str, str]) -> dict[str, list[str]]:
    """Upstream name → the variables its entry needs that the environment does not set."""
    missing: dict[str, list[str]] = {}
    for name, entry in written_servers(text, str(path))[1].items():
        needed = sorted({v for text in _strings(entry) for v in required_variables(text) if v not in environ})
        needed = [v for v in needed if v != "AGGREGATOR_PYTHON"]
        if needed:
            missing[str(name)] = needed
    return missing


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


# ---------------------------------------------------------------- upstreams


async def check_upstreams(
    config: AggregatorConfig, findings: list[Finding], *, probe: bool, data_dir: Path | None = None
) -> None:
    from aggregator.cli.auth import STORE_FIX
    from aggregator.upstream.oauth_providers import Authenticator, uses_oauth
    from aggregator.upstream.oauth_tokens import TokenStore
    from aggregator.upstream.pool import UpstreamPool

    store = TokenStore.in_data_dir(data_dir) if data_dir is not None else TokenStore(None)
    if any(uses_oauth(upstream) for upstream in config.upstreams.values()):
        if (unusable := store.unusable()) is not None:  # no remote upstream can sign in
            findings.append(Finding("problem", "OAuth tokens", f"no token store: {unusable}", STORE_FIX))
        else:
            findings.append(Finding("note", "OAuth tokens", f"kept in {store.where()}"))
    reachable: dict[str, UpstreamConfig] = {}
    for name, upstream in config.upstreams.items():
        if upstream.auth == "client_credentials" and upstream.issuer is None:
            why = "no issuer: its client credentials go to whichever authorization server the MCP server names"
            fix = "set `issuer` to the URL of your authorization server"
            findings.append(Finding("note", f"upstream {name}", why, fix))
        problem = command_problem(upstream) if upstream.transport == "stdio" else await _url_problem(upstream)
        if problem is not None:
            findings.append(problem)
        else:
            reachable[name] = upstream
    if not probe or not reachable:
        findings += [_unprobed(upstream, store) for upstream in reachable.values() if not probe]
        return
    probed = config.model_copy(update={"upstreams": reachable})
    async with UpstreamPool.running(probed, authenticator=Authenticator(store)) as pool:
        with progress_line("probing upstreams", len(reachable)) as advance:
            await pool.start_all(on_done=advance)
        for status in pool.statuses():
            subject = f"upstream {status.name}"
            if status.state == "ready":
                tools = count(status.tool_count or 0, "tool")
                detail = f"ready, {tools}, handshake {status.handshake_seconds or 0:.2f} s"
                findings.append(Finding("ok", subject, detail))
            else:
                error = status.last_error or "did not start"
                last = status.stderr_tail[-1] if status.stderr_tail else ""
                detail = f"{status.state}: {error}" + (f" (stderr: {last})" if last and last not in error else "")
                fix = "run its command by hand to see why it fails"
                if "sign-in needed" in error:
                    detail, fix = "sign-in needed", f"run `{login_command(status.name)}`"
                elif "no token store" in error:
                    fix = STORE_FIX
                elif status.transport != "stdio":  # no command to run: its URL, headers or auth keys
                    fix = "check its url, headers and auth settings (docs/oauth.md)"
                findings.append(Finding("problem", subject, detail, fix))


def _unprobed(upstream: UpstreamConfig, store: Any) -> Finding:
    """Found, not probed; for an upstream that signs in, whether a token is stored."""
    from aggregator.cli.auth import sign_in_state
    from aggregator.upstream.oauth_providers import uses_oauth

    subject = f"upstream {upstream.name}"
    if not uses_oauth(upstream):
        return Finding("ok", subject, "found (not probed)")
    state = sign_in_state(store, upstream)["state"]
    if state == "signed out" and upstream.auth is None:  # OAuth only if the server asks for it: unknown here
        return Finding("ok", subject, "found (not probed)")
    if state == "signed out":
        return Finding("note", subject, "found (not probed); not signed in", f"run `{login_command(upstream.name)}`")
    return Finding("ok", subject, f"found (not probed); {state}")


def command_problem(upstream: UpstreamConfig) -> Finding | None:
    """Why a stdio upstream's command cannot start here (not on PATH, not executable, no cwd), else None."""
    subject = f"upstream {upstream.name}"
    command = upstream.command or ""
    search_path = upstream.env.get("PATH", os.environ.get("PATH", ""))
    if upstream.cwd is not None and not Path(upstream.cwd).is_dir():
        return Finding("problem", subject, f"cwd {upstream.cwd} is not a directory", "create it or correct cwd")
    if os.sep in command or (os.altsep and os.altsep in command):
        if not os.access(command, os.X_OK) or not Path(command).is_file():
            return Finding("problem", subject, f"{command} is not an executable file", "install it or correct command")
    elif shutil.which(command, path=search_path) is None:
        how = install_hint(command) or "install it"
        return Finding("problem", subject, f"command {command!r} is not on PATH", f"{how}, or give its absolute path")
    return None


async def _url_problem(upstream: UpstreamConfig) -> Finding | None:
    parts = urlsplit(upstream.url or "")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with anyio.fail_after(min(upstream.timeouts.connect, 5.0)):
            stream = await anyio.connect_tcp(parts.hostname or "", port)
            await stream.aclose()
    except (OSError, TimeoutError) as exc:
        return Finding(
            "problem",
            f"upstream {upstream.name}",
            f"{parts.hostname}:{port} is not reachable ({type(exc).__name__})",
            "start the server, or correct url",
        )
    return None


# ---------------------------------------------------------------- data dir and clients


def check_data_dir(data_dir: Path) -> Finding:
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=data_dir):
            pass
    except OSError as exc:
        return Finding(
            "problem",
            "data dir",
            f"{data_dir} is not writable ({exc.strerror or type(exc).__name__})",
            "fix its permissions, or set AGGREGATOR_DATA_DIR / --data-dir to a writable directory",
        )
    return Finding("ok", "data dir", f"{data_dir} is writable")


def check_guard() -> Finding:
    """Which guard runs the stdio upstreams, and why (docs/guard.md); doctor never builds it. Only a failed
    build is worth a note: the Python guard is a working fall-back, 9 MB larger."""
    from aggregator.upstream.guard_build import choose

    choice = choose(start_build=False)
    if choice.kind == "c":
        return Finding("ok", "guard", f"the C guard runs the stdio upstreams ({choice.reason})")
    detail = f"the Python guard runs the stdio upstreams (9 MB more than the C guard): {choice.reason}"
    if "failed to build" in choice.reason:
        return Finding("note", "guard", detail, choice.fix)
    return Finding("ok", "guard", f"{detail}; {choice.fix}" if choice.fix else detail)


def check_service(args: argparse.Namespace) -> Finding:
    """Whether the per-user service for this config runs (what `connect` entries attach to)."""
    from aggregator.cli.service import service_health

    level, detail, fix = service_health(args)
    return Finding(level, "service", detail, fix)


def _gone_launchers(file: Any, entries: list[dict[str, Any]]) -> list[Finding]:
    """A client entry whose aggregator command is gone (a deleted checkout's venv): the client cannot start it."""
    return [
        Finding(
            "problem",
            f"client {file.label}",
            f"{file.path}: the aggregator entry runs {entry['command']}, which no longer exists",
            f"aggregator install {file.client} (after installing the aggregator with pipx or uv tool install)",
        )
        for entry in entries
        if isinstance(entry.get("command"), str) and missing_command(entry["command"])
    ]


ClientRead = tuple[Any, list[dict[str, Any]] | ConfigError]  # a client file: its aggregator entries, or why not


def read_clients(places: Places) -> list[ClientRead]:
    """Each client file there is, with its aggregator entries or why it does not parse (read once for
    `set_by_clients` and `check_clients`)."""
    read: list[ClientRead] = []
    for file in client_files(places):
        if not file.path.is_file():
            continue
        try:
            servers = read_client_file(file).servers
        except ConfigError as exc:
            read.append((file, exc))
            continue
        entries = [entry for entry in servers.values() if isinstance(entry, dict) and is_aggregator_entry(entry)]
        read.append((file, entries))
    return read


def set_by_clients(clients: list[ClientRead]) -> dict[str, list[str]]:
    """Variable → the clients (labels) whose aggregator entry sets it in its `env`."""
    found: dict[str, list[str]] = {}
    for file, entries in clients:
        if isinstance(entries, ConfigError):
            continue  # check_clients reports it
        for entry in entries:
            if isinstance(entry.get("env"), dict):
                for variable in entry["env"]:
                    found.setdefault(str(variable), []).append(file.label)
    return found


def check_clients(clients: list[ClientRead]) -> list[Finding]:
    """Which client files start the aggregator; a client file that does not parse is a problem."""
    findings: list[Finding] = []
    installed: list[str] = []
    for file, entries in clients:
        if isinstance(entries, ConfigError):
            fix = f"correct the file (in {file.client} or by hand)"
            findings.append(Finding("problem", f"client {file.label}", f"{file.path}: {entries.problem}", fix))
            continue
        if entries:
            installed.append(f"{file.label} ({file.path})")
        findings += _gone_launchers(file, entries)
    if installed:
        findings.append(Finding("ok", "clients", "the aggregator is installed in " + ", ".join(installed)))
    else:
        findings.append(
            Finding("note", "clients", "no MCP client starts the aggregator yet", "aggregator install CLIENT")
        )
    return findings
