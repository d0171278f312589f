"""The command a client's config should run to start the aggregator, chosen to outlive a checkout.

`aggregator` found on PATH (a `pipx install` / `uv tool install` shim, a system package) is what the
user types and survives reinstalls and a deleted source checkout; the running interpreter's own
script is the fallback (then `doctor` reports the entry once that path is gone).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["launcher_command", "missing_command"]

SCRIPT = "aggregator.exe" if os.name == "nt" else "aggregator"


def launcher_command(environ: Mapping[str, str] | None = None) -> list[str]:
    """`aggregator` on PATH (absolute: clients do not read the shell's PATH), else this interpreter's."""
    environ = os.environ if environ is None else environ
    found = shutil.which("aggregator", path=environ.get("PATH", os.defpath))
    if found:
        return [str(Path(found).absolute())]
    script = Path(sys.executable).parent / SCRIPT
    if script.is_file():
        return [str(script.absolute())]
    return [str(Path(sys.executable).absolute()), "-m", "aggregator"]


def missing_command(command: str, environ: Mapping[str, str] | None = None) -> bool:
    """True if `command` (a path, or a name looked up on PATH) cannot be run any more."""
    environ = os.environ if environ is None else environ
    if os.sep in command or (os.altsep and os.altsep in command):
        path = Path(command).expanduser()
        return not (path.is_file() and os.access(path, os.X_OK))
    return shutil.which(command, path=environ.get("PATH", os.defpath)) is None
