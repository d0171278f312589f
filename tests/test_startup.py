"""Start-up (issue 24): `serve` imports only what it uses, and no collection walks the imported modules."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

from aggregator.startup import settled_imports

# What a stdio `serve` loads on the way to its first answer (the CLI, config, logging, the server, the pool).
SERVE_IMPORTS = """
import json, sys
import aggregator.cli
from aggregator.log import configure_logging
configure_logging("info", None)
from aggregator.cli import main as cli
import aggregator.proxy.server, aggregator.upstream.pool, aggregator.downstream.stdio
import gc
roots = sorted({name.split(".")[0] for name in sys.modules})
print(json.dumps({"roots": roots, "frozen": gc.get_freeze_count(), "gc": gc.isenabled()}))
"""


def _serve_imports() -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", SERVE_IMPORTS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_serve_imports_no_cli_only_module_and_no_rich() -> None:
    found = _serve_imports()
    roots = set(found["roots"])  # type: ignore[arg-type]
    assert not roots & {"rich", "pygments", "ruamel", "tomlkit"}, roots


def test_the_cli_freezes_its_imports_and_collects_again_after() -> None:
    found = _serve_imports()
    assert found["gc"] is True
    assert isinstance(found["frozen"], int) and found["frozen"] > 10_000


def test_rich_still_imports_for_the_cli_progress_bar() -> None:
    script = "import aggregator.log, rich.progress; print(rich.progress.__name__)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "rich.progress", done.stderr


def test_settled_imports_nests_and_restores_the_collector() -> None:
    assert gc.isenabled()
    try:
        with settled_imports():
            assert not gc.isenabled()
            with settled_imports():
                assert not gc.isenabled()
            assert not gc.isenabled()  # only the outermost block turns it back on
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable()
