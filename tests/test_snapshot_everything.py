"""Snapshots carry what a client sees before an upstream starts (issue 19, item 4), with server-everything.

server-everything lists 13 tools to a client declaring nothing and 17 to one declaring roots,
sampling and elicitation. A snapshot records the capabilities it was listed under: a client
offering more gets the upstream started instead of the smaller list, and a snapshot listed under
the same set serves it without a start. Instructions come from the snapshot before any start.
Skipped unless `.ci/install-servers` has installed the servers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import ClientSession

from aggregator.catalog.model import Catalog, clean_tool
from aggregator.catalog.snapshot import SnapshotError, decode, encode
from tests.conftest import aggregator_client, aggregator_env, structured
from tests.test_official_servers import EVERYTHING_CAPABILITY_TOOLS
from tests.test_passthrough_everything import Host, everything_config


def snapshot_of(data: Path) -> dict[str, object]:
    """The one snapshot file of upstream `everything` (named `everything.<definition digest>.json`)."""
    [path] = (data / "catalogs").glob("everything.*.json")
    return dict(json.loads(path.read_text()))


async def test_a_second_session_sees_the_instructions_and_all_17_tools(tmp_path: Path) -> None:
    config = everything_config(tmp_path, expose="direct")
    data = tmp_path / "data"
    refresh = [sys.executable, "-m", "aggregator", "refresh", "--config", str(config), "--data-dir", str(data)]
    done = subprocess.run(refresh, capture_output=True, text=True, timeout=120, env=aggregator_env(), check=False)
    assert done.returncode == 0, done.stderr
    written = snapshot_of(data)  # the CLI offers no capabilities: the smaller list, recorded as such
    assert written["offered"] == [] and isinstance(written["tools"], list) and len(written["tools"]) == 13
    said = written["instructions"]
    assert isinstance(said, str) and said

    async def listings(session: ClientSession) -> list[object]:
        prompts = (await session.list_prompts()).prompts
        resources = (await session.list_resources()).resources
        templates = (await session.list_resource_templates()).resource_templates
        return [item.model_dump() for item in (*prompts, *resources, *templates)]

    async def session_sees(started: str) -> None:
        host = Host()
        async with aggregator_client(config, "--data-dir", str(data), **host.callbacks()) as session:
            before = await listings(session)  # from the snapshot: nothing started yet
            assert len(before) > 10
            assert f"From everything: {said[:200]}" in session.initialize_result.instructions  # type: ignore[union-attr]
            servers = structured(await session.call_tool("catalog_list_servers", {}))["servers"]
            assert servers[0]["instructions"] and servers[0]["state"] == "configured"  # from the snapshot
            tools = {t.name for t in (await session.list_tools()).tools if t.name.startswith("everything__")}
            assert len(tools) == 17
            assert {f"everything__{name}" for name in EVERYTHING_CAPABILITY_TOOLS} <= tools
            servers = structured(await session.call_tool("catalog_list_servers", {}))["servers"]
            assert servers[0]["state"] == started
            assert await listings(session) == before  # the live session lists the same

    await session_sees("ready")  # the snapshot fell short of what this client offers: started
    assert snapshot_of(data)["offered"] == ["elicitation", "roots", "sampling"]
    await session_sees("configured")  # a snapshot listed under the same set serves it: no start


def test_the_offered_capabilities_round_trip_and_older_snapshots_read_as_unrecorded() -> None:
    catalog = Catalog("s", (clean_tool("s", {"name": "t", "inputSchema": {"type": "object"}}),), offered=("roots",))
    document = encode(catalog, "sha256:x")
    assert decode(document, "s", lambda _name: False)[0].offered == ("roots",)
    older = {key: value for key, value in document.items() if key != "offered"}
    assert decode(older, "s", lambda _name: False)[0].offered is None
    with pytest.raises(SnapshotError, match="offered"):
        decode({**document, "offered": "roots"}, "s", lambda _name: False)
