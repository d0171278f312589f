"""The official MCP conformance suite, run from pytest (`.ci/install-conformance` installs it).

What is needed lives in `.ci/conformance/` (git-ignored): node 22, the npm package
`@modelcontextprotocol/conformance` and its reference server `everything-server.ts`. Where a part
is missing, `missing()` says which, and the tests skip with that sentence.

The suite calls the reference server's tools and prompts by their own names (`test_simple_text`,
`test_prompt_with_arguments`, ...), written as template literals in its one bundled file. To run it
through the aggregator with prefixed names, `suite_entry(prefix)` writes a copy of that bundle with
each of those names, as the reference server registers them, rewritten to `<prefix><name>`; the
copy sits beside a `node_modules` link so its imports resolve as the original's do.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT, free_port, wait_for_port

CONFORMANCE = ROOT / ".ci" / "conformance"
NODE_MODULES = CONFORMANCE / "node_modules"
NODE = NODE_MODULES / ".bin" / "node"
TSX = NODE_MODULES / ".bin" / "tsx"
SUITE = NODE_MODULES / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
REFERENCE_SERVER = CONFORMANCE / "everything-server.ts"
HOW = "run `bash .ci/install-conformance` (npm and ../shared/conformance/everything-server.ts needed)"

_REGISTERED = re.compile(r"\.(?:tool|prompt|registerTool|registerPrompt)\(\s*'([^']+)'")
_SUMMARY = re.compile(r"^([✓✗]) (\S+): (\d+) passed, (\d+) failed", re.MULTILINE)


def missing() -> str | None:
    """Why the suite cannot run here (one sentence), or None."""
    for path in (NODE, TSX, SUITE, REFERENCE_SERVER):
        if not path.exists():
            return f"conformance suite not installed: {path.relative_to(ROOT)} missing; {HOW}"
    return None


def reference_names() -> list[str]:
    """The tool and prompt names the reference server registers, in its file's order."""
    return _REGISTERED.findall(REFERENCE_SERVER.read_text())


def suite_entry(directory: Path, prefix: str = "") -> Path:
    """The suite's entry script; with `prefix`, a copy calling `<prefix><name>` for each reference name."""
    if not prefix:
        return SUITE
    bundle = SUITE.read_text()
    for name in reference_names():
        bundle = bundle.replace(f"`{name}`", f"`{prefix}{name}`")
    copy = directory / f"suite-{prefix}" / "index.js"
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(bundle)
    link = directory / "node_modules"
    if not link.exists():
        link.symlink_to(NODE_MODULES)
    return copy


@contextmanager
def reference_server() -> Iterator[str]:
    """The suite's reference server on 127.0.0.1 (streamable HTTP): its /mcp URL; its process group ends after."""
    port = free_port()
    proc = subprocess.Popen(
        [str(TSX), str(REFERENCE_SERVER)],
        cwd=CONFORMANCE,
        env={**os.environ, "PORT": str(port), "PATH": f"{NODE.parent}:{os.environ.get('PATH', '')}"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        wait_for_port(port, proc, timeout=60)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)


@dataclass(frozen=True)
class Outcome:
    """One suite run: per scenario, (checks passed, checks failed); `log` is its whole output."""

    scenarios: dict[str, tuple[int, int]]
    log: str

    def failed(self) -> list[str]:
        return sorted(name for name, (_passed, failures) in self.scenarios.items() if failures)

    def failures(self, out_dir: Path) -> str:
        """The failed checks' messages, from the result files, for an assertion message."""
        lines = []
        for checks in sorted(out_dir.glob("*/checks.json")):
            for check in json.loads(checks.read_text()):
                if check.get("status") == "FAILURE":
                    lines.append(f"{checks.parent.name}: {check.get('id')}: {check.get('errorMessage')}")
        return "\n".join(lines)


def run_suite(url: str, entry: Path, out_dir: Path, scenario: str | None = None, timeout: float = 300) -> Outcome:
    """Every server scenario (`--suite all`), or one, against `url`; results also go to `out_dir`."""
    args = [str(NODE), str(entry), "server", "--suite", "all", "--url", url, "-o", str(out_dir)]
    if scenario is not None:
        args += ["--scenario", scenario]
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=entry.parent, check=False)
    text = done.stdout + done.stderr
    scenarios = {name: (int(ok), int(bad)) for _mark, name, ok, bad in _SUMMARY.findall(text)}
    if scenario is not None:  # one scenario prints no summary table: read its checks instead
        checks = [c for f in out_dir.glob(f"server-{scenario}-*/checks.json") for c in json.loads(f.read_text())]
        bad = sum(c.get("status") == "FAILURE" for c in checks)
        scenarios = {scenario: (sum(c.get("status") == "SUCCESS" for c in checks), bad + (not checks))}
    return Outcome(scenarios, text)


@functools.cache
def server_scenarios(entry: Path = SUITE) -> list[str]:
    """The suite's server scenario names, as `conformance list` prints them."""
    text = subprocess.run(
        [str(NODE), str(entry), "list"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    server_part = text.split("Client scenarios")[0]
    return re.findall(r"^\s*- (\S+)", server_part, re.MULTILINE)
