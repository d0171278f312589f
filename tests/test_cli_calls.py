"""`aggregator tools / describe / call`: the catalog tools from a shell, on real upstreams."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aggregator.cli.calls import parse_call_arguments
from tests.conftest import aggregator_client, example, kit_upstream, run_main, structured, write_config
from tests.test_cli import run_cli


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_config(
        tmp_path,
        {"kit": kit_upstream(description="scriptable test server"), "toolbox": example("toolbox", description="tb")},
    )


def test_tools_lists_servers_without_starting_them(config: Path) -> None:
    done = run_cli("tools", "--config", str(config), "--json")
    assert done.returncode == 0, done.stderr
    servers = {s["name"]: s for s in json.loads(done.stdout)["servers"]}
    assert servers["kit"]["state"] == "configured" and servers["kit"]["description"] == "scriptable test server"
    table = run_cli("tools", "--config", str(config)).stdout.splitlines()
    assert table[0].split() == ["name", "transport", "state", "tools", "description"]
    assert table[2].split()[:3] == ["kit", "stdio", "configured"]


def test_tools_of_one_server_lists_every_tool(config: Path) -> None:
    done = run_cli("tools", "toolbox", "--config", str(config), "--json")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["total"] == len(payload["items"]) == 24
    table = run_cli("tools", "kit", "--config", str(config))
    rows = {line.split()[0]: line for line in table.stdout.splitlines()[2:]}
    assert {"echo", "add", "fail"} <= set(rows) and "message" in rows["echo"]


def test_unknown_server_exits_2_with_the_known_names(config: Path) -> None:
    done = run_cli("tools", "nope", "--config", str(config))
    assert done.returncode == 2 and done.stdout == ""
    assert "no upstream named 'nope'" in done.stderr and "kit, toolbox" in done.stderr


def test_describe_shows_schema_and_a_call_line(config: Path) -> None:
    done = run_cli("describe", "kit", "add", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert '"a": {' in done.stdout and "call: aggregator call kit add a=<a> b=<b>" in done.stdout
    payload = json.loads(run_cli("describe", "kit", "add", "--config", str(config), "--json").stdout)
    assert payload["required"] == ["a", "b"] and payload["output_schema"]["required"] == ["sum"]
    missing = run_cli("describe", "kit", "nope", "--config", str(config))
    assert missing.returncode == 2 and "kit has no tool 'nope'" in missing.stderr


def test_call_prints_content_and_reads_values_by_schema(config: Path) -> None:
    echoed = run_cli("call", "kit", "echo", "message=123", "--config", str(config))
    assert (echoed.returncode, echoed.stdout) == (0, "123\n")  # a string argument stays as written
    added = run_cli("call", "kit", "add", "a=2", "b=3.5", "--config", str(config))
    assert (added.returncode, added.stdout) == (0, "5.5\n")  # numbers are read as JSON
    image = run_cli("call", "kit", "image", "--config", str(config))
    assert image.stdout.splitlines()[0].startswith("[image: image/png, about")


def test_call_error_result_exits_1(config: Path) -> None:
    done = run_cli("call", "kit", "fail", "--args", '{"message": "it broke"}', "--config", str(config))
    assert done.returncode == 1 and "it broke" in done.stderr and done.stdout == ""


@pytest.mark.parametrize(
    ("extra", "expected"),
    [(["--args", "[1"], "not JSON"), (["--args", "[1]"], "JSON object"), (["message"], "not key=value")],
)
def test_call_usage_errors_exit_2(config: Path, extra: list[str], expected: str) -> None:
    done = run_cli("call", "kit", "echo", *extra, "--config", str(config))
    assert done.returncode == 2 and expected in done.stderr and done.stderr.count("\n") == 1


async def test_call_json_is_what_an_mcp_client_gets(config: Path) -> None:
    """Same code path: the CLI's --json result equals catalog_call_tool's result over MCP."""
    cli = run_cli("call", "kit", "add", "--args", '{"a": 1}', "b=2", "--json", "--config", str(config))
    assert cli.returncode == 0, cli.stderr
    async with aggregator_client(config) as session:
        over_mcp = await session.call_tool(
            "catalog_call_tool", {"server": "kit", "tool": "add", "arguments": {"a": 1, "b": 2}}
        )
        listed = structured(await session.call_tool("catalog_list_tools", {"server": "toolbox", "limit": 200}))
    wire = over_mcp.model_dump(mode="json", by_alias=True, exclude_none=True)
    wire.pop("resultType", None)  # the client model's protocol-era field, not part of the tool's result
    assert json.loads(cli.stdout) == wire
    tools = json.loads(run_cli("tools", "toolbox", "--json", "--config", str(config)).stdout)
    assert tools["items"] == listed["items"]


def test_parse_call_arguments() -> None:
    schema = {"properties": {"s": {"type": "string"}, "n": {"type": "integer"}}}
    assert parse_call_arguments('{"s": "x", "n": 1}', ["n=2", "s=true", 'o={"k": [1]}', "w=a b"], schema) == {
        "s": "true",
        "n": 2,
        "o": {"k": [1]},
        "w": "a b",
    }
    assert parse_call_arguments(None, ["e="], {}) == {"e": ""}


def test_a_mistyped_parameter_is_named_with_a_guess_and_refused_where_the_schema_forbids_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    strict = {"name": "strict", "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}}}
    strict["inputSchema"]["additionalProperties"] = False
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps([strict]))
    config = write_config(tmp_path, {"kit": kit_upstream("--extra-tools", str(extra))})
    typo = run_main(capsys, "call", "kit", "echo", "mesage=hi", "message=hello", "--config", str(config))
    assert typo.returncode == 0 and typo.stdout == "hello\n"  # sent as given: the tool may take it
    note = "aggregator call: note: echo has no parameter 'mesage' (did you mean 'message'?); its parameters: message"
    assert typo.stderr == f"{note}; sent as given\n"
    fine = run_main(capsys, "call", "kit", "echo", "message=hello", "--config", str(config))
    assert (fine.returncode, fine.stderr) == (0, "")
    refused = run_main(capsys, "call", "kit", "strict", "pth=/tmp", "x=1", "--config", str(config))
    assert refused.returncode == 2 and refused.stdout == "" and refused.stderr.count("\n") == 1
    assert "strict has no parameters 'pth', 'x' (did you mean 'path'?); its parameters: path" in refused.stderr


def test_a_call_without_a_required_argument_says_which_and_how(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not the tool's validator dump (several lines of pydantic text): one line naming what is missing, the
    typo that is probably why, and the command line that gives everything; exit 2, nothing sent."""
    typo = ["tme=12:00", "from_zone=UTC"]
    done = run_main(capsys, "call", "toolbox", "convert_timezone", *typo, "--config", str(config))
    assert (done.returncode, done.stdout, done.stderr.count("\n")) == (2, "", 1), done.stderr
    assert "convert_timezone needs time, to_zone (not given; convert_timezone has no parameter 'tme'" in done.stderr
    assert "(did you mean 'time'?)" in done.stderr
    assert "e.g. aggregator call toolbox convert_timezone time=<time> from_zone=<from_zone> to_zone=<to_zone>" in (
        done.stderr
    )
    bare = run_main(capsys, "call", "kit", "add", "--config", str(config))
    assert bare.returncode == 2 and "add needs a, b (not given)" in bare.stderr and "validation" not in bare.stderr
    given = run_main(capsys, "call", "kit", "add", "--args", '{"a": 1, "b": 2}', "--config", str(config))
    assert (given.returncode, given.stdout) == (0, "3\n")
