"""JSON as clients write it (VS Code's JSONC: comments, trailing commas) → Python data.

Read with the ``json5`` parser, a superset of JSONC; duplicate keys are errors, as in YAML.
"""

from __future__ import annotations

import re
from typing import Any

import json5

from aggregator.config.errors import ConfigError

__all__ = ["parse_json"]

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
