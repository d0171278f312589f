"""`own_tools:` chooses the aggregator's own tool families a client sees (the catalog tools always)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aggregator.config import ConfigError, parse_config
from tests.conftest import aggregator_client, kit_upstream, write_config

CATALOG = {"catalog_list_servers", "catalog_list_tools", "catalog_describe_tool", "catalog_search_tools"}
CATALOG |= {"catalog_call_tool"}
INTROSPECTION = {"apropos-search", "who-references"}
TEXT_INDEX = {"search_create_index", "search_add_document", "search_index"}


@pytest.mark.parametrize(
    ("own_tools", "expected"),
    [
        (None, CATALOG | INTROSPECTION | TEXT_INDEX),  # the default: every family
        ({"introspection": False, "text_index": False}, CATALOG),
        ({"text_index": False}, CATALOG | INTROSPECTION),
        ({"introspection": False}, CATALOG | TEXT_INDEX),
    ],
)
async def test_own_tools_choose_the_families(
    tmp_path: Path, own_tools: dict[str, bool] | None, expected: set[str]
) -> None:
    top = {"own_tools": own_tools} if own_tools is not None else {}
    config = write_config(tmp_path, {"kit": kit_upstream()}, **top)
    async with aggregator_client(config) as session:
        listed = {tool.name for tool in (await session.list_tools()).tools}
        assert listed == expected
        if "search_index" not in expected:  # a family turned off is not callable either
            result = await session.call_tool("search_index", {"query": "x"})
            assert result.is_error
        called = await session.call_tool(
            "catalog_call_tool", {"server": "kit", "tool": "echo", "arguments": {"message": "hi"}}
        )
        assert not called.is_error


def test_own_tools_mistakes_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"own_tools\.introspektion"):
        parse_config("own_tools: {introspektion: false}\nupstreams: {}\n", "a.yaml")
    with pytest.raises(ConfigError, match="own_tools"):
        parse_config("own_tools: [text_index]\nupstreams: {}\n", "a.yaml")


def test_the_call_tool_name_is_spelled_in_one_place() -> None:
    """The server's task path and the tool family match `catalog_call_tool` through one constant:
    a rename there cannot leave a second spelling behind (the raw path included)."""
    from aggregator.tools.catalog import CATALOG_CALL

    package = Path(__file__).parent.parent / "aggregator"
    spelled = {
        path.relative_to(package).as_posix()
        for path in package.rglob("*.py")
        if '"catalog_call_tool"' in path.read_text(encoding="utf-8")
    }
    assert spelled == {"tools/catalog.py"}
    assert CATALOG_CALL == "catalog_call_tool" and CATALOG_CALL in CATALOG


async def test_a_misspelt_tool_or_server_name_gets_a_did_you_mean(tmp_path: Path) -> None:
    """What a model misspells (a tool name one letter off, a server name) is answered with the name it meant,
    as the command line does."""
    config = write_config(tmp_path, {"kit": kit_upstream()})
    async with aggregator_client(config) as session:
        tool = await session.call_tool("catalog_call_tools", {"server": "kit", "tool": "echo"})
        assert tool.is_error and "no tool named 'catalog_call_tools'; did you mean 'catalog_call_tool'?" in (
            tool.content[0].text  # type: ignore[union-attr]
        )
        server = await session.call_tool("catalog_list_tools", {"server": "kti"})
        assert server.is_error
        assert "no upstream named 'kti'; did you mean 'kit'? (known: kit)" in server.content[0].text  # type: ignore[union-attr]
        far = await session.call_tool("catalog_list_tools", {"server": "zzzz"})
        assert "did you mean" not in far.content[0].text  # type: ignore[union-attr]
