"""Config loading: shapes, expansion, lookup order, filters, and one clear message per error."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggregator.config import (
    BUILTIN_SOURCE,
    AggregatorConfig,
    ConfigError,
    Timeouts,
    ToolFilter,
    UpstreamConfig,
    find_config_path,
    load_config,
    parse_config,
)
from aggregator.settings import Settings, load_settings, resolve_data_dir

ROOT = Path(__file__).resolve().parent.parent


def parse(text: str, environ: dict[str, str] | None = None, source: str = "/cfg/aggregator.yaml") -> AggregatorConfig:
    return parse_config(textwrap.dedent(text), source, environ=environ or {})


def error_of(text: str, environ: dict[str, str] | None = None, source: str = "/cfg/aggregator.yaml") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(textwrap.dedent(text), source, environ=environ or {}, strict=True)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(source)
    assert ". Fix: " in message
    return info.value


# ----------------------------------------------------------------------------- valid configs


def test_minimal_upstreams_shape_with_inferred_transports_and_defaults() -> None:
    config = parse(
        """
        upstreams:
          git: {command: uvx, args: [mcp-server-git]}
          docs: {url: "http://127.0.0.1:9000/mcp"}
          old: {url: "http://127.0.0.1:9001/sse"}
        """
    )
    assert list(config.upstreams) == ["docs", "git", "old"]
    git, docs, old = config.upstreams["git"], config.upstreams["docs"], config.upstreams["old"]
    assert (git.transport, git.command, git.args) == ("stdio", "uvx", ["mcp-server-git"])
    assert (docs.transport, docs.url) == ("http", "http://127.0.0.1:9000/mcp")
    # In our own shape a url means streamable HTTP unless `transport: sse` says otherwise.
    assert old.transport == "http"
    assert git.start == "lazy" and git.expose == "catalog" and git.pin == []
    assert git.timeouts == Timeouts(connect=10.0, call=60.0)
    assert config.max_result_bytes == 262144
    assert config.source == "/cfg/aggregator.yaml"


@pytest.mark.parametrize("text", ["", "# only a comment\n", "upstreams: {}\n", "upstreams:\n", "mcpServers: {}\n"])
def test_empty_configs_have_no_upstreams(text: str) -> None:
    config = parse(text)
    assert config.upstreams == {}
    assert config.timeouts == Timeouts()


def test_every_upstream_key_is_read() -> None:
    config = parse(
        """
        defaults:
          timeouts: {connect: 3, call: 30}
          max_result_bytes: 4096
        upstreams:
          git:
            command: uvx
            args: [mcp-server-git, --port, 3000]
            env: {GIT_PAGER: cat, DEPTH: 5}
            cwd: /srv/repo
            transport: stdio
            description: "  Git operations  "
            capabilities: [git, diff, git]
            start: eager
            expose: direct
            pin: [git_log]
            tools: {allow: ["git_*"], deny: [git_reset]}
            timeouts: {call: 90}
        """
    )
    git = config.upstreams["git"]
    assert git.args == ["mcp-server-git", "--port", "3000"]  # numbers are read as strings
    assert git.env == {"GIT_PAGER": "cat", "DEPTH": "5"}
    assert git.cwd == "/srv/repo"
    assert git.description == "Git operations"
    assert git.capabilities == ["git", "diff"]
    assert (git.start, git.expose, git.pin) == ("eager", "direct", ["git_log"])
    assert git.tools == ToolFilter(allow=["git_*"], deny=["git_reset"])
    assert git.timeouts == Timeouts(connect=3, call=90)  # merged with the global defaults
    assert config.timeouts == Timeouts(connect=3, call=30)
    assert config.max_result_bytes == 4096


def test_sse_and_http_with_headers() -> None:
    config = parse(
        """
        upstreams:
          legacy: {url: "http://h/sse", transport: sse, headers: {X-Key: abc}}
          modern: {url: "http://h/mcp", transport: http}
        """
    )
    assert config.upstreams["legacy"].transport == "sse"
    assert config.upstreams["legacy"].headers == {"X-Key": "abc"}
    assert config.upstreams["modern"].transport == "http"


def test_relative_cwd_is_relative_to_the_config_file(tmp_path: Path) -> None:
    config = parse("upstreams: {a: {command: x, cwd: sub/dir}}", source=str(tmp_path / "agg.yaml"))
    assert config.upstreams["a"].cwd == str(tmp_path / "sub" / "dir")


def test_secrets_are_kept_out_of_repr() -> None:
    config = parse(
        """
        upstreams:
          a: {command: x, env: {KEY: env-secret-value}}
          b: {url: "http://h/mcp", headers: {Authorization: "Bearer header-secret-value"}}
        """
    )
    text = repr(config)
    assert "env-secret-value" not in text and "header-secret-value" not in text
    assert config.upstreams["a"].env == {"KEY": "env-secret-value"}


# ----------------------------------------------------------------------------- expansion


def test_variable_expansion_in_every_expanded_key() -> None:
    environ = {"BIN": "/opt/bin", "DIR": "/work", "HOST": "example.org", "TOKEN": "t0k", "HOME": "/home/u"}
    config = parse(
        """
        upstreams:
          local:
            command: ${BIN}/server
            args: ["--root", "${DIR}/data", "${MISSING:-fallback}", "cost: $$5", "$BIN stays", "${env:HOST}"]
            env: {ROOT: "${DIR}", LEVEL: "${LEVEL:-info}"}
            cwd: ${DIR}
          remote:
            url: "https://${HOST}/mcp"
            headers: {Authorization: "Bearer ${TOKEN}"}
        """,
        environ,
    )
    local, remote = config.upstreams["local"], config.upstreams["remote"]
    assert local.command == "/opt/bin/server"
    assert local.args == ["--root", "/work/data", "fallback", "cost: $5", "$BIN stays", "example.org"]
    assert local.env == {"ROOT": "/work", "LEVEL": "info"}
    assert local.cwd == "/work"
    assert remote.url == "https://example.org/mcp"
    assert remote.headers == {"Authorization": "Bearer t0k"}


def test_default_applies_to_an_empty_variable_and_empty_default_is_allowed() -> None:
    config = parse('upstreams: {a: {command: x, args: ["${EMPTY:-dflt}", "${UNSET:-}", "${EMPTY}"]}}', {"EMPTY": ""})
    assert config.upstreams["a"].args == ["dflt", "", ""]


def test_description_is_not_expanded() -> None:
    config = parse('upstreams: {a: {command: x, description: "costs ${PRICE}"}}')
    assert config.upstreams["a"].description == "costs ${PRICE}"


def test_aggregator_python_defaults_to_the_running_interpreter() -> None:
    text = "upstreams: {a: {command: '${AGGREGATOR_PYTHON}', args: [-m, mod]}}"
    assert parse(text).upstreams["a"].command == sys.executable
    assert parse(text, {"AGGREGATOR_PYTHON": "/usr/bin/python3.12"}).upstreams["a"].command == "/usr/bin/python3.12"


def test_tilde_is_expanded_in_command_and_cwd_only() -> None:
    config = parse("upstreams: {a: {command: ~/bin/srv, cwd: '~', args: [~/notes]}}", {"HOME": "/home/u"})
    upstream = config.upstreams["a"]
    assert upstream.command == "/home/u/bin/srv"
    assert upstream.cwd == "/home/u"
    assert upstream.args == ["~/notes"]


def test_unset_variable_names_upstream_key_and_variable() -> None:
    err = error_of(
        """
        upstreams:
          docs:
            url: "http://h/mcp"
            headers:
              Authorization: "Bearer ${DOCS_TOKEN}"
        """
    )
    assert err.key == "upstreams.docs.headers.Authorization"
    assert err.line == 6
    assert "DOCS_TOKEN is not set" in str(err)
    assert "${DOCS_TOKEN:-default}" in err.fix


@pytest.mark.parametrize(
    ("snippet", "key"),
    [
        ("{command: '${NOPE}'}", "upstreams.a.command"),
        ("{command: x, args: [ok, '${NOPE}']}", "upstreams.a.args[1]"),
        ("{command: x, env: {K: '${NOPE}'}}", "upstreams.a.env.K"),
        ("{command: x, cwd: '${NOPE}'}", "upstreams.a.cwd"),
        ("{url: 'http://${NOPE}/mcp'}", "upstreams.a.url"),
    ],
)
def test_unset_variable_key_paths(snippet: str, key: str) -> None:
    err = error_of(f"upstreams:\n  a: {snippet}\n")
    assert err.key == key
    assert "NOPE" in err.problem


def test_expansion_errors_never_show_the_value() -> None:
    err = error_of('upstreams: {a: {url: "http://h/mcp", headers: {X-Key: "sk-live-123 ${MISSING}"}}}')
    assert "sk-live-123" not in str(err)
    err = error_of('upstreams: {a: {url: "http://h/mcp", headers: {X-Key: "sk-live-123 ${unclosed"}}}')
    assert "sk-live-123" not in str(err)
    assert "not closed" in err.problem


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("${input:api-key}", "${input:...}"),
        ("${9bad}", "valid variable name"),
        ("${}", "valid variable name"),
    ],
)
def test_unsupported_references(value: str, expected: str) -> None:
    err = error_of(f"upstreams: {{a: {{command: x, args: ['{value}']}}}}")
    assert expected in err.problem


@given(st.text(alphabet=st.sampled_from('$${}:-_aZ9 ~"\\/'), max_size=40))
def test_escaping_every_dollar_round_trips(text: str) -> None:
    escaped = text.replace("$", "$$")
    config = parse_config(
        "upstreams: {a: {command: x, args: [ARG]}}".replace("ARG", _yaml_quote(escaped)), "t.yaml", environ={}
    )
    assert config.upstreams["a"].args == [text]


def _yaml_quote(text: str) -> str:
    import json

    return json.dumps(text)  # a JSON string is a valid YAML double-quoted scalar


# ----------------------------------------------------------------------------- client files


CLAUDE_DESKTOP = """{
  "mcpServers": {
    "filesystem": {
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-filesystem", "/Users/me/Desktop", "/Users/me/Downloads"]
    },
    "github": {
      "command": "docker",
      "args": ["run", "-i", "--rm", "-e", "GITHUB_PERSONAL_ACCESS_TOKEN", "ghcr.io/github/github-mcp-server"],
      "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "${GITHUB_TOKEN}"}
    },
    "remote-api": {
      "type": "http",
      "url": "https://api.example.com/mcp",
      "headers": {"Authorization": "Bearer ${API_TOKEN}"}
    },
    "events": {"type": "sse", "url": "https://api.example.com/sse"},
    "kilo": {"type": "streamable-http", "url": "https://kilo.example.com/mcp"},
    "cursor": {"url": "http://localhost:8000/sse"},
    "windsurf": {"serverUrl": "https://w.example.com/mcp"},
    "old-tool": {
      "command": "node",
      "args": ["/path/to/server.js"],
      "disabled": true,
      "autoApprove": [],
      "alwaysAllow": ["read"],
      "timeout": 60
    },
    "cline": {
      "command": "node", "args": ["s.js"], "transportType": "stdio", "autoApprove": ["x"], "timeout": 30
    }
  },
  "globalShortcut": "Ctrl+Space"
}
"""


def test_claude_desktop_style_json_works_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(CLAUDE_DESKTOP)
    config = load_config(path, environ={"GITHUB_TOKEN": "ghp_x", "API_TOKEN": "tok"}, cwd=tmp_path)
    assert list(config.upstreams) == [
        "cline",
        "cursor",
        "events",
        "filesystem",
        "github",
        "kilo",
        "remote-api",
        "windsurf",
    ]
    assert config.disabled == ["old-tool"]
    up = config.upstreams
    assert up["filesystem"].transport == "stdio" and up["filesystem"].args[-1] == "/Users/me/Downloads"
    assert up["github"].env == {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_x"}
    assert up["remote-api"].transport == "http"
    assert up["remote-api"].headers == {"Authorization": "Bearer tok"}
    assert up["events"].transport == "sse"
    assert up["kilo"].transport == "http"
    assert up["cursor"].transport == "sse"  # a client reads a bare .../sse url as SSE
    assert (up["windsurf"].transport, up["windsurf"].url) == ("http", "https://w.example.com/mcp")
    assert up["cline"].transport == "stdio"


@pytest.mark.parametrize(
    ("type_value", "expected"),
    [
        ("http", "http"),
        ("streamable-http", "http"),
        ("streamableHttp", "http"),
        ("streamable_http", "http"),
        ("stdio", "stdio"),
        ("sse", "sse"),
        ("SSE", "sse"),
    ],
)
def test_client_type_aliases(type_value: str, expected: str) -> None:
    endpoint = '"command": "x"' if expected == "stdio" else '"url": "http://h/x"'
    config = parse(f'{{"mcpServers": {{"s": {{"type": "{type_value}", {endpoint}}}}}}}', source="c.json")
    assert config.upstreams["s"].transport == expected


def test_vscode_jsonc_with_servers_comments_tabs_and_trailing_commas(tmp_path: Path) -> None:
    text = (
        "{\n"
        "\t// VS Code writes JSONC\n"
        '\t"inputs": [{"type": "promptString", "id": "k"}],\n'
        '\t"servers": {\n'
        '\t\t"memory": {"type": "stdio", "command": "npx", "args": ["-y", "server-memory",],},\n'
        "\t\t/* a block\n\t\t   comment */\n"
        '\t\t"web": {"type": "http", "url": "https://x.example/mcp//path"},\n'
        "\t},\n"
        "}\n"
    )
    config = parse_config(text, str(tmp_path / "mcp.json"), environ={})
    assert config.upstreams["memory"].args == ["-y", "server-memory"]
    assert config.upstreams["web"].url == "https://x.example/mcp//path"  # '//' inside a string is kept


def test_env_file_is_loaded_and_env_wins(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("# secrets\nexport A=1\nB='two words'\nC=3 # note\n")
    config = parse_config(
        '{"mcpServers": {"s": {"command": "x", "envFile": ".env", "env": {"A": "override"}}}}',
        str(tmp_path / "mcp.json"),
        environ={},
    )
    assert config.upstreams["s"].env == {"A": "override", "B": "two words", "C": "3"}


def test_env_file_errors(tmp_path: Path) -> None:
    source = str(tmp_path / "mcp.json")
    with pytest.raises(ConfigError, match="was not found"):
        parse_config('{"mcpServers": {"s": {"command": "x", "envFile": "nope.env"}}}', source, environ={})
    (tmp_path / "bad.env").write_text("GOOD=1\nthis line is secret-ish\n")
    with pytest.raises(ConfigError) as info:
        parse_config('{"mcpServers": {"s": {"command": "x", "envFile": "bad.env"}}}', source, environ={})
    assert info.value.line == 2 and "secret-ish" not in str(info.value)


def test_client_keys_are_not_accepted_in_our_own_shape() -> None:
    err = error_of("upstreams: {a: {command: x, disabled: true}}")
    assert err.key == "upstreams.a.disabled"


def test_client_file_ignores_foreign_top_level_keys_but_not_misspelt_ones() -> None:
    assert parse('{"mcpServers": {}, "preferences": {"x": 1}}', source="c.json").upstreams == {}
    err = error_of('{"mcpServers": {}, "defualts": {}}', source="c.json")
    assert err.key == "defualts" and "'defaults'" in err.fix


def test_conflicting_transport_keys() -> None:
    err = error_of('{"mcpServers": {"s": {"type": "sse", "transport": "http", "url": "http://h"}}}', source="c.json")
    assert err.key == "mcpServers.s.type"


# ----------------------------------------------------------------------------- errors


def test_bad_yaml_names_the_line() -> None:
    err = error_of("upstreams:\n  git:\n    command: uvx\n   args: [a\n")
    assert err.line is not None and err.line >= 4
    assert "invalid YAML" in err.problem
    assert str(err).startswith(f"/cfg/aggregator.yaml:{err.line}: ")


def test_bad_json_names_the_line() -> None:
    err = error_of('{\n  "mcpServers": {\n    "a": {"command": "x",}\n    "b": {}\n  }\n}\n', source="/c/mcp.json")
    assert err.line == 4
    assert "invalid JSON" in err.problem


@pytest.mark.parametrize("source", ["/cfg/a.yaml", "/cfg/a.json"])
def test_duplicate_names_are_rejected(source: str) -> None:
    text = '{"upstreams": {"git": {"command": "a"},\n "git": {"command": "b"}}}'
    err = error_of(text, source=source)
    assert "the key 'git' appears twice" in err.problem
    if source.endswith(".yaml"):
        assert err.line == 2


def test_unknown_key_suggests_the_closest_and_names_the_line() -> None:
    err = error_of(
        """
        upstreams:
          git:
            comand: uvx
        """
    )
    assert err.key == "upstreams.git.comand"
    assert err.line == 4
    assert "did you mean 'command'?" in err.fix
    assert str(err) == "/cfg/aggregator.yaml:4: upstreams.git.comand: unknown key. Fix: did you mean 'command'?"


@pytest.mark.parametrize(
    ("text", "key", "suggestion"),
    [
        ("upstream: {}", "upstream", "'upstreams'"),
        ("upstreams: {a: {command: x, tools: {alow: [x]}}}", "upstreams.a.tools.alow", "'allow'"),
        ("upstreams: {a: {command: x, timeouts: {cal: 3}}}", "upstreams.a.timeouts.cal", "'call'"),
        ("defaults: {timeouts: {conect: 3}}", "defaults.timeouts.conect", "'connect'"),
        ("defaults: {max_result_byte: 3000}", "defaults.max_result_byte", "'max_result_bytes'"),
        ("upstreams: {a: {Command: x}}", "upstreams.a.Command", "'command'"),
        ("upstreams: {a: {command: x, zzzzzz: 1}}", "upstreams.a.zzzzzz", "valid keys here"),
    ],
)
def test_unknown_keys_at_every_level(text: str, key: str, suggestion: str) -> None:
    err = error_of(text)
    assert err.key == key
    assert "unknown key" in err.problem
    assert suggestion in err.fix


@pytest.mark.parametrize(
    ("text", "key", "fix_words"),
    [
        ("upstreams: {a: {command: x, args: --verbose}}", "upstreams.a.args", "list of strings"),
        ("upstreams: {a: {command: x, args: [yes]}}", "upstreams.a.args[0]", "booleans"),
        ("upstreams: {a: {command: x, env: [A]}}", "upstreams.a.env", "mapping"),
        ("upstreams: {a: {command: x, start: sometimes}}", "upstreams.a.start", "start: lazy"),
        ("upstreams: {a: {command: x, expose: all}}", "upstreams.a.expose", "expose: catalog"),
        ("upstreams: {a: {command: x, timeouts: {call: -1}}}", "upstreams.a.timeouts.call", "positive"),
        ("upstreams: {a: {command: x, timeouts: {call: .inf}}}", "upstreams.a.timeouts.call", "positive"),
        ("upstreams: {a: {command: x, tools: {deny: delete}}}", "upstreams.a.tools.deny", "allow: [glob"),
        ("upstreams: {a: {command: x, transport: grpc}}", "upstreams.a.transport", "stdio, http or sse"),
        ("defaults: {max_result_bytes: 100}", "defaults.max_result_bytes", "at least 1024"),
        ("upstreams: [a, b]", "upstreams", "NAME"),
        ("upstreams: {a: [command, x]}", "upstreams.a", "NAME:"),
        ("upstreams: {a: }", "upstreams.a", "command:"),
        ("- just a list", None, "upstreams:"),
    ],
)
def test_wrong_types(text: str, key: str | None, fix_words: str) -> None:
    err = error_of(text)
    assert err.key == key
    assert fix_words in err.fix


def test_more_problems_are_counted() -> None:
    err = error_of("upstreams: {a: {command: x, args: 1, start: soon, expose: all}}")
    assert "(and 2 more problems)" in err.problem


def test_both_command_and_url() -> None:
    err = error_of("upstreams: {a: {command: x, url: 'http://h/mcp'}}")
    assert err.key == "upstreams.a"
    assert "both command and url" in err.problem
    assert "command" in err.fix and "url" in err.fix


def test_neither_command_nor_url() -> None:
    err = error_of("upstreams: {a: {description: nothing to run}}")
    assert err.key == "upstreams.a"
    assert "neither command nor url" in err.problem


@pytest.mark.parametrize(
    ("snippet", "key"),
    [
        ("{url: 'http://h', args: [x]}", "upstreams.a.args"),
        ("{url: 'http://h', env: {A: b}}", "upstreams.a.env"),
        ("{command: x, headers: {A: b}}", "upstreams.a.headers"),
        ("{command: x, transport: http}", "upstreams.a.transport"),
        ("{url: 'http://h', transport: stdio}", "upstreams.a.transport"),
    ],
)
def test_settings_of_the_other_kind_of_server(snippet: str, key: str) -> None:
    assert error_of(f"upstreams:\n  a: {snippet}\n").key == key


@pytest.mark.parametrize("name", ["my server", "git.hub", "ünï", "a/b"])
def test_bad_names(name: str) -> None:
    err = error_of(f'{{"upstreams": {{"{name}": {{"command": "x"}}}}}}')
    assert err.key == f"upstreams.{name}"
    assert "only letters, digits" in err.problem
    assert "rename it" in err.fix


@pytest.mark.parametrize("name", ["aggregator", "Aggregator", "AGGREGATOR"])
def test_reserved_name(name: str) -> None:
    err = error_of(f"upstreams: {{{name}: {{command: x}}}}")
    assert "reserved" in err.problem


def test_names_equal_ignoring_case() -> None:
    err = error_of("upstreams: {Git: {command: x}, git: {command: y}}")
    assert err.key == "upstreams.git"
    assert "'Git' and 'git' differ only in case" in err.problem


def test_upstreams_and_mcpservers_together() -> None:
    err = error_of("upstreams: {}\nmcpServers: {}\n")
    assert err.key == "mcpServers"
    assert "both upstreams: and mcpServers:" in err.problem


def test_pinned_tool_hidden_by_the_filter() -> None:
    err = error_of("upstreams: {a: {command: x, pin: [ok, delete_all], tools: {deny: [delete_*]}}}")
    assert err.key == "upstreams.a.pin[1]"


def test_missing_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.yaml", environ={}, cwd=tmp_path)
    assert str(info.value).startswith(str(tmp_path / "nope.yaml") + ": config file not found. Fix: ")
    assert "--config" in info.value.fix
    with pytest.raises(ConfigError) as info:
        load_config(None, environ={"AGGREGATOR_CONFIG": "gone.yaml"}, cwd=tmp_path)
    assert info.value.file == str(tmp_path / "gone.yaml")
    assert "AGGREGATOR_CONFIG" in info.value.fix
    with pytest.raises(ConfigError, match="directory"):
        load_config(tmp_path, environ={}, cwd=tmp_path)


def test_config_error_format() -> None:
    err = ConfigError("f.yaml", "upstreams.a", "bad thing.", "do this.", line=3)
    assert str(err) == "f.yaml:3: upstreams.a: bad thing. Fix: do this."
    assert str(ConfigError("f.yaml", None, "multi\nline", "fix")) == "f.yaml: multi line. Fix: fix."


# ----------------------------------------------------------------------------- lookup order


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return home / "aggregator"


def _write(path: Path, name: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"upstreams: {{{name}: {{command: x}}}}\n")
    return path


def test_lookup_order(tmp_path: Path, user_dir: Path) -> None:
    work = tmp_path / "work"
    explicit = _write(tmp_path / "explicit.yaml", "explicit")
    from_env = _write(tmp_path / "env.yaml", "from_env")
    local = _write(work / "aggregator.yaml", "local")
    user = _write(user_dir / "aggregator.yaml", "user")
    environ = {"AGGREGATOR_CONFIG": str(from_env)}

    assert find_config_path(explicit, environ, work) == explicit
    assert find_config_path(None, environ, work) == from_env
    assert find_config_path(None, {}, work) == local
    assert list(load_config(None, environ={}, cwd=work).upstreams) == ["local"]
    local.unlink()
    assert find_config_path(None, {}, work) == user
    user.unlink()
    assert find_config_path(None, {}, work) is None
    builtin = load_config(None, environ={}, cwd=work)
    assert builtin.source == BUILTIN_SOURCE
    assert list(builtin.upstreams) == ["notes", "toolbox"]


def test_explicit_paths_expand_tilde_and_resolve_against_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    config_file = _write(tmp_path / "conf" / "a.yaml", "a")
    assert find_config_path("~/conf/a.yaml", {}, Path("/")) == config_file
    assert find_config_path("conf/a.yaml", {}, tmp_path) == config_file
    assert find_config_path(None, {"AGGREGATOR_CONFIG": "conf/a.yaml"}, tmp_path) == config_file


# ----------------------------------------------------------------------------- filters and exposure


@pytest.mark.parametrize(
    ("allow", "deny", "tool", "expected"),
    [
        (None, [], "anything", True),
        ([], [], "anything", False),
        (["read_*"], [], "read_file", True),
        (["read_*"], [], "write_file", False),
        (["read_*"], ["read_secret*"], "read_secrets", False),
        (None, ["delete_*"], "delete_all", False),
        (None, ["delete_*"], "Delete_all", True),  # case-sensitive
        (["get_?"], [], "get_x", True),
        (["[gs]et"], [], "set", True),
    ],
)
def test_tool_filter(allow: list[str] | None, deny: list[str], tool: str, expected: bool) -> None:
    assert ToolFilter(allow=allow, deny=deny).allows(tool) is expected


def test_is_direct() -> None:
    pinned = UpstreamConfig(name="a", transport="stdio", command="x", pin=["search"])
    assert pinned.is_direct("search") and not pinned.is_direct("other")
    direct = UpstreamConfig(name="b", transport="http", url="http://h/mcp", expose="direct")
    assert direct.is_direct("anything")


def test_upstream_config_rejects_inconsistent_construction() -> None:
    with pytest.raises(ValueError):
        UpstreamConfig(name="a", transport="http", command="x")
    with pytest.raises(ValueError):
        UpstreamConfig(name="bad name", transport="stdio", command="x")


# ----------------------------------------------------------------------------- shipped configs


def test_example_config_parses() -> None:
    environ = {"DOCS_TOKEN": "example-token", "HOME": "/home/u"}
    config = load_config(ROOT / "config" / "example.yaml", environ=environ, cwd=ROOT)
    assert set(config.upstreams) == {"docs", "files", "git", "legacy", "tracker"}
    assert config.upstreams["tracker"].auth == "oauth" and config.upstreams["tracker"].scopes == ["issues:read"]
    docs = config.upstreams["docs"]
    assert docs.headers == {"Authorization": "Bearer example-token"}
    assert docs.expose == "direct" and docs.start == "eager"
    assert config.upstreams["legacy"].transport == "sse"
    assert config.upstreams["git"].is_direct("git_status")
    assert not config.upstreams["git"].tools.allows("git_reset")
    assert config.upstreams["git"].timeouts == Timeouts(connect=10, call=120)


def test_example_config_without_docs_token_serves_the_others() -> None:
    config = load_config(ROOT / "config" / "example.yaml", environ={"HOME": "/h"}, cwd=ROOT)
    assert set(config.upstreams) == {"files", "git", "tracker", "legacy"}
    assert list(config.broken) == ["docs"]
    assert config.broken["docs"].startswith("upstreams.docs.headers.Authorization: ")
    assert "DOCS_TOKEN is not set" in config.broken["docs"] and "Fix: " in config.broken["docs"]


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("{url: 'http://h/mcp', headers: {A: 'Bearer ${UNSET_TOKEN}'}}", "UNSET_TOKEN is not set"),
        ("{command: x, args: ['${input:key}']}", "${input:...}"),
        ("{url: 'ws://h', transport: websocket}", "unknown transport 'websocket'"),
    ],
)
def test_an_entry_unusable_here_disables_that_upstream_alone(entry: str, problem: str) -> None:
    config = parse(f"upstreams:\n  bad: {entry}\n  good: {{command: y}}\n")
    assert list(config.upstreams) == ["good"] and problem in config.broken["bad"]
    assert "sk-" not in config.broken["bad"]
    with pytest.raises(ConfigError):  # a typo is still the whole file's problem
        parse(f"upstreams:\n  bad: {entry}\n  good: {{comand: y}}\n")


def test_default_config_runs_the_examples_with_this_interpreter() -> None:
    link = ROOT / "config" / "default.yaml"
    assert link.is_symlink() and os.readlink(link) == "../aggregator/default_config.yaml"
    config = parse_config(link.read_text(), str(link), environ={})
    assert list(config.upstreams) == ["notes", "toolbox"]
    toolbox = config.upstreams["toolbox"]
    assert toolbox.command == sys.executable
    assert toolbox.args == ["-m", "aggregator.examples.toolbox"]
    assert toolbox.description.startswith("General utilities")
    assert toolbox.capabilities
    assert config.upstreams["notes"].args == ["-m", "aggregator.examples.notes"]


# ----------------------------------------------------------------------------- settings


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGGREGATOR_LOG_LEVEL", "INFO")
    monkeypatch.setenv("AGGREGATOR_TOKEN", "s3cret")
    monkeypatch.setenv("AGGREGATOR_MAX_RESULT_BYTES", "2048")
    monkeypatch.setenv("AGGREGATOR_CONFIG", "")  # empty = unset
    monkeypatch.setenv("AGGREGATOR_PYTHON", "/usr/bin/python3")  # not a setting: ignored
    settings = load_settings()
    assert settings.log_level == "info"
    assert settings.token is not None and settings.token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(settings)
    assert settings.max_result_bytes == 2048
    assert settings.config is None


@pytest.mark.parametrize(
    ("variable", "value"), [("AGGREGATOR_LOG_LEVEL", "loud"), ("AGGREGATOR_MAX_RESULT_BYTES", "12")]
)
def test_bad_settings_are_config_errors(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.key == variable


def test_resolve_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data-home"))
    monkeypatch.delenv("AGGREGATOR_DATA_DIR", raising=False)
    assert resolve_data_dir(None, Settings()) == tmp_path / "data-home" / "aggregator"
    assert resolve_data_dir(None, Settings(data_dir=tmp_path / "env")) == tmp_path / "env"
    assert resolve_data_dir(tmp_path / "flag", Settings(data_dir=tmp_path / "env")) == tmp_path / "flag"
    monkeypatch.setenv("AGGREGATOR_DATA_DIR", str(tmp_path / "from-env"))
    assert resolve_data_dir(None, load_settings()) == tmp_path / "from-env"


# ----------------------------------------------------------------------------- hostile files (issue 11)


def billion_laughs(levels: int, width: int = 9) -> str:
    """The classic alias bomb: a few hundred bytes that expand to width**levels nodes."""
    lines = ["l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    for level in range(1, levels):
        lines.append(f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("levels", [9, 10])
def test_alias_bombs_are_rejected_before_they_expand(levels: int) -> None:
    err = error_of(billion_laughs(levels))
    assert "aliases expand the document past" in err.problem


def test_aliases_within_the_limit_still_work() -> None:
    config = parse(
        """
        upstreams:
          one: {command: x, env: &env {A: "1", B: "2"}}
          two: {command: y, env: *env}
        """
    )
    assert config.upstreams["two"].env == {"A": "1", "B": "2"}


@pytest.mark.parametrize("text", ["a: &a [*a]\n", "upstreams: &u {x: *u}\n", "a: &a {b: [1, {c: *a}]}\n"])
def test_self_referencing_aliases_are_one_error(text: str) -> None:
    err = error_of(text)
    assert "inside its own anchor" in err.problem and err.line == 1


@pytest.mark.parametrize("source", ["/cfg/a.yaml", "/cfg/a.json"])
@pytest.mark.parametrize("depth", [100, 5000, 100_000])
def test_deep_nesting_is_one_error(source: str, depth: int) -> None:
    err = error_of("[" * depth + "]" * depth, source=source)
    assert "nested" in err.problem


@pytest.mark.parametrize("char", ["\x00", "\x07", "\x1b", "\ufffe"])
def test_control_characters_are_one_error_with_the_line(char: str) -> None:
    err = error_of(f"upstreams:\n  a: {{command: x{char}}}\n")
    assert "is not allowed in YAML" in err.problem and err.line == 2
    assert char not in str(err)


@pytest.mark.parametrize("text", ["", "# just a comment\n", "\ufeff", "\ufeff# c\n", "\n\n", "---\n"])
def test_empty_files_load_as_no_upstreams(tmp_path: Path, text: str) -> None:
    path = tmp_path / "aggregator.yaml"
    path.write_text(text, encoding="utf-8")
    assert load_config(path, environ={}, cwd=tmp_path).upstreams == {}


@pytest.mark.parametrize("name", ["abc\n", "abc\r\n", "\nabc", "abc\t"])
def test_names_must_match_entirely(name: str) -> None:
    import json

    err = error_of(json.dumps({"upstreams": {name: {"command": "x"}}}))
    assert "only letters, digits" in err.problem
    assert "\n" not in str(err)
    with pytest.raises(ValueError, match="does not match"):
        UpstreamConfig(name=name, transport="stdio", command="x")


def test_jsonc_errors_name_the_line_and_column() -> None:
    err = error_of('{\n  // c\n  "mcpServers": {"a": {"command": "x"}} oops\n}\n', source="/c/mcp.json")
    assert err.line == 3 and "invalid JSON" in err.problem and "column" in err.problem
    assert "invalid JSON" in error_of("", source="/c/mcp.json").problem


def test_a_url_must_be_http_unless_a_variable_gives_all_of_it() -> None:
    """A literal url is checked where it is written (`localhost:8080/mcp` has no scheme); one that a variable
    gives whole is the environment's, and a variable inside an http URL is fine."""
    with pytest.raises(ConfigError, match=r"upstreams\.d\.url: url is not an http:// or https:// address"):
        parse("upstreams:\n  d: {url: 'localhost:8080/mcp'}\n")
    ok = parse_config(
        "upstreams:\n  a: {url: '${DOCS_URL}'}\n  b: {url: 'HTTPS://${HOST:-h}/mcp'}\n",
        "c.yaml",
        environ={"DOCS_URL": "http://127.0.0.1:9/mcp"},
    )
    assert ok.upstreams["a"].url == "http://127.0.0.1:9/mcp" and ok.upstreams["b"].url == "HTTPS://h/mcp"
    with pytest.raises(ConfigError, match="command is empty"):
        parse("upstreams:\n  c: {command: ' '}\n")
