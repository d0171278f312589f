"""``${VAR}`` expansion in the values that clients expand too.

``${VAR}``, ``${VAR:-default}`` (default when VAR is unset *or empty*, as in the shell; the
default is literal text), ``${env:VAR}`` (Cursor's spelling of ``${VAR}``) and ``$$`` for a literal
``$``. A bare ``$VAR`` is left alone. ``${AGGREGATOR_PYTHON}`` is the running interpreter unless set
in the environment. Error texts never contain the value (it may hold a secret).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

from aggregator.config.errors import Context, KeyPath

__all__ = ["VAR_NAME", "Expander", "ExpansionError", "expand", "required_variables"]

VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Expander:
    """Expands references in one upstream's values; errors name the key."""

    def __init__(self, ctx: Context, path: KeyPath) -> None:
        self._ctx = ctx
        self._path = path

    def optional(self, value: str | None, key: KeyPath) -> str | None:
        return None if value is None else self.value(value, key)

    def value(self, value: str, key: KeyPath) -> str:
        try:
            return expand(value, self._lookup)
        except ExpansionError as exc:
            raise self._ctx.entry_error((*self._path, *key), exc.problem, exc.fix) from None

    def _lookup(self, name: str) -> str | None:
        found = self._ctx.environ.get(name)
        if found is None and name == "AGGREGATOR_PYTHON":
            return sys.executable
        return found


class ExpansionError(Exception):
    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


def expand(value: str, lookup: Callable[[str], str | None]) -> str:
    """Expand ``${VAR}``, ``${VAR:-default}``, ``${env:VAR}`` and ``$$`` in ``value``.

    Raises `ExpansionError` (without the value in its text: it may hold a secret).
    """
    out: list[str] = []
    i, n = 0, len(value)
    while i < n:
        char = value[i]
        if char != "$":
            out.append(char)
            i += 1
            continue
        following = value[i + 1 : i + 2]
        if following == "$":
            out.append("$")
            i += 2
        elif following == "{":
            end = value.find("}", i + 2)
            if end < 0:
                raise ExpansionError(
                    "a '${' is not closed by '}'", "close it with '}', or write '$$' for a literal '$'"
                )
            out.append(_resolve_reference(value[i + 2 : end], lookup))
            i = end + 1
        else:
            out.append("$")
            i += 1
    return "".join(out)


_REFERENCE = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\}")


def required_variables(value: str) -> list[str]:
    """The variables ``value`` needs set: its ``${VAR}`` references without a default."""
    return [m.group(1) for m in _REFERENCE.finditer(value.replace("$$", "")) if m.group(2) is None]


def _resolve_reference(body: str, lookup: Callable[[str], str | None]) -> str:
    name, has_default, default = body.partition(":-")
    name = name.removeprefix("env:")
    if not VAR_NAME.fullmatch(name):
        if name.startswith("input:"):
            raise ExpansionError(
                "VS Code '${input:...}' prompts are not supported",
                "put the value in an environment variable and write ${NAME}",
            )
        raise ExpansionError(
            "a '${...}' reference does not hold a valid variable name",
            "write ${NAME} or ${NAME:-default} (NAME: letters, digits, '_'), or '$$' for a literal '$'",
        )
    found = lookup(name)
    if has_default:
        return found if found else default
    if found is None:
        raise ExpansionError(
            f"the environment variable {name} is not set",
            f"set {name} in the aggregator's environment, or write ${{{name}:-default}} to give a default",
        )
    return found
