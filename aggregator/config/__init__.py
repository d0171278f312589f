"""Configuration: YAML (or a client's JSON) → validated pydantic models.

Two file shapes are accepted:

* the aggregator's own: ``upstreams: {NAME: {...}}`` plus optional ``defaults:``;
* a client's: ``mcpServers: {NAME: {...}}`` (Claude Desktop, Claude Code, Cursor, Cline, Windsurf)
  or VS Code's ``servers:``, so an existing client file works as it is.

Client-only keys seen in real client files are handled this way (mcpServers/servers shape only):

* ``type`` / ``transportType``: the transport; ``streamable-http``/``streamableHttp`` mean ``http``.
  Without one, a ``url`` whose path ends in ``/sse`` is read as SSE (as clients do), any other url
  as streamable HTTP.
* ``serverUrl`` (Windsurf): the same as ``url``.
* ``disabled: true`` (Cline, Roo, Kilo, Windsurf): the server is skipped (listed in ``disabled``).
* ``envFile`` (VS Code, Cursor): a dotenv file (``NAME=value`` lines) loaded under ``env``; keys in
  ``env`` win; a relative path is relative to the config file; its values are not expanded.
* ``autoApprove``, ``alwaysAllow`` (approval lists), ``timeout`` (its unit differs between clients:
  use ``timeouts``) and ``dev`` (VS Code's debug options): accepted and ignored.
* In a client file, unknown *top-level* keys are the client's own settings and are ignored, unless
  they look like a misspelt key of ours (``defualts``).

Expansion, in ``command``, ``args``, ``env``, ``cwd``, ``url``, ``headers`` (and ``envFile``):
``${VAR}``, ``${VAR:-default}`` (default when VAR is unset *or empty*, as in the shell; the default
is literal text), ``${env:VAR}`` (Cursor's spelling of ``${VAR}``) and ``$$`` for a literal ``$``.
A bare ``$VAR`` is left alone. ``${AGGREGATOR_PYTHON}`` is the running interpreter unless set in
the environment. ``~`` is expanded only at the start of ``command`` and ``cwd`` (a client passes
args to the server verbatim, and so do we). A relative ``cwd`` is relative to the config file.

One job per module:

* `models`: the validated models everyone else uses;
* `errors`: `ConfigError` and where in the file a problem is;
* `files`: where the config file is, and reading it;
* `yamlfile`: YAML with line numbers and limits; `jsonc`: JSON with comments (json5);
* `shapes`: the file shapes as written (ours and the clients'); `expand`: ``${VAR}``;
* `envfile`: a client's ``envFile`` (python-dotenv); `build`: data → models; `load`: entry points.
"""

from aggregator.config.config_file import CONFIG_FILE_NAME, find_config_path, user_config_file
from aggregator.config.errors import ConfigError
from aggregator.config.load import load_config, parse_config
from aggregator.config.models import (
    BUILTIN_SOURCE,
    NAME_PATTERN,
    RESERVED_NAME,
    AggregatorConfig,
    Timeouts,
    ToolFilter,
    Transport,
    UpstreamConfig,
)

__all__ = [
    "BUILTIN_SOURCE",
    "CONFIG_FILE_NAME",
    "NAME_PATTERN",
    "RESERVED_NAME",
    "AggregatorConfig",
    "ConfigError",
    "Timeouts",
    "ToolFilter",
    "Transport",
    "UpstreamConfig",
    "find_config_path",
    "load_config",
    "parse_config",
    "user_config_file",
]
