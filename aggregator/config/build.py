"""Parsed data → `AggregatorConfig`: shape checks, names, expansion, and one message per error."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from aggregator.config.envfile import read_env_file
from aggregator.config.errors import ConfigError, Context, EntryError, KeyPath
from aggregator.config.expand import Expander
from aggregator.config.models import (
    DEFAULT_TIMEOUTS,
    NAME_PATTERN,
    RESERVED_NAME,
    AggregatorConfig,
    OwnTools,
    Timeouts,
    UpstreamConfig,
)
from aggregator.config.shapes import (
    AUTH_KEYS,
    EXAMPLE_HINT,
    FIX_HINTS,
    SERVER_SECTIONS,
    TOP_KEYS,
    RawClientServer,
    RawDefaults,
    RawUpstream,
    resolve_transport,
)
from aggregator.suggest import closest as _closest

__all__ = ["build_config"]


def build_config(data: Any, ctx: Context) -> AggregatorConfig:
    """Validate and resolve one parsed config file."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ctx.error((), "the top level is not a mapping", "start the file with upstreams: (or mcpServers:)")
    section = _server_section(data, ctx)
    client_shape = section != "upstreams"
    _check_top_keys(data, client_shape, ctx)
    defaults = _build_defaults(data.get("defaults"), ctx)
    own_tools = _build_own_tools(data.get("own_tools"), ctx)
    timeouts = _default_timeouts(defaults)
    servers = data.get(section)
    if servers is None:
        servers = {}
    if not isinstance(servers, dict):
        raise ctx.error(
            (section,), "must be a mapping of server names to settings", f"write {section}: {{NAME: {{...}}}}"
        )
    upstreams: dict[str, UpstreamConfig] = {}
    disabled: list[str] = []
    broken: dict[str, str] = {}
    seen: dict[str, str] = {}
    for raw_name, entry in servers.items():
        name = _check_name(raw_name, section, seen, ctx)
        path = (section, name)
        model = _validate_entry(entry, path, RawClientServer if client_shape else RawUpstream, ctx)
        if isinstance(model, RawClientServer) and model.disabled:
            disabled.append(name)
            continue
        try:
            upstreams[name] = _build_upstream(name, model, path, timeouts, defaults, ctx)
        except EntryError as exc:  # this upstream alone is unusable here; the others serve
            if ctx.strict:
                raise
            broken[name] = exc.message.split(": ", 1)[1]  # without the file: the config names it
    return AggregatorConfig(
        upstreams=upstreams,
        timeouts=timeouts,
        max_result_bytes=defaults.max_result_bytes,
        source=ctx.source,
        disabled=sorted(disabled),
        broken=broken,
        own_tools=own_tools,
    )


def _server_section(data: dict[Any, Any], ctx: Context) -> str:
    present = [key for key in SERVER_SECTIONS if key in data]
    if len(present) > 1:
        first, second = present[0], present[1]
        raise ctx.error(
            (second,),
            f"both {first}: and {second}: are given",
            f"keep one of them, with every server under {first}:",
        )
    return present[0] if present else "upstreams"


def _check_top_keys(data: dict[Any, Any], client_shape: bool, ctx: Context) -> None:
    for key in data:
        if key in TOP_KEYS:
            continue
        suggestion = _closest(str(key), TOP_KEYS, cutoff=0.75 if client_shape else 0.6)
        if client_shape and suggestion is None:
            continue  # the client's own settings (globalShortcut, inputs, ...)
        raise ctx.error((str(key),), "unknown key", _unknown_key_fix(suggestion, TOP_KEYS))


def _unknown_key_fix(suggestion: str | None, valid: Iterable[str]) -> str:
    if suggestion is not None:
        return f"did you mean {suggestion!r}?"
    return "remove it; valid keys here: " + ", ".join(sorted(valid))


def _build_defaults(raw: Any, ctx: Context) -> RawDefaults:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ctx.error(("defaults",), "must be a mapping", "write defaults: {timeouts: {connect: 10, call: 60}}")
    model = _validate(RawDefaults, raw, ("defaults",), ctx)
    assert isinstance(model, RawDefaults)
    return model


def _build_own_tools(raw: Any, ctx: Context) -> OwnTools:
    if raw is None:
        return OwnTools()
    if not isinstance(raw, dict):
        fix = "write own_tools: {introspection: false, text_index: false}"
        raise ctx.error(("own_tools",), "must be a mapping", fix)
    model = _validate(OwnTools, raw, ("own_tools",), ctx)
    assert isinstance(model, OwnTools)
    return model


def _default_timeouts(model: RawDefaults) -> Timeouts:
    return Timeouts(
        connect=model.timeouts.connect if model.timeouts.connect is not None else DEFAULT_TIMEOUTS.connect,
        call=model.timeouts.call if model.timeouts.call is not None else DEFAULT_TIMEOUTS.call,
    )


def _check_name(raw_name: Any, section: str, seen: dict[str, str], ctx: Context) -> str:
    """Validate an upstream name; ``seen`` maps case-folded names to the first spelling."""
    if isinstance(raw_name, bool) or not isinstance(raw_name, str | int):
        raise ctx.error((section,), f"the server name {raw_name!r} is not a string", "use a name like my_server")
    name = str(raw_name)
    path = (section, name)
    if not NAME_PATTERN.fullmatch(name):
        fixed = re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_") or "my_server"
        raise ctx.error(
            path,
            "the name may use only letters, digits, '_' and '-'",
            f"rename it, e.g. to {fixed!r}",
        )
    if name.casefold() == RESERVED_NAME:
        raise ctx.error(
            path,
            f"the name {RESERVED_NAME!r} is reserved for the aggregator's own tools",
            "rename it; if this entry starts the aggregator itself, remove it",
        )
    folded = name.casefold()
    if folded in seen:
        raise ctx.error(
            path,
            f"the names {seen[folded]!r} and {name!r} differ only in case",
            "give every server a name that differs from the others ignoring case",
        )
    seen[folded] = name
    return name


def _validate_entry(entry: Any, path: KeyPath, model: type[RawUpstream], ctx: Context) -> RawUpstream:
    if entry is None:
        raise ctx.error(path, "the server has no settings", "give it command: (a local server) or url: (a remote one)")
    if not isinstance(entry, dict):
        raise ctx.error(path, "must be a mapping of settings", "write NAME: {command: ..., args: [...]}")
    validated = _validate(model, entry, path, ctx)
    assert isinstance(validated, RawUpstream)
    return validated


def _validate(model: type[BaseModel], data: dict[Any, Any], path: KeyPath, ctx: Context) -> BaseModel:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _from_validation_error(exc, model, path, ctx) from None


def _from_validation_error(exc: ValidationError, model: type[BaseModel], path: KeyPath, ctx: Context) -> ConfigError:
    """The first problem (unknown keys first: a typo often explains the rest) as a ConfigError."""
    errors = sorted(
        exc.errors(include_url=False, include_input=False, include_context=False),
        key=lambda err: err["type"] != "extra_forbidden",
    )
    err = errors[0]
    loc = tuple(err["loc"])
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    if err["type"] == "extra_forbidden":
        valid = _valid_keys(model, loc[:-1])
        suggestion = _closest(str(loc[-1]), valid)
        return ctx.error((*path, *loc), f"unknown key{more}", _unknown_key_fix(suggestion, valid))
    message = str(err["msg"])
    problem = message[:1].lower() + message[1:] + more
    hint = next((FIX_HINTS[p] for p in loc if isinstance(p, str) and p in FIX_HINTS), EXAMPLE_HINT)
    return ctx.error((*path, *loc), problem, hint)


def _valid_keys(model: type[BaseModel], loc: KeyPath) -> list[str]:
    """The field names of the (nested) model found at ``loc`` inside ``model``."""
    current: type[BaseModel] = model
    for part in loc:
        field = current.model_fields.get(str(part))
        nested = _model_in(field.annotation) if field is not None else None
        if nested is None:
            return []
        current = nested
    return list(current.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _build_upstream(
    name: str, raw: RawUpstream, path: KeyPath, timeouts: Timeouts, defaults: RawDefaults, ctx: Context
) -> UpstreamConfig:
    client = raw if isinstance(raw, RawClientServer) else None
    url_key = "url"
    url = raw.url
    if client is not None and client.serverUrl is not None:
        if raw.url is not None:
            raise ctx.error((*path, "serverUrl"), "both url and serverUrl are given", "keep one of them")
        url, url_key = client.serverUrl, "serverUrl"
    _check_endpoint(raw, url, url_key, path, ctx)
    _check_auth(raw, path, ctx)
    transport = resolve_transport(raw, url, path, ctx)
    if url is not None and not url.startswith("${") and not _WEB_URL.match(url):  # a transport we speak: HTTP
        raise ctx.error(
            (*path, url_key),
            f"{url_key} is not an http:// or https:// address",
            f"write the server's address, e.g. {url_key}: https://example.com/mcp (a local program goes in command:)",
        )
    expand = Expander(ctx, path)
    env = dict(raw.env)
    if client is not None and client.envFile is not None:
        env_path = expand.value(client.envFile, ("envFile",))
        env = read_env_file(env_path, (*path, "envFile"), ctx) | env
    resolved_cwd = expand.optional(raw.cwd, ("cwd",))
    pin = list(dict.fromkeys(raw.pin))
    for index, tool in enumerate(pin):
        if not raw.tools.allows(tool):
            raise ctx.error(
                (*path, "pin", index),
                f"the pinned tool {tool!r} is hidden by tools.allow/deny",
                "unpin it, or change the filter so that it allows the tool",
            )
    return UpstreamConfig(
        name=name,
        transport=transport,
        command=_home(expand.optional(raw.command, ("command",)), ctx),
        args=[expand.value(arg, ("args", i)) for i, arg in enumerate(raw.args)],
        env={key: expand.value(value, ("env", key)) for key, value in env.items()},
        cwd=_resolve_cwd(_home(resolved_cwd, ctx), ctx),
        url=expand.optional(url, (url_key,)),
        headers={key: expand.value(value, ("headers", key)) for key, value in raw.headers.items()},
        description=raw.description.strip(),
        capabilities=list(dict.fromkeys(raw.capabilities)),
        start=raw.start,
        expose=raw.expose,
        pin=pin,
        prefix=raw.prefix,
        tools=raw.tools,
        roots=[expand.value(root, ("roots", i)) for i, root in enumerate(raw.roots)],
        sessions=raw.sessions,
        timeouts=Timeouts(
            connect=raw.timeouts.connect if raw.timeouts.connect is not None else timeouts.connect,
            call=raw.timeouts.call if raw.timeouts.call is not None else timeouts.call,
        ),
        snapshots=raw.snapshots if raw.snapshots is not None else defaults.snapshots,
        snapshot_max_age=raw.snapshot_max_age if raw.snapshot_max_age is not None else defaults.snapshot_max_age,
        max_message_bytes=raw.max_message_bytes if raw.max_message_bytes is not None else defaults.max_message_bytes,
        call_path=raw.call_path or defaults.call_path,
        auth=raw.auth,
        scopes=list(dict.fromkeys(raw.scopes)),
        client_id=expand.optional(raw.client_id, ("client_id",)) or None,
        client_secret=expand.optional(raw.client_secret, ("client_secret",)) or None,
        client_metadata_url=expand.optional(raw.client_metadata_url, ("client_metadata_url",)) or None,
        client_private_key=expand.optional(raw.client_private_key, ("client_private_key",)) or None,
        client_signing_algorithm=raw.client_signing_algorithm,
        issuer=expand.optional(raw.issuer, ("issuer",)) or None,
        idp_token_endpoint=expand.optional(raw.idp_token_endpoint, ("idp_token_endpoint",)) or None,
        idp_id_token=expand.optional(raw.idp_id_token, ("idp_id_token",)) or None,
        idp_client_id=expand.optional(raw.idp_client_id, ("idp_client_id",)) or None,
    )


_WEB_URL = re.compile(r"https?://[^/\s?#]", re.IGNORECASE)  # a scheme we speak, and a host (which may be ${HOST})


def _check_endpoint(raw: RawUpstream, url: str | None, url_key: str, path: KeyPath, ctx: Context) -> None:
    """Exactly one of command/url, and no settings that belong to the other kind."""
    if raw.command is not None and url is not None:
        raise ctx.error(
            path,
            f"both command and {url_key} are given",
            f"keep command for a local (stdio) server, or {url_key} for a remote (http/sse) one",
        )
    if raw.command is None and url is None:
        raise ctx.error(
            path,
            "neither command nor url is given",
            "add command: (and args:) to start a local server, or url: to reach a remote one",
        )
    if raw.command is not None and not raw.command.strip():
        raise ctx.error(
            (*path, "command"), "command is empty", "give the program that starts the server, e.g. command: uvx"
        )
    if url is not None:
        for key in ("args", "env", "cwd"):
            if getattr(raw, key):
                raise ctx.error(
                    (*path, key),
                    f"{key} applies only to a server started with command",
                    f"remove {key}, or start the server with command:",
                )
    if raw.command is not None:
        for key in AUTH_KEYS:
            if getattr(raw, key):
                raise ctx.error(
                    (*path, key),
                    f"{key} applies only to a remote server (url)",
                    f"remove {key}, or reach the server by url:",
                )
    if raw.command is not None and raw.headers:
        raise ctx.error(
            (*path, "headers"),
            "headers apply only to a remote server (url)",
            "remove headers, or pass the values through env:",
        )


_AUTH_NEEDS: dict[str, tuple[tuple[str, ...], ...]] = {  # each inner tuple: one of these keys
    "client_credentials": (("client_id",), ("client_secret", "client_private_key")),
    "identity_assertion": (("client_id",), ("client_secret",), ("issuer",), ("idp_token_endpoint",), ("idp_id_token",)),
}


def _check_auth(raw: RawUpstream, path: KeyPath, ctx: Context) -> None:
    """The keys an `auth:` kind cannot work without."""
    for keys in _AUTH_NEEDS.get(raw.auth or "", ()):
        if not any(getattr(raw, key) for key in keys):
            raise ctx.error(
                (*path, "auth"),
                f"auth: {raw.auth} needs {' or '.join(keys)}",
                f"add {keys[0]}: (see docs/oauth.md)",
            )


def _home(value: str | None, ctx: Context) -> str | None:
    """Expand a leading ``~`` or ``~/`` (not ``~user``), with HOME from the given environment."""
    if value is None or not (value == "~" or value.startswith("~/")):
        return value
    home = ctx.environ.get("HOME") or str(Path.home())
    return home + value[1:]


def _resolve_cwd(cwd: str | None, ctx: Context) -> str | None:
    if cwd is None or ctx.base_dir is None or Path(cwd).is_absolute():
        return cwd
    return str(ctx.base_dir / cwd)
