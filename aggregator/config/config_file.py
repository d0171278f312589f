"""Where the config file is (``--config`` > ``AGGREGATOR_CONFIG`` > ./aggregator.yaml > user dir)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import platformdirs

from aggregator.config.errors import ConfigError
from aggregator.files import read_regular_file

__all__ = ["CONFIG_FILE_NAME", "config_lookup", "decode_text", "find_config_path", "read_text", "user_config_file"]

CONFIG_FILE_NAME = "aggregator.yaml"
MAX_CONFIG_BYTES = 64 << 20


def user_config_file() -> Path:
    """The per-user config file: ``user_config_dir("aggregator")/aggregator.yaml``."""
    return Path(platformdirs.user_config_dir("aggregator")) / CONFIG_FILE_NAME


def find_config_path(explicit: str | os.PathLike[str] | None, environ: Mapping[str, str], cwd: Path) -> Path | None:
    """The config file to use: ``--config`` > ``AGGREGATOR_CONFIG`` > ./aggregator.yaml > user dir.

    None means the built-in default. A path given explicitly (flag or variable) must exist: it
    is an error, not a reason to fall back. ``~`` is expanded there, since clients start the
    aggregator without a shell.
    """
    return config_lookup(explicit, environ, cwd)[0]


def config_lookup(
    explicit: str | os.PathLike[str] | None, environ: Mapping[str, str], cwd: Path
) -> tuple[Path | None, str]:
    """`find_config_path`, and why that file won (for `doctor`)."""
    if explicit is not None and str(explicit) != "":
        return _require_file(_absolute(explicit, cwd), "the path given with --config"), "given with --config"
    from_env = environ.get("AGGREGATOR_CONFIG", "")
    if from_env:
        origin = "the AGGREGATOR_CONFIG environment variable"
        return _require_file(_absolute(from_env, cwd), origin), f"named by {origin}"
    local, user = cwd / CONFIG_FILE_NAME, user_config_file()
    if local.is_file():
        return local, f"{CONFIG_FILE_NAME} in the working directory (no --config, no AGGREGATOR_CONFIG)"
    if user.is_file():
        return user, f"the user config file (no --config, no AGGREGATOR_CONFIG, no ./{CONFIG_FILE_NAME})"
    return None, f"nothing found (no --config, no AGGREGATOR_CONFIG, no ./{CONFIG_FILE_NAME}, no {user})"


def _absolute(path: str | os.PathLike[str], cwd: Path) -> Path:
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else cwd / candidate


def _require_file(path: Path, origin: str) -> Path:
    if path.is_dir():
        raise ConfigError(str(path), None, "this is a directory, not a config file", f"correct {origin}")
    if not path.is_file():
        raise ConfigError(str(path), None, "config file not found", f"create the file, or correct {origin}")
    return path


def read_text(path: Path) -> str:
    """The file's text (UTF-8, a BOM dropped); problems become one-line `ConfigError`s.

    Only a regular file is read (a FIFO there would block the reader forever), up to
    `MAX_CONFIG_BYTES`.
    """
    try:
        raw = read_regular_file(path, MAX_CONFIG_BYTES)
        if len(raw) > MAX_CONFIG_BYTES:
            problem = f"the file is larger than {MAX_CONFIG_BYTES >> 20} MiB"
            raise ConfigError(str(path), None, problem, "is this the right file?")
        return decode_text(raw)
    except UnicodeDecodeError:
        raise ConfigError(str(path), None, "the file is not UTF-8 text", "save it as UTF-8") from None
    except FileNotFoundError:
        raise ConfigError(str(path), None, "config file not found", "create the file") from None
    except OSError as exc:
        problem = f"cannot read the file ({exc.strerror or type(exc).__name__})"
        raise ConfigError(str(path), None, problem, "check the path and its permissions") from None


def decode_text(raw: bytes) -> str:
    """A file's bytes as `read_text` gives them: UTF-8, a BOM dropped, newlines as text mode reads them."""
    return raw.decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n")
