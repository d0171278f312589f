"""JSON as clients write it (VS Code's JSONC: comments, trailing commas) → Python data.

Read with the ``json5`` parser, a superset of JSONC; duplicate keys are errors, as in YAML. A raw
control character (U+0000-U+001F but tab, newline and carriage return) is refused before parsing,
as JSON and YAML refuse it: json5 would take it inside a string (``"command": "x<U+0001>"``).
"""

from __future__ import annotations

import re
from typing import Any

from aggregator.config.errors import ConfigError

__all__ = ["parse_json"]

_RAW_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")
_POSITION = re.compile(r"^<string>:(?P<line>\d+) (?P<problem>.*?)(?: at column (?P<column>\d+))?$", re.DOTALL)


def parse_json(text: str, source: str) -> Any:
    """JSON/JSONC text → data; every problem is a one-line `ConfigError` naming the line."""

    def no_duplicates(pairs: Any) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise ConfigError(
                    source,
                    None,
                    f"the key {key!r} appears twice in one mapping",
                    "keep one of them (server names must be unique)",
                )
            result[key] = value
        return result

    import json5  # here: a `serve` with a YAML config never reads JSON (0.6 MB RSS, issue 24)

    _refuse_raw_control(text, source)
    try:
        return json5.loads(text, object_pairs_hook=no_duplicates)
    except RecursionError:
        raise ConfigError(source, None, "the JSON is nested too deeply", "flatten the structure") from None
    except ValueError as exc:
        found = _POSITION.match(str(exc))
        if found is None:
            raise ConfigError(source, None, f"invalid JSON: {exc}", "correct the JSON syntax") from None
        column = f" (column {found['column']})" if found["column"] else ""
        raise ConfigError(
            source,
            None,
            f"invalid JSON: {found['problem']}{column}",
            "correct the JSON syntax there",
            line=int(found["line"]),
        ) from None


def _refuse_raw_control(text: str, source: str) -> None:
    found = _RAW_CONTROL.search(text)
    if found is None:
        return
    line = text.count("\n", 0, found.start()) + 1
    column = found.start() - (text.rfind("\n", 0, found.start()) + 1) + 1
    code = f"U+{ord(found.group()):04X}"
    raise ConfigError(
        source,
        None,
        f"invalid JSON: a raw control character {code} (column {column})",
        f"remove it, or write it escaped as \\u{ord(found.group()):04x} inside a string",
        line=line,
    )
