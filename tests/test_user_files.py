"""Nothing of a user's config is lost by install, uninstall or import --write (issue 20, items 1-4).

The property test drives the commands' own functions in-process (fast enough for hypothesis)
over real files, with an editor that writes the files between commands and inside a command's
read-to-write window; the CLI tests run the real `aggregator` command.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from aggregator.cli import clients as commands
from aggregator.config import load_config
from aggregator.config.client_files import ClientFile, Places, parse_document, read_client_file
from aggregator.config.errors import ConfigError
from aggregator.config.roundtrip import FileChanged, write_atomic
from aggregator.config.yamlfile import parse_yaml
from tests.test_install import Home

# ---------------------------------------------------------------- the write path


def test_write_refuses_a_file_changed_since_it_was_read(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text('{"a": 1}')
    read = path.read_text()
    path.write_text('{"a": 1, "theirs": true}')  # an editor, meanwhile
    with pytest.raises(FileChanged):
        write_atomic(path, '{"mine": 1}', expected=read)
    assert path.read_text() == '{"a": 1, "theirs": true}' and list(tmp_path.iterdir()) == [path]
    with pytest.raises(FileChanged):
        write_atomic(tmp_path / "new.json", "{}", expected="{}")  # expected a file that is not there
    write_atomic(path, '{"mine": 1}', expected='{"a": 1, "theirs": true}')
    assert path.read_text() == '{"mine": 1}'


def test_write_goes_through_a_symlink_and_keeps_the_mode(tmp_path: Path) -> None:
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    real = dotfiles / "mcp.json"
    real.write_text("{}")
    real.chmod(0o640)
    link = tmp_path / "mcp.json"
    link.symlink_to(real)
    write_atomic(link, '{"x": 1}', expected="{}")
    assert link.is_symlink() and real.read_text() == '{"x": 1}'
    assert stat.S_IMODE(real.stat().st_mode) == 0o640 and sorted(p.name for p in dotfiles.iterdir()) == ["mcp.json"]


# ---------------------------------------------------------------- the commands over real files


def _cursor_home(root: Path) -> tuple[Places, ClientFile, Path]:
    home, project = root / "home", root / "project"
    (home / ".cursor").mkdir(parents=True)
    project.mkdir()
    places = Places(home=home, cwd=project, platform="linux", environ={"XDG_CONFIG_HOME": str(home / ".config")})
    file = commands.user_file("cursor", places)
    config = project / "aggregator.yaml"
    config.write_text("# mine\nupstreams: {}\n")
    return places, file, config


def test_install_twice_then_uninstall_keeps_what_came_between(tmp_path: Path) -> None:
    places, file, config = _cursor_home(tmp_path)
    file.path.write_text(json.dumps({"theme": "light", "mcpServers": {"a": {"command": "run-a"}}}))
    commands.install_client(file, config, places, dry_run=False)
    _edit_json(file.path, lambda d: d.update(theme="dark") or d["mcpServers"].update(b={"command": "run-b"}))
    commands.install_client(file, config, places, dry_run=False)
    assert len(list(file.path.parent.glob("mcp.json.aggregator-backup-*"))) == 1
    commands.uninstall_client(file)
    after = json.loads(file.path.read_text())
    assert after == {"theme": "dark", "mcpServers": {"a": {"command": "run-a"}, "b": {"command": "run-b"}}}
    assert sorted(p.name for p in file.path.parent.iterdir()) == ["mcp.json"]


def test_codex_toml_install_twice_then_uninstall_keeps_what_came_between(tmp_path: Path) -> None:
    places, _, config = _cursor_home(tmp_path)
    file = commands.user_file("codex", places)
    file.path.parent.mkdir(parents=True)
    file.path.write_text('model = "o3"  # mine\n\n[mcp_servers.a]\ncommand = "run-a"\n')
    commands.install_client(file, config, places, dry_run=False)
    edited = file.path.read_text() + '\n[mcp_servers.b]\ncommand = "run-b"\n'
    file.path.write_text(edited.replace('model = "o3"', 'model = "o4"'))
    commands.install_client(file, config, places, dry_run=False)
    commands.uninstall_client(file)
    after = parse_document(file.path.read_text(), file)
    assert after["model"] == "o4" and after["mcp_servers"] == {"a": {"command": "run-a"}, "b": {"command": "run-b"}}


def test_an_entry_using_a_client_variable_stays_in_the_client(tmp_path: Path) -> None:
    places, file, config = _cursor_home(tmp_path)
    servers = {
        "ws": {"command": "node", "args": ["${workspaceFolder}/server.js"]},
        "tok": {"command": "x", "env": {"T": "${input:token}"}},
        "plain": {"command": "run-plain", "env": {"H": "${env:HOME}"}},
    }
    file.path.write_text(json.dumps({"mcpServers": servers}))
    line = commands.install_client(file, config, places, dry_run=False)
    assert "2 kept in the client (ws, tok" in line
    kept = json.loads(file.path.read_text())["mcpServers"]
    assert kept["ws"] == servers["ws"] and kept["tok"] == servers["tok"] and "plain" not in kept
    assert set(load_config(config, environ={"HOME": "/h"}).upstreams) == {"plain"}  # the config still loads


# ---------------------------------------------------------------- the property


class Editor:
    """The user, in an editor or a client that rewrites its file: every edit is remembered."""

    def __init__(self, file: Path, config: Path, windows: bool = False) -> None:
        self.file, self.config = file, config
        self.settings: dict[str, int] = {"theme": 0}
        self.servers: dict[str, dict[str, str]] = {"a": {"command": "run-a"}, "b": {"command": "run-b"}}
        self.yaml_servers: set[str] = set()
        text = '{\n  // mine\n  "theme": 0,\n  "mcpServers": ' + json.dumps(self.servers) + "\n}\n"
        file.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode() if windows else text.encode())

    def edit(self, kind: str, number: int) -> None:
        if kind == "yaml":
            name = f"y{number}"
            self.config.write_text(self.config.read_text() + f"# edit {number}\n")
            text = self.config.read_text()
            data = parse_yaml(text, "c")[0] or {}
            if not isinstance(data.get("upstreams"), dict) or name in data["upstreams"]:
                return
            text = text.replace("upstreams: {}", "upstreams:") if "upstreams: {}" in text else text
            self.config.write_text(text + f"  {name}:\n    command: run-{name}\n")
            self.yaml_servers.add(name)
            return
        data = parse_document(self.file.read_text(), _file(self.file)) if self.file.exists() else {}
        servers = data.setdefault("mcpServers", {})
        if kind == "setting":
            self.settings[f"s{number % 3}"] = number
            data[f"s{number % 3}"] = number
        elif kind == "add":
            self.servers[f"u{number}"] = servers[f"u{number}"] = {"command": f"run-u{number}"}
        elif kind == "remove":
            mine = sorted(name for name in servers if name in self.servers)
            if not mine:
                return
            gone = mine[number % len(mine)]
            del servers[gone], self.servers[gone]
        self.file.write_text(json.dumps(data, indent=1))

    def check(self, uninstalled: bool) -> None:
        data = parse_document(self.file.read_text(), _file(self.file))
        for key, value in self.settings.items():
            assert data.get(key) == value, f"setting {key} lost"
        in_client = data.get("mcpServers", {})
        upstreams = load_config(self.config, environ={}).upstreams
        behind = {u.command for u in upstreams.values()}
        for name, entry in self.servers.items():
            if uninstalled:
                assert in_client.get(name) == entry, f"server {name} not back in the client"
            else:
                assert in_client.get(name) == entry or entry["command"] in behind, f"server {name} lost"
        assert self.yaml_servers <= set(upstreams), "an upstream written into aggregator.yaml lost"
        for name in set(in_client) - set(self.servers) - {"aggregator"}:
            raise AssertionError(f"server {name} came back after the user removed it")


def _file(path: Path) -> ClientFile:
    return ClientFile("cursor", path, "json", ("mcpServers",), "user")


def _edit_json(path: Path, change: Any) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@contextmanager
def _editor_inside_the_write(editor: Editor, edit: tuple[str, int] | None) -> Iterator[None]:
    """The editor writes once, after the command read the files and before it replaces one."""
    real = commands.write_atomic
    pending = [edit] if edit else []

    def racing(path: Path, content: str | bytes, *, expected: str | None) -> None:
        if pending:
            editor.edit(*pending.pop())
        real(path, content, expected=expected)

    commands.write_atomic = racing  # type: ignore[assignment]
    try:
        yield
    finally:
        commands.write_atomic = real  # type: ignore[assignment]


EDITS = st.tuples(st.sampled_from(["setting", "add", "remove", "yaml"]), st.integers(0, 30))
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("edit"), EDITS),
        st.tuples(st.sampled_from(["install", "uninstall", "import"]), st.one_of(st.none(), EDITS)),
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=STEPS)
@example(steps=[("install", None), ("edit", ("add", 1)), ("install", None), ("uninstall", None)])  # item 1
@example(steps=[("install", ("setting", 1)), ("uninstall", ("add", 2)), ("uninstall", None)])  # item 2
def test_no_interleaving_loses_anything_of_the_users(tmp_path_factory: pytest.TempPathFactory, steps: list) -> None:
    places, file, config = _cursor_home(tmp_path_factory.mktemp("user"))
    editor = Editor(file.path, config, windows=len(steps) % 2 == 1)  # CRLF and a BOM, or LF
    for step, argument in steps:
        if step == "edit":
            editor.edit(*argument)
            editor.check(uninstalled=False)
            continue
        uninstalled = False
        with _editor_inside_the_write(editor, argument):
            try:
                if step == "install":
                    commands._retried(lambda: commands.install_client(file, config, places, dry_run=False))
                elif step == "uninstall":
                    commands._retried(lambda: commands.uninstall_client(file))
                    uninstalled = argument is None  # an edit inside it may add what uninstall cannot know
                else:
                    read = [read_client_file(file)]
                    commands._retried(lambda: commands.import_once(config, places, read, write=True))  # noqa: B023
            except commands.NotInstalled:
                pass
            except ConfigError as exc:  # a refusal is fine, if it loses nothing
                assert isinstance(exc, FileChanged), exc
        editor.check(uninstalled=uninstalled)


# ---------------------------------------------------------------- the real command


def test_cli_symlinked_client_config_and_config_stay_links(tmp_path: Path) -> None:
    home = Home(tmp_path, "cursor", None)
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    kit = {"command": sys.executable, "args": ["-c", "pass"]}
    (dotfiles / "mcp.json").write_text(json.dumps({"mcpServers": {"kit": kit}}))
    (dotfiles / "mcp.json").chmod(0o600)
    home.file.symlink_to(dotfiles / "mcp.json")
    (dotfiles / "aggregator.yaml").write_text(home.config.read_text())
    home.config.unlink()
    home.config.symlink_to(dotfiles / "aggregator.yaml")
    done = home.run("install", "cursor")
    assert done.returncode == 0, done.stderr
    assert home.file.is_symlink() and "aggregator" in json.loads((dotfiles / "mcp.json").read_text())["mcpServers"]
    assert home.config.is_symlink() and "kit:" in (dotfiles / "aggregator.yaml").read_text()
    assert stat.S_IMODE((dotfiles / "mcp.json").stat().st_mode) == 0o600
    done = home.run("uninstall", "cursor")
    assert done.returncode == 0, done.stderr
    assert home.file.is_symlink() and json.loads((dotfiles / "mcp.json").read_text()) == {"mcpServers": {"kit": kit}}


def test_cli_install_twice_then_uninstall_keeps_later_edits(tmp_path: Path) -> None:
    original = json.dumps({"mcpServers": {"kit": {"command": "run-kit"}}})
    home = Home(tmp_path, "cursor", original)
    assert home.run("install", "cursor").returncode == 0
    _edit_json(home.file, lambda d: d.update(theme="dark") or d["mcpServers"].update(later={"command": "run-later"}))
    assert home.run("install", "cursor").returncode == 0
    done = home.run("uninstall", "cursor")
    assert done.returncode == 0, done.stderr
    after = json.loads(home.file.read_text())
    assert after["theme"] == "dark" and set(after["mcpServers"]) == {"kit", "later"}
    assert home.backups() == [] and os.listdir(home.file.parent) == ["mcp.json"]


def test_a_crlf_file_with_a_bom_comes_back_byte_for_byte(tmp_path: Path) -> None:
    places, file, config = _cursor_home(tmp_path)
    original = b'\xef\xbb\xbf{\r\n  "mcpServers": {"a": {"command": "run-a"}}\r\n}\r\n'
    file.path.write_bytes(original)
    commands.install_client(file, config, places, dry_run=False)
    assert "aggregator" in json.loads(file.path.read_text())["mcpServers"]
    commands.uninstall_client(file)
    assert file.path.read_bytes() == original


def test_a_client_that_keeps_rewriting_its_file_gets_a_refusal_and_loses_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    places, file, config = _cursor_home(tmp_path)
    file.path.write_text(json.dumps({"mcpServers": {"a": {"command": "run-a"}}}))
    real, writes = commands.write_atomic, [0]

    def client_rewrites(path: Path, content: str | bytes, *, expected: str | None) -> None:
        if path == file.path:
            writes[0] += 1
            _edit_json(file.path, lambda d: d.update(edits=writes[0]))
        real(path, content, expected=expected)

    monkeypatch.setattr(commands, "write_atomic", client_rewrites)
    code = commands._retrying(file, lambda: commands.install_client(file, config, places, dry_run=False))
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "nothing was written" in err and writes[0] == commands.ATTEMPTS
    assert json.loads(file.path.read_text()) == {"mcpServers": {"a": {"command": "run-a"}}, "edits": 3}
    assert sorted(p.name for p in file.path.parent.iterdir()) == ["mcp.json"]  # no backup left behind
