"""`aggregator import`: client config locations, every client format, conflicts, and --write."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from aggregator.config import load_config
from aggregator.config.client_files import ClientFile, ClientServers, Places, client_files, read_client_file
from aggregator.config.importing import plan_import, translate
from tests.conftest import aggregator_env
from tests.test_cli import run_cli

# ---------------------------------------------------------------- where clients keep their configs


@pytest.mark.parametrize(
    ("platform", "expected"),
    [
        (
            "linux",
            {"claude-desktop": "H/.config/Claude/claude_desktop_config.json", "vscode": "H/.config/Code/User/mcp.json"},
        ),
        (
            "darwin",
            {
                "claude-desktop": "H/Library/Application Support/Claude/claude_desktop_config.json",
                "vscode": "H/Library/Application Support/Code/User/mcp.json",
            },
        ),
        ("win32", {"claude-desktop": "A/Claude/claude_desktop_config.json", "vscode": "A/Code/User/mcp.json"}),
    ],
)
def test_client_locations_per_platform(platform: str, expected: dict[str, str]) -> None:
    places = Places(home=Path("H"), cwd=Path("P"), platform=platform, appdata=Path("A"))
    user = {f.client: f.path.as_posix() for f in client_files(places) if f.scope == "user"}
    for client, path in expected.items():
        assert user[client] == path
    assert user["claude-code"] == "H/.claude.json" and user["cursor"] == "H/.cursor/mcp.json"
    assert user["windsurf"] == "H/.codeium/windsurf/mcp_config.json" and user["codex"] == "H/.codex/config.toml"
    project = {f.client: f.path.as_posix() for f in client_files(places) if f.scope == "project"}
    assert project == {"claude-code": "P/.mcp.json", "cursor": "P/.cursor/mcp.json", "vscode": "P/.vscode/mcp.json"}


def test_xdg_config_home_and_codex_home_are_honoured() -> None:
    places = Places(
        home=Path("H"), cwd=Path("P"), platform="linux", environ={"XDG_CONFIG_HOME": "X", "CODEX_HOME": "C"}
    )
    paths = {f.client: f.path.as_posix() for f in client_files(places, ("claude-desktop", "codex"))}
    assert paths == {"claude-desktop": "X/Claude/claude_desktop_config.json", "codex": "C/config.toml"}


# ---------------------------------------------------------------- every client format

CURSOR_JSONC = """{
  // Cursor accepts comments and trailing commas
  "mcpServers": {
    "git": {"command": "uvx", "args": ["mcp-server-git"],},
    "remote": {"url": "http://localhost:8000/sse"},  /* no type: SSE by its path */
  },
}
"""
VSCODE_MCP = '{"servers": {"memory": {"type": "stdio", "command": "npx", "args": ["-y", "m"]}}, "inputs": []}'
VSCODE_SETTINGS = '{"editor.fontSize": 14, "mcp": {"servers": {"web": {"type": "http", "url": "https://w/mcp"}}}}'
CODEX_TOML = """\
model = "o3"

[mcp_servers.docs]
command = "npx"
args = ["-y", "docs-mcp"]
env = { "API_KEY" = "${DOCS_KEY}" }
env_vars = ["HOME_DIR"]
startup_timeout_sec = 20
tool_timeout_sec = 90
disabled_tools = ["delete_*"]

[mcp_servers.linear]
url = "https://mcp.linear.app/mcp"
bearer_token_env_var = "LINEAR_TOKEN"

[mcp_servers.off]
command = "x"
enabled = false
"""


def fake_home(root: Path) -> Places:
    """A home with one config per client (Linux paths), and a project directory."""
    home, cwd = root / "home", root / "project"
    files = {
        home / ".config/Claude/claude_desktop_config.json": json.dumps(
            {
                "mcpServers": {
                    "git": {"command": "uvx", "args": ["mcp-server-git"]},
                    "aggregator": {"command": "/opt/bin/aggregator", "args": ["serve"]},
                    "my server": {"command": "node", "args": ["s.js"], "env": {"TOKEN": "${TOKEN}"}},
                },
                "globalShortcut": "",
            }
        ),
        home / ".cursor/mcp.json": CURSOR_JSONC,
        home / ".config/Code/User/mcp.json": VSCODE_MCP,
        home / ".config/Code/User/settings.json": VSCODE_SETTINGS,
        home / ".codex/config.toml": CODEX_TOML,
        home / ".codeium/windsurf/mcp_config.json": '{"mcpServers": {"wind": {"serverUrl": "https://wind/mcp"}}}',
        home / ".claude.json": '{"numStartups": 3, "mcpServers": {"code": {"type": "stdio", "command": "code-mcp"}}}',
        cwd / ".mcp.json": '{"mcpServers": {"proj": {"command": "python", "args": ["-m", "aggregator", "serve"]}}}',
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return Places(home=home, cwd=cwd, platform="linux", environ={"HOME": str(home)})


def servers_of(places: Places, client: str, scope: str = "user") -> dict[str, Any]:
    (file,) = [f for f in client_files(places, (client,)) if f.scope == scope]
    return read_client_file(file).servers


def test_every_client_format_is_read(tmp_path: Path) -> None:
    places = fake_home(tmp_path)
    assert set(servers_of(places, "claude-desktop")) == {"git", "aggregator", "my server"}
    assert servers_of(places, "cursor")["git"]["args"] == ["mcp-server-git"]
    assert set(servers_of(places, "vscode")) == {"memory"}
    assert set(servers_of(places, "vscode", "user settings")) == {"web"}
    assert servers_of(places, "codex")["docs"]["startup_timeout_sec"] == 20
    assert set(servers_of(places, "windsurf")) == {"wind"}
    assert set(servers_of(places, "claude-code")) == {"code"}
    assert set(servers_of(places, "claude-code", "project")) == {"proj"}


def test_client_entries_translate_to_our_shape() -> None:
    assert translate({"url": "http://h/sse"}, "cursor") == ({"url": "http://h/sse", "transport": "sse"}, "")
    assert translate({"serverUrl": "https://w/mcp"}, "windsurf") == ({"url": "https://w/mcp"}, "")
    assert translate({"type": "http", "url": "https://w/sse"}, "vscode") == (
        {"url": "https://w/sse", "transport": "http"},
        "",
    )
    codex = tomllib.loads(CODEX_TOML)["mcp_servers"]
    assert translate(codex["docs"], "codex") == (
        {
            "command": "npx",
            "args": ["-y", "docs-mcp"],
            "env": {"API_KEY": "${DOCS_KEY}", "HOME_DIR": "${HOME_DIR}"},
            "timeouts": {"connect": 20, "call": 90},
            "tools": {"deny": ["delete_*"]},
        },
        "",
    )
    assert translate(codex["linear"], "codex")[0] == {
        "url": "https://mcp.linear.app/mcp",
        "headers": {"Authorization": "Bearer ${LINEAR_TOKEN}"},
    }
    assert translate(codex["off"], "codex") == (None, "disabled in the client")
    assert translate({"command": "x", "envFile": ".env"}, "vscode")[1].startswith("uses envFile")
    assert "not supported" in translate({"command": "x", "env": {"K": "${input:k}"}}, "vscode")[1]
    assert "neither command nor url" in translate({"args": ["x"]}, "cursor")[1]


# ---------------------------------------------------------------- conflicts


def source(client: str, servers: dict[str, Any]) -> ClientServers:
    return ClientServers(ClientFile(client, Path(f"/{client}.json"), "json", ("mcpServers",), "user"), servers)


def test_conflicts_merge_rename_and_skip() -> None:
    existing = {"git": {"command": "uvx", "args": ["mcp-server-git"], "description": "mine"}, "fs": {"command": "fs"}}
    plan = plan_import(
        existing,
        [
            source(
                "cursor",
                {
                    "git": {"command": "uvx", "args": ["mcp-server-git"]},  # identical endpoint: merged
                    "GIT": {"command": "uvx", "args": ["other"]},  # same name ignoring case, different: renamed
                    "files": {"command": "fs"},  # same server under another name: merged
                    "aggregator": {"command": "uvx", "args": ["aggregator", "serve"]},  # ourselves
                    "Aggregator": {"command": "other-agg"},  # the reserved name, another server: renamed
                    "a.b": {"command": "ab"},  # an invalid name, sanitised
                    "new": {"command": "new"},
                },
            ),
            source("claude-desktop", {"new": {"command": "different"}, "new2": {"command": "new"}}),
        ],
        target="/cfg.yaml",
        section="upstreams",
    )
    got = [(i.action, i.original, i.name) for i in plan.items]
    assert got == [
        ("same", "git", "git"),
        ("rename", "GIT", "GIT-cursor"),
        ("same", "files", "fs"),
        ("skip", "aggregator", "aggregator"),
        ("rename", "Aggregator", "Aggregator-cursor"),
        ("add", "a.b", "a_b"),
        ("add", "new", "new"),
        ("rename", "new", "new-claude-desktop"),
        ("same", "new2", "new"),
    ]
    notes = {i.name: i.note for i in plan.items}
    assert "names a different server" in notes["GIT-cursor"] and "reserved" in notes["Aggregator-cursor"]
    assert "as 'fs'" in notes["fs"] and "renamed from 'a.b'" in notes["a_b"]
    assert set(plan.additions()) == {"GIT-cursor", "Aggregator-cursor", "a_b", "new", "new-claude-desktop"}


# ---------------------------------------------------------------- the command


def run_import(places: Places, *args: str) -> Any:
    env = aggregator_env(HOME=str(places.home), XDG_CONFIG_HOME="", APPDATA="", CODEX_HOME="")
    return run_cli("import", *args, env=env, cwd=places.cwd)


ORIGINAL = "# my servers\nupstreams:\n  git:   # the one I use\n    command: uvx\n    args: [mcp-server-git]\n"


def home_with_config(root: Path) -> tuple[Places, Path]:
    """The fake home, and ./aggregator.yaml (ORIGINAL) in its project directory."""
    places = fake_home(root)
    config = places.cwd / "aggregator.yaml"
    config.write_text(ORIGINAL)
    return places, config


def test_import_shows_the_plan_and_writes_nothing(tmp_path: Path) -> None:
    places, config = home_with_config(tmp_path)
    done = run_import(places, "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["config"] == str(config) and plan["written"] is False
    actions = {(i["client"], i["original"]): i["action"] for i in plan["items"]}
    assert actions[("claude-desktop", "git")] == "same"
    assert actions[("claude-desktop", "aggregator")] == "skip" and actions[("claude-code", "proj")] == "skip"
    assert actions[("codex", "off")] == "skip" and actions[("codex", "docs")] == "add"
    assert config.read_text() == ORIGINAL
    table = run_import(places, "cursor").stdout
    assert "run with --write" in table and "remote" in table


def test_import_write_keeps_comments_backs_up_and_is_idempotent(tmp_path: Path) -> None:
    places, config = home_with_config(tmp_path)
    done = run_import(places, "--write")
    assert done.returncode == 0, done.stderr
    text = config.read_text()
    assert text.startswith(ORIGINAL) and "# the one I use" in text
    assert (places.cwd / "aggregator.yaml.bak").read_text() == ORIGINAL
    loaded = load_config(config, environ={"TOKEN": "t", "DOCS_KEY": "k", "HOME_DIR": "h", "LINEAR_TOKEN": "l"})
    assert {"my_server", "remote", "memory", "web", "docs", "linear", "wind", "code"} <= set(loaded.upstreams)
    assert loaded.upstreams["remote"].transport == "sse" and loaded.upstreams["docs"].timeouts.connect == 20
    again = run_import(places, "--write")
    assert "0 to add, 0 renamed" in again.stdout and "nothing to write" in again.stdout
    assert config.read_text() == text and not (places.cwd / "aggregator.yaml.bak.2").exists()


def test_import_creates_the_user_config_when_there_is_none(tmp_path: Path) -> None:
    places = fake_home(tmp_path)
    done = run_import(places, "windsurf", "--write")
    assert done.returncode == 0, done.stderr
    created = places.home / ".config" / "aggregator" / "aggregator.yaml"
    assert "(a new file)" in done.stdout and str(created) in done.stdout
    assert load_config(created, environ={}).upstreams["wind"].url == "https://wind/mcp"
    named = run_import(places, "windsurf", "--write", "--config", "new/agg.yaml")
    assert named.returncode == 0, named.stderr
    assert load_config(places.cwd / "new/agg.yaml", environ={}).upstreams["wind"].url == "https://wind/mcp"


def test_import_never_writes_into_a_broken_config_and_reports_broken_clients(tmp_path: Path) -> None:
    places = fake_home(tmp_path)
    (places.home / ".cursor/mcp.json").write_text('{"mcpServers": {"x": ')
    config = places.cwd / "aggregator.yaml"
    config.write_text("upstreams:\n  git: {comand: uvx}\n")
    done = run_import(places, "--write")
    assert done.returncode == 2 and "upstreams.git.comand" in done.stderr and done.stderr.count("\n") == 1
    assert config.read_text() == "upstreams:\n  git: {comand: uvx}\n" and not Path(f"{config}.bak").exists()
    config.write_text(ORIGINAL)
    done = run_import(places, "cursor", "codex", str(places.home / ".codeium/windsurf/mcp_config.json"))
    assert done.returncode == 0, done.stderr
    assert "problem: " in done.stdout and "mcp.json: not read (invalid JSON" in done.stdout
    assert "wind" in done.stdout and "docs" in done.stdout
    typo = run_import(places, "cursor", "nope")  # a word that is neither a client nor a file: a usage mistake
    assert typo.returncode == 2 and "'nope' is neither a client nor a file" in typo.stderr


def test_claude_code_local_scope_and_project_files_keep_their_project(tmp_path: Path) -> None:
    """`claude mcp add` writes ~/.claude.json projects.<dir>.mcpServers; project servers run in the project."""
    places, config = home_with_config(tmp_path)
    project = str(places.cwd.absolute())
    claude = json.loads((places.home / ".claude.json").read_text())
    local = {"command": "uvx", "args": ["mcp-server-git", "--repository", "."]}
    claude["projects"] = {project: {"mcpServers": {"local-git": local}}, "/elsewhere": {"mcpServers": {"no": local}}}
    (places.home / ".claude.json").write_text(json.dumps(claude))
    (places.cwd / ".mcp.json").write_text(json.dumps({"mcpServers": {"site": {"command": "node", "args": ["b.js"]}}}))
    assert servers_of(places, "claude-code", "local") == {"local-git": {**local, "cwd": project}}
    assert servers_of(places, "claude-code", "project")["site"]["cwd"] == project
    done = run_import(places, "claude-code", "--write")
    assert done.returncode == 0, done.stderr
    upstreams = load_config(config, environ={}).upstreams
    assert upstreams["local-git"].cwd == project and upstreams["local-git"].args[-1] == "."
    assert upstreams["site"].cwd == project and "no" not in upstreams and "code" in upstreams


def test_run_from_home_a_project_file_that_is_the_user_file_is_read_once() -> None:
    places = Places(home=Path("H"), cwd=Path("H"), platform="linux")
    cursor = [(f.scope, f.path.as_posix()) for f in client_files(places, ("cursor",))]
    assert cursor == [("user", "H/.cursor/mcp.json")]


def test_import_json_masks_the_secrets_it_would_write(tmp_path: Path) -> None:
    """`--json` shows the plan with secret-looking values masked; an `mcp-remote` entry's token, which the
    user kept in the client's env, stays there: the config gets the ``${AUTH_TOKEN}`` reference."""
    places, config = home_with_config(tmp_path)
    token = "sk-live-4f9a1c2e8b7d"
    desktop = places.home / ".config/Claude/claude_desktop_config.json"
    remote = {
        "command": "npx",
        "args": ["-y", "mcp-remote", "https://mcp.example/mcp", "--header", "Authorization:Bearer ${AUTH_TOKEN}"],
        "env": {"AUTH_TOKEN": token},
    }
    local = {"command": "node", "args": ["s.js"], "env": {"API_KEY": token, "MODE": "fast"}}
    desktop.write_text(json.dumps({"mcpServers": {"remote-api": remote, "local-api": local}}))
    done = run_import(places, "claude-desktop", "--json")
    assert done.returncode == 0, done.stderr
    assert token not in done.stdout + done.stderr
    entries = {i["original"]: i["entry"] for i in json.loads(done.stdout)["items"]}
    assert entries["remote-api"]["headers"] == {"Authorization": "***"}
    assert entries["remote-api"]["url"] == "https://mcp.example/mcp"
    assert entries["local-api"]["env"] == {"API_KEY": "***", "MODE": "fast"}
    carried = {i["original"]: i["carried"] for i in json.loads(done.stdout)["items"]}
    assert carried == {"remote-api": ["AUTH_TOKEN"], "local-api": []}  # names, never values
    written = run_import(places, "claude-desktop", "--write")
    assert written.returncode == 0 and token not in written.stdout + written.stderr
    assert "AUTH_TOKEN stays in the client's env: the aggregator needs it in its environment" in written.stdout
    remote_api = load_config(config, environ={"AUTH_TOKEN": "t"}).upstreams["remote-api"]
    assert remote_api.headers == {"Authorization": "Bearer t"}  # a reference, expanded where the aggregator runs
    assert "Bearer ${AUTH_TOKEN}" in config.read_text()
