"""`aggregator install CLIENT` / `uninstall CLIENT`: round trips, idempotence, refusals."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from aggregator.config import load_config
from tests.conftest import EXAMPLES, aggregator_env, structured
from tests.test_cli import run_cli

KIT = {"command": sys.executable, "args": [str(EXAMPLES / "testkit.py")]}
CLIENT_FILES = {
    "cursor": (
        ".cursor/mcp.json",
        '{\n  // mine\n  "mcpServers": {\n    "kit": '
        + json.dumps(KIT)
        + ',\n    "off": {"command": "x", "disabled": true},\n  },\n}\n',
    ),
    "codex": (
        ".codex/config.toml",
        'model = "o3"  # comment\n\n[mcp_servers.kit]\ncommand = '
        + json.dumps(KIT["command"])
        + "\nargs = "
        + json.dumps(KIT["args"])
        + '\n\n[profiles.x]\nmodel = "o4"\n',
    ),
    "claude-desktop": (
        ".config/Claude/claude_desktop_config.json",
        json.dumps({"globalShortcut": "Ctrl+Space", "mcpServers": {"kit": KIT}}, indent=4),
    ),
}


class Home:
    """A fake home with one client's config, and a project directory with aggregator.yaml."""

    def __init__(self, root: Path, client: str, text: str | None) -> None:
        self.root = root
        self.client = client
        self.project = root / "project"
        self.project.mkdir()
        self.config = self.project / "aggregator.yaml"
        self.config.write_text("# my servers\nupstreams: {}\n")
        relative = CLIENT_FILES[client][0] if client in CLIENT_FILES else ".codeium/windsurf/mcp_config.json"
        self.file = root / "home" / relative
        self.file.parent.mkdir(parents=True, exist_ok=True)
        if text is not None:
            self.file.write_text(text)

    def run(self, *args: str) -> Any:
        env = aggregator_env(HOME=str(self.root / "home"), XDG_CONFIG_HOME="", APPDATA="", CODEX_HOME="")
        return run_cli(*args, env=env, cwd=self.project)

    def backups(self) -> list[Path]:
        return sorted(self.file.parent.glob(f"{self.file.name}.aggregator-backup-*"))


@pytest.mark.parametrize("client", sorted(CLIENT_FILES))
def test_install_then_uninstall_is_byte_identical(tmp_path: Path, client: str) -> None:
    original = CLIENT_FILES[client][1]
    home = Home(tmp_path, client, original)
    done = home.run("install", client)
    assert done.returncode == 0, done.stderr
    assert "undo with: aggregator uninstall" in done.stdout
    assert load_config(home.config, environ={}).upstreams["kit"].command == sys.executable  # imported first
    assert home.config.read_text().startswith("# my servers\n")
    assert len(home.backups()) == 1 and home.backups()[0].read_text() == original
    again = home.run("install", client)
    assert again.returncode == 0 and "already installed" in again.stdout and len(home.backups()) == 1
    done = home.run("uninstall", client)
    assert done.returncode == 0, done.stderr
    assert home.file.read_bytes() == original.encode() and home.backups() == []


def test_installed_entry_starts_the_aggregator_with_the_clients_servers(tmp_path: Path) -> None:
    home = Home(tmp_path, "cursor", CLIENT_FILES["cursor"][1])
    assert home.run("install", "cursor", "--serve").returncode == 0  # connect entries: tests/test_service.py
    servers = json.loads(home.file.read_text())["mcpServers"]
    assert set(servers) == {"aggregator", "off"}  # the disabled one stays in the client (not imported)
    entry = servers["aggregator"]
    assert Path(entry["command"]).is_absolute() and entry["args"][-3:] == ["serve", "--config", str(home.config)]

    async def listed() -> dict[str, Any]:
        params = StdioServerParameters(command=entry["command"], args=entry["args"], env=aggregator_env())
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return structured(await session.call_tool("catalog_list_servers", {}))

    servers_seen = anyio.run(listed)
    assert [s["name"] for s in servers_seen["servers"]] == ["kit"]


def test_install_into_a_missing_file_and_back(tmp_path: Path) -> None:
    home = Home(tmp_path, "windsurf", None)
    dry = home.run("install", "windsurf", "--dry-run")
    assert dry.returncode == 0 and "would write" in dry.stdout and not home.file.exists()
    assert home.run("install", "windsurf").returncode == 0
    assert "aggregator" in json.loads(home.file.read_text())["mcpServers"]
    assert home.run("uninstall", "windsurf").returncode == 0
    assert not home.file.exists() and home.backups() == []


def test_uninstall_keeps_changes_made_since_install(tmp_path: Path) -> None:
    home = Home(tmp_path, "claude-desktop", CLIENT_FILES["claude-desktop"][1])
    assert home.run("install", "claude-desktop").returncode == 0
    data = json.loads(home.file.read_text())
    data["mcpServers"]["later"] = {"command": "later"}
    data["theme"] = "dark"
    home.file.write_text(json.dumps(data))
    done = home.run("uninstall", "claude-desktop")
    assert done.returncode == 0 and "changed since install" in done.stdout
    after = json.loads(home.file.read_text())
    assert after["mcpServers"] == {"kit": KIT, "later": {"command": "later"}} and after["theme"] == "dark"


def test_never_touches_what_it_cannot_parse(tmp_path: Path) -> None:
    home = Home(tmp_path, "cursor", '{"mcpServers": {"kit": ')
    done = home.run("install", "cursor")
    assert done.returncode == 2 and "invalid JSON" in done.stderr and done.stderr.count("\n") == 1
    assert home.file.read_text() == '{"mcpServers": {"kit": ' and home.backups() == []
    home.file.write_text(CLIENT_FILES["cursor"][1])
    home.config.write_text("upstreams: {git: {comand: x}}\n")
    done = home.run("install", "cursor")
    assert done.returncode == 2 and "upstreams.git.comand" in done.stderr
    assert home.file.read_text() == CLIENT_FILES["cursor"][1] and home.backups() == []
    assert home.run("uninstall", "cursor").returncode == 1  # never installed: nothing to restore


def test_an_mcp_remote_token_stays_in_the_client_and_reaches_the_remote(tmp_path: Path) -> None:
    """`npx mcp-remote URL --header "Authorization: Bearer ${AUTH_TOKEN}"` with the token in the entry's env:
    install writes the native upstream with the reference into aggregator.yaml, the token into the env of
    the aggregator's entry in the client's file (where the user had it), and the installed entry reaches
    the real remote (an `aggregator serve --transport http` that wants that bearer token)."""
    from tests.conftest import kit_upstream, write_config
    from tests.test_serve_http import http_aggregator

    token = "sk-live-9c41e07d2b"
    remote_config = write_config(tmp_path, {"kit": kit_upstream()})
    with http_aggregator(remote_config, env=aggregator_env(AGGREGATOR_TOKEN=token)) as url:
        remote = {
            "command": "npx",
            "args": ["-y", "mcp-remote", url, "--header", "Authorization: Bearer ${AUTH_TOKEN}"],
            "env": {"AUTH_TOKEN": token},
        }
        original = json.dumps({"mcpServers": {"remote-api": remote}}, indent=2)
        home = Home(tmp_path, "claude-desktop", original)
        shown = home.run("install", "claude-desktop", "--serve", "--dry-run")
        assert shown.returncode == 0 and token not in shown.stdout + shown.stderr
        done = home.run("install", "claude-desktop", "--serve")
        assert done.returncode == 0 and token not in done.stdout + done.stderr, done.stderr
        assert token not in home.config.read_text() and "Bearer ${AUTH_TOKEN}" in home.config.read_text()
        entry = json.loads(home.file.read_text())["mcpServers"]["aggregator"]
        assert entry["env"] == {"AUTH_TOKEN": token}

        async def echoed() -> dict[str, Any]:
            params = StdioServerParameters(
                command=entry["command"], args=entry["args"], env=aggregator_env(**entry["env"])
            )
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                inner = {"server": "kit", "tool": "echo", "arguments": {"message": "through"}}
                args = {"server": "remote-api", "tool": "catalog_call_tool", "arguments": inner}
                result = await session.call_tool("catalog_call_tool", args)
                assert not result.is_error, result
                return {"text": result.content[0].text}  # type: ignore[union-attr]

        assert "through" in anyio.run(echoed)["text"]
        again = home.run("install", "claude-desktop", "--serve")
        assert again.returncode == 0 and "already installed" in again.stdout, again.stdout + again.stderr
        assert home.run("uninstall", "claude-desktop").returncode == 0
        assert home.file.read_text() == original


def test_a_second_install_keeps_the_carried_values_and_renames_a_clash(tmp_path: Path) -> None:
    """A server added to the client after install, whose header uses the same variable name with another
    value, gets its own variable: the first server's token in the aggregator's entry is never replaced."""

    def remote(url: str, token: str) -> dict[str, Any]:
        header = ["--header", "Authorization: Bearer ${AUTH_TOKEN}"]
        return {"command": "npx", "args": ["mcp-remote", url, *header], "env": {"AUTH_TOKEN": token}}

    home = Home(tmp_path, "claude-desktop", json.dumps({"mcpServers": {"one": remote("https://a.example/mcp", "A")}}))
    assert home.run("install", "claude-desktop", "--serve").returncode == 0
    data = json.loads(home.file.read_text())
    data["mcpServers"]["two-x"] = remote("https://b.example/mcp", "B")
    home.file.write_text(json.dumps(data))
    done = home.run("install", "claude-desktop", "--serve")
    assert done.returncode == 0, done.stderr
    entry = json.loads(home.file.read_text())["mcpServers"]["aggregator"]
    assert entry["env"] == {"AUTH_TOKEN": "A", "AUTH_TOKEN_TWO_X": "B"}
    upstreams = load_config(home.config, environ=entry["env"]).upstreams
    assert upstreams["one"].headers == {"Authorization": "Bearer A"}
    assert upstreams["two-x"].headers == {"Authorization": "Bearer B"}
    doctor = home.run("doctor", "--no-probe")  # in a shell without the tokens: the client has them
    assert "PROBLEM upstream one" not in doctor.stdout and "AUTH_TOKEN is referenced" not in doctor.stdout
    assert "note    upstream two-x: ${AUTH_TOKEN_TWO_X} is not set in this shell (the aggregator entry of" in (
        doctor.stdout
    )
    assert "Bearer B" not in doctor.stdout


def test_installing_a_carried_token_for_the_shared_service_says_when_the_service_sees_it(tmp_path: Path) -> None:
    """The shared service has the environment of the `connect` that started it (docs/service.md)."""
    header = ["--header", "Authorization: Bearer ${AUTH_TOKEN}"]
    remote = {"command": "npx", "args": ["mcp-remote", "https://a.example/mcp", *header], "env": {"AUTH_TOKEN": "t-9f"}}
    home = Home(tmp_path, "claude-desktop", json.dumps({"mcpServers": {"one": remote}}))
    done = home.run("install", "claude-desktop")
    assert done.returncode == 0 and "t-9f" not in done.stdout + done.stderr, done.stderr
    assert "note: the aggregator entry's env holds AUTH_TOKEN; the shared service sees it only if claude-desktop" in (
        done.stdout
    )
    assert json.loads(home.file.read_text())["mcpServers"]["aggregator"]["args"][-3] == "connect"
