"""`heap.release_freed_memory`: the C heap's free pages go back to the system (glibc), through `_ctypes`
alone (issue 24: `serve` trims once after its start, and the `ctypes` package would cost 0.25 MB)."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import sys
from aggregator.heap import release_freed_memory

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

kept = [bytes(1000) for _ in range(50_000)]  # 50 MB of malloc'd chunks (above pymalloc's small sizes)
del kept[:-1]  # freed below a live chunk: the heap cannot shrink from its top, only a trim hands them back
before = rss()
release_freed_memory()
print(f"{before - rss():.1f}", "ctypes" in sys.modules)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_release_freed_memory_hands_freed_pages_back_without_the_ctypes_package() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    released, ctypes_loaded = done.stdout.split()
    assert float(released) > 20, done.stdout  # of about 48 MB freed
    assert ctypes_loaded == "False"
