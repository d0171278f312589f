"""The official MCP conformance suite's server scenarios: directly, and through the aggregator.

The reference server of the suite runs once for the module. The suite runs against it directly, then
through `aggregator serve --transport http` fronting it as upstream `ref` (`expose: direct`): with
prefixed names (the suite copy calls `ref__<name>`), with `prefix: false` (the suite as it is), and
each lazy-start scenario alone on a fresh aggregator (fresh data dir: no snapshot, nothing started);
and across a chain of aggregators whose middle hop takes the raw path (`proxy/raw.py`): the whole
suite, and the tool scenarios by the route straight to a running upstream.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests import conformance
from tests.conftest import write_config
from tests.test_serve_http import http_aggregator

if (why := conformance.missing()) is not None:
    pytest.skip(why, allow_module_level=True)

LAZY_START = [
    "completion-complete",
    "prompts-list",
    "prompts-get-simple",
    "prompts-get-with-args",
    "prompts-get-embedded-resource",
    "prompts-get-with-image",
    "resources-list",
    "resources-read-text",
    "resources-read-binary",
    "resources-templates-read",
    "resources-subscribe",
    "resources-unsubscribe",
    "tools-list",
    "tools-call-simple-text",
    "server-initialize",
]
"""Scenarios whose first request needs the upstream's catalog: on a fresh aggregator they must start it."""

EXPECTED_FAILURES: dict[str, str] = {}
"""Scenarios known to fail in a whole-suite run through the aggregator, with why (strict: each must fail).

Empty since per-client upstream sessions (issue 19 item 2): `elicitation-sep1330-enums` failed while the
`test_reconnection` call of `server-sse-polling` (the reference server never delivers its result after
closing the stream) stayed in flight on the one shared session and blocked the relay."""


@pytest.fixture(scope="module")
def reference() -> Iterator[str]:
    with conformance.reference_server() as url:
        yield url


def ref_config(directory: Path, url: str, **upstream: Any) -> Path:
    return write_config(directory, {"ref": {"url": url, "expose": "direct", **upstream}})


def check(outcome: conformance.Outcome, out_dir: Path, expected: list[str], allowed: dict[str, str]) -> None:
    """Every expected scenario ran; none failed but those `allowed` to."""
    assert sorted(outcome.scenarios) == sorted(expected), outcome.log[-3000:]
    unexpected = [name for name in outcome.failed() if name not in allowed]
    assert not unexpected, f"{unexpected} failed:\n{outcome.failures(out_dir)}"
    fixed = sorted(set(allowed) - set(outcome.failed()))
    assert not fixed, f"{fixed} passed: remove them from EXPECTED_FAILURES"


def test_the_suite_has_its_32_server_scenarios() -> None:
    assert len(conformance.server_scenarios()) == 32


def test_directly(reference: str, tmp_path: Path) -> None:
    outcome = conformance.run_suite(reference, conformance.SUITE, tmp_path / "out")
    check(outcome, tmp_path / "out", conformance.server_scenarios(), {})


def test_through_the_aggregator_prefixed(reference: str, tmp_path: Path) -> None:
    entry = conformance.suite_entry(tmp_path, "ref__")
    with http_aggregator(ref_config(tmp_path, reference)) as url:
        outcome = conformance.run_suite(url, entry, tmp_path / "out")
    check(outcome, tmp_path / "out", conformance.server_scenarios(), EXPECTED_FAILURES)


def test_through_the_aggregator_with_the_upstreams_own_names(reference: str, tmp_path: Path) -> None:
    with http_aggregator(ref_config(tmp_path, reference, prefix=False)) as url:
        outcome = conformance.run_suite(url, conformance.SUITE, tmp_path / "out")
    check(outcome, tmp_path / "out", conformance.server_scenarios(), EXPECTED_FAILURES)


GROUPS = [LAZY_START[i::3] for i in range(3)]


@pytest.mark.parametrize("scenarios", GROUPS, ids=[f"group{i}" for i in range(len(GROUPS))])
def test_each_lazy_scenario_alone_on_a_fresh_aggregator(reference: str, tmp_path: Path, scenarios: list[str]) -> None:
    """Each on its own aggregator with an empty data dir; a group's aggregators run side by side."""
    entry = conformance.suite_entry(tmp_path, "ref__")

    def alone(scenario: str) -> str:
        directory = tmp_path / scenario
        directory.mkdir()
        config = ref_config(directory, reference)
        with http_aggregator(config, "--data-dir", str(directory / "data"), start_timeout=90) as url:
            outcome = conformance.run_suite(url, entry, directory / "out", scenario)
        assert list(outcome.scenarios) == [scenario], outcome.log[-3000:]
        return outcome.failures(directory / "out") if outcome.failed() else ""

    with ThreadPoolExecutor(max_workers=len(scenarios)) as pool:
        failures = list(pool.map(alone, scenarios))
    assert not any(failures), "\n".join(text for text in failures if text)


OWN_TOOLS_OFF = {"introspection": False, "text_index": False}
RAW_METHODS = ("completion/complete", "prompts/get", "resources/read", "tools/call")
_LANE_CLOSED = re.compile(r"event=\"raw lane closed\" counts=\"?([^\"\n]*)")


def chained_upstream(directory: Path, upstreams: dict[str, Any], log_level: str) -> dict[str, Any]:
    """A stdio upstream entry running `aggregator serve` over `upstreams`, logging to `directory`/serve.log."""
    directory.mkdir()
    config = write_config(directory, upstreams, own_tools=OWN_TOOLS_OFF)
    args = ["-m", "aggregator", "serve", "--config", str(config), "--data-dir", str(directory / "data")]
    args += ["--log-level", log_level, "--log-file", str(directory / "serve.log")]
    hidden = {"deny": ["catalog_*"]}  # the chained aggregator's own catalog tools: they would clash with ours
    return {"command": sys.executable, "args": args, "expose": "direct", "prefix": False, "tools": hidden}


def lane_counts(log_file: Path) -> dict[str, int]:
    """The raw lanes' counts summed over a log's `raw lane closed` lines (one per client session, at its end):
    `<method>` → calls taken, `<method>:<rule>` → calls left to the full path by that rule."""
    counts: dict[str, int] = {}
    for line in _LANE_CLOSED.findall(log_file.read_text() if log_file.exists() else ""):
        for key, number in (item.rsplit("=", 1) for item in line.split()):
            counts[key] = counts.get(key, 0) + int(number)
    return counts


def test_the_raw_path_in_a_chain_of_aggregators(reference: str, tmp_path: Path) -> None:
    """The whole suite across a chain: suite → outer `serve --transport http` → inner `serve` (stdio) →
    third `serve` (stdio) → the reference server (HTTP), own names (`prefix: false`) at every level.

    Why a chain: the suite speaks HTTP, and HTTP clients take the full path; the raw path (`proxy/raw.py`,
    `upstream/raw_calls.py`) serves a line-based client in front of a stdio upstream. The inner aggregator
    is both: its client is the outer's upstream session, its upstream the third aggregator. So each
    tools/call, prompts/get, resources/read and completion of the suite crosses the inner hop's raw lane
    and its raw upstream leg; the inner's `raw lane closed` log lines must count all four as taken, and
    nothing left to the full path but a first call before a catalog was known (rule `target`). (Each
    inner's first call starts its upstream, so it crosses the handler layers, not the route straight to
    a running upstream's raw leg: the next test runs the tool scenarios by that route.)

    The outer gives each suite client an inner of its own (`sessions: per-client`): on one shared stdio
    session the call `server-sse-polling` leaves in flight (the reference server never answers it) makes
    the outer refuse the elicitation of `elicitation-sep1330-enums`, which cannot be told apart from it
    (docs/isolation.md, "Known limits"). On a shared session that scenario passes alone and fails right
    after `server-sse-polling` on the same outer, with `call_path: full` at every level too: the relay's
    rule, not the raw path; and a call timeout short enough to end that call first fails
    `server-sse-polling` itself (a timeout result instead of none). Takes 50-70 s on 2 cores (the suite
    alone about 30).
    """
    ref = {"url": reference, "expose": "direct", "prefix": False}
    third = chained_upstream(tmp_path / "third", {"ref": ref}, "info")
    inner = chained_upstream(tmp_path / "inner", {"third": third}, "debug")
    config = write_config(tmp_path, {"inner": {**inner, "sessions": "per-client"}})
    logged = ["--log-level", "info", "--log-file", str(tmp_path / "serve.log")]
    with http_aggregator(config, "--data-dir", str(tmp_path / "data"), *logged, start_timeout=60) as url:
        outcome = conformance.run_suite(url, conformance.SUITE, tmp_path / "out")
    check(outcome, tmp_path / "out", conformance.server_scenarios(), EXPECTED_FAILURES)
    deadline = time.monotonic() + 10  # the inners write their lines as the outer's shutdown ends them
    while not all((counts := lane_counts(tmp_path / "inner" / "serve.log")).get(m) for m in RAW_METHODS):
        assert time.monotonic() < deadline, f"not every method took the inner's raw lane: {counts}"
        time.sleep(0.1)
    assert all(key.endswith(":target") for key in counts if ":" in key), counts


TOOL_SCENARIOS = [
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-audio",
    "tools-call-embedded-resource",
    "tools-call-mixed-content",
    "tools-call-with-logging",
    "tools-call-error",
    "tools-call-with-progress",
    "tools-call-sampling",
    "tools-call-elicitation",
    "elicitation-sep1034-defaults",
    "elicitation-sep1330-enums",
]
"""The scenarios that call tools, relays during the call included (logging, progress, sampling, elicitation)."""


def test_the_tool_scenarios_by_the_route_in_a_chain(reference: str, tmp_path: Path) -> None:
    """The tool scenarios, one after another, across the chain above with one shared inner aggregator:
    its upstream runs from the outer's first listing on, so each call crosses the inner hop by the route
    straight to the running upstream's raw leg (`RawRouter.route_of`), with what the upstream sends
    during the call (log messages, progress, sampling and elicitation requests) relayed to its caller.
    Each scenario must pass, and the inner's `raw lane closed` line must count every call as routed."""
    ref = {"url": reference, "expose": "direct", "prefix": False}
    third = chained_upstream(tmp_path / "third", {"ref": ref}, "info")
    inner = chained_upstream(tmp_path / "inner", {"third": third}, "debug")
    config = write_config(tmp_path, {"inner": inner})
    with http_aggregator(config, "--data-dir", str(tmp_path / "data"), start_timeout=60) as url:
        for scenario in TOOL_SCENARIOS:
            outcome = conformance.run_suite(url, conformance.SUITE, tmp_path / scenario, scenario)
            assert not outcome.failed(), f"{scenario}:\n{outcome.failures(tmp_path / scenario)}"
    deadline = time.monotonic() + 10
    while not (counts := lane_counts(tmp_path / "inner" / "serve.log")):
        assert time.monotonic() < deadline, "no 'raw lane closed' line from the inner aggregator"
        time.sleep(0.1)
    assert counts.get("tools/call", 0) >= len(TOOL_SCENARIOS), counts
    assert counts.get("route") == counts["tools/call"], counts
