"""Where MCP clients keep their server lists, and how to read them: one table for every platform.

Paths are the clients' documented ones. `Places` carries the home directory, ``%APPDATA%``, the
working directory and the platform, so tests (and `doctor`) can point the whole table at a fake
home. Reading gives each client file's servers as written (`ClientServers`); turning them into
our entries is `aggregator.config.importing`'s job.
"""

from __future__ import annotations

import os
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from aggregator.config.config_file import read_text
from aggregator.config.errors import ConfigError
from aggregator.config.jsonc import parse_json
from aggregator.config.yamlfile import parse_yaml

__all__ = ["CLIENTS", "ClientFile", "ClientServers", "Places", "client_files", "file_client", "read_client_file"]

Format = Literal["json", "toml", "yaml"]


@dataclass(frozen=True)
class Places:
    """The directories client paths are relative to. `Places.here()` is this machine's."""

    home: Path
    cwd: Path
    platform: str = sys.platform  # "linux", "darwin", "win32"
    appdata: Path | None = None  # %APPDATA% (Windows)
    environ: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def here(cls, environ: Mapping[str, str] | None = None) -> Places:
        env = os.environ if environ is None else environ
        appdata = env.get("APPDATA")
        return cls(
            home=Path(env.get("HOME") or env.get("USERPROFILE") or Path.home()),
            cwd=Path.cwd(),
            appdata=Path(appdata) if appdata else None,
            environ=dict(env),
        )

    def app_config(self) -> Path:
        """The per-user application config folder: ~/.config, ~/Library/Application Support, %APPDATA%."""
        if self.platform == "darwin":
            return self.home / "Library" / "Application Support"
        if self.platform == "win32":
            return self.appdata or self.home / "AppData" / "Roaming"
        return Path(self.environ.get("XDG_CONFIG_HOME") or self.home / ".config")


@dataclass(frozen=True)
class ClientFile:
    """One config file of one client: where, which format, and where in it the servers are."""

    client: str
    path: Path
    format: Format
    section: tuple[str, ...]  # key path to the servers mapping, e.g. ("mcp", "servers")
    scope: str  # "user", "project" or "local" (Claude Code's per-project entries in ~/.claude.json)
    project: Path | None = None  # the directory a project's servers run in (their relative paths' base)

    @property
    def label(self) -> str:
        return f"{self.client} ({self.scope})"


CLIENTS = ("claude-desktop", "claude-code", "cursor", "vscode", "windsurf", "codex")


def client_files(places: Places, clients: tuple[str, ...] = CLIENTS) -> list[ClientFile]:
    """Every config file the given clients may have on this platform (existing or not), in table order."""
    app = places.app_config()
    codex_home = Path(places.environ.get("CODEX_HOME") or places.home / ".codex")
    vscode_user = app / "Code" / "User"
    table = [
        ClientFile("claude-desktop", app / "Claude" / "claude_desktop_config.json", "json", ("mcpServers",), "user"),
        ClientFile("claude-code", places.home / ".claude.json", "json", ("mcpServers",), "user"),
        # `claude mcp add` (default scope "local") writes projects.<project dir>.mcpServers
        ClientFile(
            "claude-code", places.home / ".claude.json", "json", _local_section(places.cwd), "local", places.cwd
        ),
        ClientFile("claude-code", places.cwd / ".mcp.json", "json", ("mcpServers",), "project", places.cwd),
        ClientFile("cursor", places.home / ".cursor" / "mcp.json", "json", ("mcpServers",), "user"),
        ClientFile("cursor", places.cwd / ".cursor" / "mcp.json", "json", ("mcpServers",), "project", places.cwd),
        ClientFile("vscode", vscode_user / "mcp.json", "json", ("servers",), "user"),
        ClientFile("vscode", vscode_user / "settings.json", "json", ("mcp", "servers"), "user settings"),
        ClientFile("vscode", places.cwd / ".vscode" / "mcp.json", "json", ("servers",), "project", places.cwd),
        ClientFile(
            "windsurf", places.home / ".codeium" / "windsurf" / "mcp_config.json", "json", ("mcpServers",), "user"
        ),
        ClientFile("codex", codex_home / "config.toml", "toml", ("mcp_servers",), "user"),
    ]
    seen: set[tuple[Path, tuple[str, ...]]] = set()
    files = []
    for entry in table:  # run from the home directory, a project file is the user file: read it once
        if entry.client in clients and (entry.path, entry.section) not in seen:
            seen.add((entry.path, entry.section))
            files.append(entry)
    return files


@dataclass(frozen=True)
class ClientServers:
    """The servers one client file lists, as written (name → entry)."""

    file: ClientFile
    servers: dict[str, Any]


def read_client_file(file: ClientFile) -> ClientServers:
    """Read one client file; a file that cannot be parsed is a `ConfigError` (never half-read)."""
    data = parse_document(read_text(file.path), file)
    section: Any = data
    for key in file.section:
        section = section.get(key) if isinstance(section, dict) else None
    if section is None:
        return ClientServers(file, {})
    if not isinstance(section, dict):
        where = ".".join(file.section)
        raise ConfigError(str(file.path), where, "is not a mapping of server names", f"fix {where} in the file")
    if file.project is None:
        return ClientServers(file, dict(section))
    return ClientServers(file, {name: in_project(entry, file.project) for name, entry in section.items()})


def _local_section(project: Path) -> tuple[str, ...]:
    return ("projects", str(project.absolute()), "mcpServers")


def in_project(entry: Any, project: Path) -> Any:
    """A project's local server as the client runs it, from anywhere: its `cwd` is the project (a
    relative `cwd` joined to it), so `--repository .` or `node build/index.js` keep meaning that project."""
    if not isinstance(entry, dict) or not isinstance(entry.get("command"), str) or entry.get("url"):
        return entry
    cwd = entry.get("cwd")
    if cwd is None:
        return {**entry, "cwd": str(project.absolute())}
    if isinstance(cwd, str) and not cwd.startswith(("~", "$")) and not Path(cwd).is_absolute():
        return {**entry, "cwd": os.path.normpath(project.absolute() / cwd)}
    return entry


def parse_document(text: str, file: ClientFile) -> Any:
    if file.format == "toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(str(file.path), None, f"invalid TOML: {exc}", "correct the TOML syntax") from None
    if not text.strip():
        return {}
    if file.format == "yaml":
        return parse_yaml(text, str(file.path))[0]
    return parse_json(text, str(file.path))


def file_client(path: Path) -> ClientFile:
    """A client file named on the command line: its format from the suffix, its section from its keys."""
    if path.suffix.lower() == ".toml":
        return ClientFile(path.stem, path, "toml", ("mcp_servers",), "file")
    kind: Format = "yaml" if path.suffix.lower() in (".yaml", ".yml") else "json"
    probe = ClientFile(path.stem, path, kind, (), "file")
    data = parse_document(read_text(path), probe)
    for section in (("mcpServers",), ("servers",), ("mcp", "servers"), ("upstreams",)):
        found: Any = data
        for key in section:
            found = found.get(key) if isinstance(found, dict) else None
        if found is not None:
            return ClientFile(path.stem, path, kind, section, "file")
    return ClientFile(path.stem, path, kind, ("mcpServers",), "file")
