"""Routing tables of the pass-through (DESIGN §2.6): prompt names, resource URIs, task ids."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from aggregator.catalog.model import Catalog, clean_prompt, clean_resource, clean_resource_template
from aggregator.proxy.exposure import MAX_NAME
from aggregator.proxy.routing import BoundedMap, ResourceRouter, TaskRouter, build_prompt_table, result_uris


def catalog(server: str, prompts: list[str] = (), resources: list[str] = (), templates: list[str] = ()) -> Catalog:  # type: ignore[assignment]
    return Catalog(
        server,
        prompts=tuple(clean_prompt(server, {"name": p}) for p in prompts),
        resources=tuple(clean_resource(server, {"name": u, "uri": u}) for u in resources),
        resource_templates=tuple(clean_resource_template(server, {"name": t, "uriTemplate": t}) for t in templates),
    )


def test_prompt_names_resolve_through_the_table_never_by_splitting() -> None:
    table = build_prompt_table({"a__b": catalog("a__b", ["c"]), "a": catalog("a", ["b__c", "x" * 80])})
    # `a__b__c` could be split either way; the table says who owns each exposed name
    owners = {name: (entry.server, entry.prompt.name) for name, entry in table.items()}
    assert owners["a__b__c"] == ("a", "b__c")  # sorted servers: `a` claims the name first
    assert ("a__b", "c") not in owners.values()  # the collision is skipped (and logged), never a silent swap
    long = next(name for name, owner in owners.items() if owner == ("a", "x" * 80))
    assert len(long) <= MAX_NAME


@given(
    st.dictionaries(
        st.from_regex(r"[a-z_]{1,6}", fullmatch=True),
        st.lists(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), max_size=4),
        max_size=4,
    )
)
def test_prompt_table_is_deterministic_and_unique(spec: dict[str, list[str]]) -> None:
    catalogs = {server: catalog(server, prompts) for server, prompts in spec.items()}
    first = build_prompt_table(catalogs)
    again = build_prompt_table(dict(reversed(list(catalogs.items()))))
    assert list(first) == list(again)
    assert all(len(name) <= MAX_NAME for name in first)
    assert len({(e.server, e.prompt.name) for e in first.values()}) == len(first)


def test_resource_rule_listed_then_template_then_seen_first_in_config_order() -> None:
    router = ResourceRouter(["zeta", "alpha"])  # configuration order, not alphabetical
    router.rebuild(
        {
            "alpha": catalog("alpha", resources=["x://shared", "x://alpha"], templates=["t://{id}"]),
            "zeta": catalog("zeta", resources=["x://shared"], templates=["t://{id}", "z://{a}/{b}"]),
        }
    )
    assert router.owners("x://shared") == ["zeta", "alpha"]
    assert router.resolve("x://shared") == "zeta"  # two upstreams list it: the first configured wins
    assert router.resolve("x://alpha") == "alpha"
    assert router.resolve("t://42") == "zeta"
    assert router.resolve("z://1/2") == "zeta"
    assert router.resolve("nope://1") is None
    # a link an upstream returned is readable from that upstream, among those that list or template it ...
    router.remember("alpha", {"content": [{"type": "resource_link", "uri": "x://shared", "name": "s"}]})
    assert router.resolve("x://shared") == "alpha"
    router.remember("alpha", {"content": [{"type": "resource_link", "uri": "t://7", "name": "s"}]})
    assert router.resolve("t://7") == "alpha"
    # ... and never takes a URI away from the upstreams that list or template it (issue 20.8)
    evil = {"content": [{"type": "resource_link", "uri": u, "name": "e"} for u in ("x://alpha", "z://1/2", "e://1")]}
    router.remember("evil", evil)
    assert [router.resolve(u) for u in ("x://alpha", "z://1/2", "e://1")] == ["alpha", "zeta", "evil"]
    assert router.template_owner("z://{a}/{b}") == "zeta"


def test_result_uris_finds_links_and_embedded_resources_only() -> None:
    result: dict[str, Any] = {
        "content": [
            {"type": "text", "text": "x://not-a-link"},
            {"type": "resource_link", "uri": "x://link", "name": "l"},
            {"type": "resource", "resource": {"uri": "x://embedded", "text": "t"}},
            {"type": "resource", "resource": "broken"},
            "junk",
        ]
    }
    assert list(result_uris(result)) == ["x://link", "x://embedded"]
    assert list(result_uris({"content": "junk"})) == []
    assert list(result_uris(None)) == []


def test_bounded_maps_forget_the_least_recently_used() -> None:
    seen: BoundedMap[str, int] = BoundedMap(2)
    seen.put("a", 1)
    seen.put("b", 2)
    assert seen.get("a") == 1  # touched: b is now the oldest
    seen.put("c", 3)
    assert (seen.get("a"), seen.get("b"), seen.get("c"), len(seen)) == (1, None, 3, 2)


def test_task_router_remembers_created_tasks() -> None:
    tasks = TaskRouter()
    tasks.remember("up", {"task": {"taskId": "t1", "status": "working"}}, creator="client")
    tasks.remember("up", {"content": []})
    tasks.remember_id("other", "t1")  # a listing never steals a task its creator is known for
    assert tasks.owner("t1") == ("up", "client")
    assert tasks.owner("t2") is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@given(JSON, st.text(max_size=40))
def test_whatever_an_upstream_returns_routing_never_breaks(result: Any, uri: str) -> None:
    router = ResourceRouter(["a"])
    router.rebuild({"a": catalog("a", resources=["x://1"], templates=["x://{id}", "{+path}"])})
    router.remember("a", result)  # any JSON as a tool result: links found or nothing, never an exception
    router.remember("a", {"content": result})
    assert router.resolve(uri) in (None, "a")
    tasks = TaskRouter()
    tasks.remember("a", result)
    tasks.remember("a", {"task": result})
