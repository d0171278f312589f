"""A new user's first day, as the README tells it: an install on PATH, `init`, `add` two servers,
`install claude-desktop`, then a call through what the client starts. Real processes throughout."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.conftest import EXAMPLES, aggregator_env, structured
from tests.test_cli import run_cli
from tests.test_launcher import fake_script


def test_install_init_add_install_and_call(tmp_path: Path) -> None:
    home = tmp_path / "home"
    shim = fake_script(home / ".local/bin")  # what `pipx install` / `uv tool install` put on PATH
    env = aggregator_env(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        PATH=f"{shim.parent}{os.pathsep}{os.environ['PATH']}",
        AGGREGATOR_RUNTIME_DIR=str(tmp_path / "rt"),  # the service `connect` starts lives here, not in the user's
    )

    def cli(*args: str) -> str:
        done = run_cli(*args, env=env, cwd=home)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        return done.stdout

    assert "wrote " in cli("init", "--no-import")
    cli("add", "kit", "--", sys.executable, str(EXAMPLES / "testkit.py"))
    cli("add", "toolbox", "--", sys.executable, "-m", "aggregator.examples.toolbox")
    listed = cli("tools")
    assert "kit" in listed and "toolbox" in listed
    assert "moved behind it" in cli("install", "claude-desktop")

    desktop = json.loads((home / ".config/Claude/claude_desktop_config.json").read_text())
    entry = desktop["mcpServers"]["aggregator"]
    assert entry["command"] == str(shim)  # the command on PATH, not this checkout's venv
    assert cli("doctor", "--no-probe").rstrip().endswith("all well")

    async def through_the_client() -> tuple[list[str], str]:
        params = StdioServerParameters(command=entry["command"], args=entry["args"], env=env)
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            servers = structured(await session.call_tool("catalog_list_servers", {}))["servers"]
            echoed = await session.call_tool(
                "catalog_call_tool", {"server": "kit", "tool": "echo", "arguments": {"message": "first day"}}
            )
            return [s["name"] for s in servers], echoed.content[0].text  # type: ignore[union-attr]

    try:
        names, text = anyio.run(through_the_client)
    finally:  # the entry runs `connect`, which started the per-user service: stop it, as a user would
        stopped = run_cli("service", "stop", *entry["args"][1:], env=env, cwd=home)
        assert stopped.returncode == 0, stopped.stderr
    assert names == ["kit", "toolbox"] and text == "first day"
