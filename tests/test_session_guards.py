"""The test session's own guards: private user dirs, and no process outliving the session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import platformdirs

from tests.conftest import ROOT, alive

LEAKY_TEST = """
import subprocess
from pathlib import Path

def test_leaves_a_process(tmp_path):
    # the shell exits at once; its background sleep is orphaned (re-parented to pytest, the subreaper)
    subprocess.run(["sh", "-c", "sleep 60 & echo $! > " + str(Path(__file__).with_name("pid"))], check=True)
"""


def test_user_dirs_are_private_to_the_session() -> None:
    home = Path.home()
    for directory in (platformdirs.user_data_dir(), platformdirs.user_config_dir(), platformdirs.user_cache_dir()):
        assert not Path(directory).is_relative_to(home), directory


def test_a_process_left_running_fails_the_session(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_configure, pytest_sessionfinish\n")
    (tmp_path / "test_leak.py").write_text(LEAKY_TEST)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "processes left running by the tests" in done.stdout and "sleep 60" in done.stdout
    assert not alive(int((tmp_path / "pid").read_text()))
