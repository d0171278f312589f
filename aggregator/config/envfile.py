"""A client's ``envFile`` (VS Code, Cursor): a dotenv file read with python-dotenv's parser.

``NAME=value`` lines, ``#`` comments, optional ``export`` and quotes, as python-dotenv reads them;
values are not expanded. A line it cannot read is a `ConfigError` naming the line, not its text.
"""

from __future__ import annotations

import io
from pathlib import Path

from aggregator.config.config_file import read_text
from aggregator.config.errors import ConfigError, Context, KeyPath
from aggregator.config.expand import VAR_NAME

__all__ = ["read_env_file"]


def read_env_file(path_text: str, path: KeyPath, ctx: Context) -> dict[str, str]:
    """The variables of the env file at ``path_text`` (relative to the config file's directory)."""
    env_path = Path(path_text).expanduser()
    if not env_path.is_absolute() and ctx.base_dir is not None:
        env_path = ctx.base_dir / env_path
    if not env_path.is_file():
        raise ctx.error(path, f"the env file {str(env_path)!r} was not found", "create it or correct envFile")
    from dotenv.parser import parse_stream  # here: few configs name an envFile (issue 24, memory)

    result: dict[str, str] = {}
    for binding in parse_stream(io.StringIO(read_text(env_path))):
        if binding.key is None and not binding.error:
            continue  # a blank or comment line
        if binding.error or binding.key is None or binding.value is None or not VAR_NAME.fullmatch(binding.key):
            raise ConfigError(
                str(env_path), None, "not a NAME=value line", "write NAME=value", line=binding.original.line
            )
        result[binding.key] = binding.value
    return result
