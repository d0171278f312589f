"""Every request kind starts its owning upstream on need (issue 19, item 1), over real stdio upstreams.

A fresh aggregator has no catalog and no snapshot: a prompt, a resource or a template read must
start the upstreams that may own it, direct ones first, and look again; what none owns is a clear
error, and an upstream that cannot start harms nothing else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from tests.conftest import aggregator_client, kit_upstream, structured, write_config


async def states(session: ClientSession) -> dict[str, str]:
    servers = structured(await session.call_tool("catalog_list_servers", {}))["servers"]
    return {s["name"]: s["state"] for s in servers}


def text(result: Any) -> str:
    return str(result.contents[0].text)


async def test_prompt_get_on_a_fresh_aggregator_starts_the_direct_upstream_first(tmp_path: Path) -> None:
    upstreams = {"direct": kit_upstream("--tag", "d", expose="direct"), "lazy": kit_upstream("--tag", "l")}
    async with aggregator_client(write_config(tmp_path, upstreams)) as session:
        got = await session.get_prompt("direct__greet", {"name": "Ada"})
        assert got.messages[0].content.text == "Say hello to Ada in one friendly sentence."  # type: ignore[union-attr]
        assert await states(session) == {"direct": "ready", "lazy": "configured"}  # found in the first round

        got = await session.get_prompt("lazy__greet", {"name": "Bo"})  # the next round starts the others
        assert "Bo" in got.messages[0].content.text  # type: ignore[union-attr]
        assert await states(session) == {"direct": "ready", "lazy": "ready"}


async def test_resource_and_template_reads_on_a_fresh_aggregator(tmp_path: Path) -> None:
    async with aggregator_client(write_config(tmp_path, {"kit": kit_upstream()})) as session:
        assert text(await session.read_resource("testkit://items/7")) == "item 7"  # a template, nothing listed yet
    fresh = ("--data-dir", str(tmp_path / "fresh"))  # no snapshot of the session above
    async with aggregator_client(write_config(tmp_path, {"kit": kit_upstream()}), *fresh) as session:
        assert "pid" in text(await session.read_resource("testkit://status"))  # a listed resource


async def test_listings_start_direct_upstreams_only(tmp_path: Path) -> None:
    upstreams = {"direct": kit_upstream(expose="direct"), "lazy": kit_upstream()}
    async with aggregator_client(write_config(tmp_path, upstreams)) as session:
        prompts = {p.name for p in (await session.list_prompts()).prompts}
        assert prompts == {"direct__greet", "direct__review_code"}  # a newcomer sees them on the first listing
        assert {str(r.uri) for r in (await session.list_resources()).resources} >= {"testkit://status"}
        assert await states(session) == {"direct": "ready", "lazy": "configured"}


async def test_what_no_upstream_owns_is_a_clear_error_and_a_broken_upstream_harms_nothing(tmp_path: Path) -> None:
    upstreams = {"broken": {"command": str(tmp_path / "no-such-server")}, "kit": kit_upstream()}
    async with aggregator_client(write_config(tmp_path, upstreams)) as session:
        with pytest.raises(MCPError, match="unknown prompt 'nobody__greet'"):
            await session.get_prompt("nobody__greet", {})
        with pytest.raises(MCPError) as unread:
            await session.read_resource("nowhere://x")
        assert unread.value.code == -32002 and "nowhere://x" in unread.value.message
        with pytest.raises(MCPError, match="unknown prompt"):
            await session.complete(types.PromptReference(type="ref/prompt", name="x"), {"name": "a", "value": "b"})
        found = await states(session)
        assert found["kit"] == "ready" and found["broken"] in {"backoff", "failed"}
        got = await session.get_prompt("kit__greet", {"name": "Cy"})  # the broken one is in backoff: not retried
        assert "Cy" in got.messages[0].content.text  # type: ignore[union-attr]
