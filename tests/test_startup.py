"""Start-up (issue 24): `serve` imports only what it uses, and no collection walks the imported modules."""

from __future__ import annotations

import functools
import gc
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from aggregator.startup import settled_imports

# What a stdio `serve` loads on the way to its first answer: the CLI runs a command (which loads the config,
# logging and the pool under `settled_imports`), then the server's modules.
SERVE_IMPORTS = """
import gc, io, json, sys
from contextlib import redirect_stdout
from aggregator.cli import main
with redirect_stdout(io.StringIO()):
    assert main(["list-upstreams", "--json", "--config", sys.argv[1]]) == 0
import aggregator.proxy.server, aggregator.upstream.pool, aggregator.downstream.stdio
roots = sorted({name.split(".")[0] for name in sys.modules})
print(json.dumps({"roots": roots, "frozen": gc.get_freeze_count(), "gc": gc.isenabled()}))
"""


@functools.cache  # one interpreter for both tests: it takes a second or more
def _serve_imports() -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "aggregator.yaml"
        config.write_text(json.dumps({"upstreams": {"kit": {"command": sys.executable, "args": ["-c", "pass"]}}}))
        done = subprocess.run(
            [sys.executable, "-c", SERVE_IMPORTS, str(config)], capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


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
