"""Per-upstream `prefix:` (issue 19, item 3): keep the upstream's own names, or choose the prefix.

A tool or prompt name claimed twice (two upstreams, or an upstream and one of our own tools) is a
configuration error naming both, at start-up (names known from snapshots) and at hot reload.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggregator.catalog.model import Catalog, clean_tool
from aggregator.config import AggregatorConfig, ConfigError, parse_config
from aggregator.proxy.exposure import MAX_NAME, OWN, Clash, build_direct_tools, exposed_name
from aggregator.proxy.server import AggregatorServer
from aggregator.upstream.pool import UpstreamPool
from tests.conftest import aggregator_client, aggregator_env, kit_upstream, structured, write_config

STRICT = re.compile(r"[A-Za-z0-9_-]{1,64}")


def config_of(upstreams: dict[str, Any]) -> AggregatorConfig:
    return parse_config(json.dumps({"upstreams": upstreams}), "test.yaml")


def test_exposed_names_follow_the_prefix_and_stay_strict() -> None:
    assert exposed_name("git", "status") == "git__status"  # the default is unchanged
    assert exposed_name("git", "status", "") == "status"
    assert exposed_name("git", "status", "g_") == "g_status"
    long, dotted = "x" * 80, "read.file"
    for prefix in (None, "", "g_"):
        for tool in (long, dotted):
            name = exposed_name("git", tool, prefix)
            assert STRICT.fullmatch(name) and len(name) <= MAX_NAME
            assert name != exposed_name("other", tool, prefix)  # the hash names the upstream


def test_prefix_values_are_checked_at_load() -> None:
    assert config_of({"a": kit_upstream(prefix=False)}).upstreams["a"].name_prefix == ""
    assert config_of({"a": kit_upstream(prefix="gh_")}).upstreams["a"].name_prefix == "gh_"
    assert config_of({"a": kit_upstream()}).upstreams["a"].name_prefix == "a__"
    with pytest.raises(ConfigError, match="prefix") as bad:
        config_of({"a": kit_upstream(prefix="no spaces")})
    assert "Fix:" in str(bad.value)


def test_an_upstream_tool_named_like_our_own_is_a_clash_and_ours_stays() -> None:
    catalog = Catalog("a", (clean_tool("a", {"name": "catalog_search_tools", "inputSchema": {"type": "object"}}),))
    clashes: list[Clash] = []
    table = build_direct_tools({"a": catalog}, {"a": lambda _t: True}, ["catalog_search_tools"], {"a": ""}, clashes)
    assert table == {}
    assert clashes == [Clash("tool", "catalog_search_tools", OWN, "a")]
    assert "one of the aggregator's own tools and by upstream 'a'" in clashes[0].message()


async def test_own_names_and_a_chosen_prefix_over_stdio(tmp_path: Path) -> None:
    upstreams = {
        "plain": kit_upstream("--tag", "p", expose="direct", prefix=False),
        "other": kit_upstream("--tag", "o", expose="direct", prefix="o_"),
    }
    async with aggregator_client(write_config(tmp_path, upstreams)) as session:
        names = {tool.name for tool in (await session.list_tools()).tools}
        assert {"echo", "pid", "o_echo", "o_pid", "catalog_search_tools"} <= names
        assert not any(name.startswith(("plain__", "other__")) for name in names)
        pid = (await session.call_tool("pid", {})).content[0].text  # type: ignore[union-attr]
        plain = await session.call_tool("catalog_call_tool", {"server": "plain", "tool": "pid"})
        assert pid == plain.content[0].text  # type: ignore[union-attr]
        prompts = {prompt.name for prompt in (await session.list_prompts()).prompts}
        assert prompts == {"greet", "review_code", "o_greet", "o_review_code"}
        got = await session.get_prompt("o_greet", {"name": "Ada"})
        assert "Ada" in got.messages[0].content.text  # type: ignore[union-attr]


async def test_a_name_claimed_twice_is_a_config_error_naming_both_at_start(tmp_path: Path) -> None:
    upstreams = {name: kit_upstream(expose="direct", prefix=False) for name in ("a", "b")}
    config = write_config(tmp_path, upstreams)
    data = ("--data-dir", str(tmp_path / "data"))
    async with aggregator_client(config, *data) as session:  # no snapshot yet: found once both list
        names = [tool.name for tool in (await session.list_tools()).tools]
        assert names.count("echo") == 1  # the first by name keeps it
        pid = (await session.call_tool("pid", {})).content[0].text  # type: ignore[union-attr]
        assert pid == (await session.call_tool("catalog_call_tool", {"server": "a", "tool": "pid"})).content[0].text  # type: ignore[union-attr]
        assert structured(await session.call_tool("catalog_list_servers", {}))["servers"]
    done = subprocess.run(
        [sys.executable, "-m", "aggregator", "serve", "--config", str(config), *data],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        env=aggregator_env(),
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    line = done.stderr.strip().splitlines()[-1]
    assert "config error" in line and "upstream 'a'" in line and "upstream 'b'" in line and "prefix" in line


async def test_a_reload_that_would_claim_a_name_twice_is_refused(tmp_path: Path) -> None:
    upstreams = {name: kit_upstream(expose="direct") for name in ("a", "b")}
    async with UpstreamPool.running(config_of(upstreams)) as pool:
        server = AggregatorServer(pool, data_dir=tmp_path, max_result_bytes=262144)
        async with server.running():
            assert set((await pool.start_all()).values()) == {None}
            before = pool.config
            clashing = {name: kit_upstream(expose="direct", prefix=False) for name in ("a", "b")}
            with pytest.raises(ConfigError, match="claimed by upstream 'a' and by upstream 'b'"):
                pool.apply_config(config_of(clashing))
            assert pool.config is before
            diff = pool.apply_config(config_of({"a": upstreams["a"], "b": kit_upstream(expose="direct", prefix="b_")}))
            assert diff.changed == ["b"]


@given(
    st.dictionaries(
        st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True),
        st.tuples(
            st.one_of(st.none(), st.just(""), st.from_regex(r"[A-Za-z0-9_-]{1,32}", fullmatch=True)),
            st.lists(st.text(min_size=1, max_size=80).filter(str.strip), max_size=5, unique=True),
        ),
        max_size=4,
    )
)
def test_any_names_and_prefixes_give_strict_unique_names_or_named_clashes(
    servers: dict[str, tuple[str | None, list[str]]],
) -> None:
    """Whatever the names and prefixes: every exposed name is strict, each is exposed once, and each
    entry left out is a clash naming its first owner."""
    catalogs = {
        server: Catalog(
            server, tuple(clean_tool(server, {"name": t, "inputSchema": {"type": "object"}}) for t in tools)
        )
        for server, (_prefix, tools) in servers.items()
    }
    prefixes = {server: prefix for server, (prefix, _tools) in servers.items() if prefix is not None}
    clashes: list[Clash] = []
    table = build_direct_tools(
        catalogs, dict.fromkeys(catalogs, lambda _t: True), ["catalog_search_tools"], prefixes, clashes
    )
    assert all(STRICT.fullmatch(name) for name in table)
    assert "catalog_search_tools" not in table
    entries = sum(len(catalog.tools) for catalog in catalogs.values())
    assert len(table) + len(clashes) == entries
    for clash in clashes:
        assert clash.name in table or clash.first == OWN
        assert clash.second != clash.first


async def test_a_reload_renames_prompts_and_direct_tools(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream(expose="direct")})
    async with aggregator_client(config) as session:

        async def names() -> set[str]:
            tools = (await session.list_tools()).tools
            prompts = (await session.list_prompts()).prompts
            return {t.name for t in tools} | {p.name for p in prompts}

        assert {"kit__echo", "kit__greet"} <= await names()
        write_config(tmp_path, {"kit": kit_upstream(expose="direct", prefix="k_")})
        with anyio.fail_after(30):
            while not {"k_echo", "k_greet"} <= (seen := await names()):
                await anyio.sleep(0.2)
        assert not any(name.startswith("kit__") for name in seen)
        echoed = await session.call_tool("k_echo", {"message": "hi"})
        assert not echoed.is_error and echoed.content[0].text == "hi"  # type: ignore[union-attr]


async def test_a_reload_adding_an_upstream_whose_snapshot_claims_a_taken_name_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    plain = kit_upstream(expose="direct", prefix=False)
    async with UpstreamPool.running(config_of({"b": plain}), data) as pool:  # b's catalog, on disk
        assert await pool.start_all() == {"b": None}
        await pool.flush_snapshots()
    async with UpstreamPool.running(config_of({"a": plain}), data) as pool:
        server = AggregatorServer(pool, data_dir=tmp_path, max_result_bytes=262144)
        async with server.running():
            assert await pool.start_all() == {"a": None}
            with pytest.raises(ConfigError, match="claimed by upstream 'a' and by upstream 'b'"):
                pool.apply_config(config_of({"a": plain, "b": plain}))
            assert list(pool.config.upstreams) == ["a"]
