"""The entry points: `load_config` (find, read, parse) and `parse_config` (one text)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from aggregator.config.build import build_config
from aggregator.config.config_file import find_config_path, read_text
from aggregator.config.errors import Context, Lines
from aggregator.config.jsonc import parse_json
from aggregator.config.models import BUILTIN_SOURCE, AggregatorConfig
from aggregator.config.shapes import SERVER_SECTIONS
from aggregator.config.yamlfile import parse_yaml
from aggregator.safetext import scrub

__all__ = ["load_config", "parse_config", "parse_data", "written_servers"]


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> AggregatorConfig:
    """Find, read and parse the configuration (see `find_config_path` for the lookup order)."""
    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else cwd
    found = find_config_path(path, environ, cwd)
    if found is None:
        text = resources.files("aggregator").joinpath("default_config.yaml").read_text(encoding="utf-8")
        return parse_config(text, BUILTIN_SOURCE, environ=environ)
    return parse_config(read_text(found), str(found), environ=environ)


def parse_config(
    text: str, source: str, *, environ: Mapping[str, str] | None = None, strict: bool = False
) -> AggregatorConfig:
    """Parse one config text. ``source`` names it in messages; a ``.json`` source is read as JSON.

    An entry unusable here (an unset variable, ``${input:...}``, an unknown transport) is left out and
    named in ``broken``; with ``strict`` it is a `ConfigError` like any other problem.
    """
    environ = os.environ if environ is None else environ
    data, lines = parse_data(text, source)
    ctx = Context(source=source, lines=lines, environ=environ, base_dir=_base_dir(source), strict=strict)
    return build_config(data, ctx)


def parse_data(text: str, source: str) -> tuple[Any, Lines]:
    """The file's data as written (a ``.json`` source as JSON, else YAML), and its key lines.

    A lone surrogate (``"\\ud83d"`` escaped in either syntax) becomes U+FFFD: no string that
    cannot be sent reaches a client, whatever the file says.
    """
    if source.lower().endswith(".json"):
        return scrub(parse_json(text, source)), {}
    data, lines = parse_yaml(text, source)
    return scrub(data), lines


def written_servers(text: str, source: str) -> tuple[str, dict[str, Any]]:
    """The server section's name and its entries as written (no expansion, no validation)."""
    data = parse_data(text, source)[0]
    data = data if isinstance(data, dict) else {}
    section = next((key for key in SERVER_SECTIONS if key in data), "upstreams")
    servers = data.get(section)
    return section, dict(servers) if isinstance(servers, dict) else {}


def _base_dir(source: str) -> Path | None:
    if source.startswith("<"):
        return None
    return Path(source).expanduser().absolute().parent
