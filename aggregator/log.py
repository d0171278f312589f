"""Logging: structlog events and stdlib records, one ``key=value`` line each, to stderr or a file.

Never stdout: in stdio mode stdout carries the MCP protocol. Every line passes a redaction
step: values under secret-looking keys (token, authorization, password, secret, api_key, cookie,
headers, env, ...) become ``***``, and credentials inside strings (``Bearer xyz``, ``?token=xyz``,
``user:pw@host``, ``password=xyz``) are masked.

Every configured secret *value* (upstream env and header values, the HTTP token) is registered
with `register_secrets` and masked by `redact_text` wherever it appears, whatever its shape: in
log lines, fault messages, stderr tails and CLI output, which all pass through `redact_text`.

The stdlib loggers (the mcp SDK, uvicorn, httpx2) share the sink at WARNING, or at the chosen
level when that is stricter; the aggregator's own loggers (``aggregator.*``) use the chosen level.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO


def _import_structlog_without_rich() -> None:
    """Import structlog with `rich` hidden: `structlog.dev` imports rich (about 65 modules with pygments)
    only to offer pretty tracebacks, which our key=value renderer never uses. The CLI's progress
    bar still imports rich itself when it draws one (issue 24: no rich in `serve`)."""
    if "structlog" in sys.modules or "rich" in sys.modules:
        return
    sys.modules["rich"] = None  # type: ignore[assignment]  # `import rich` now raises ImportError
    try:
        import structlog  # noqa: F401
    finally:
        del sys.modules["rich"]


_import_structlog_without_rich()

import structlog  # noqa: E402
from structlog.typing import EventDict, Processor, WrappedLogger  # noqa: E402

__all__ = [
    "REDACTED",
    "configure_logging",
    "forget_secrets",
    "get_logger",
    "is_secret_key",
    "redact_event",
    "redact_text",
    "register_secrets",
    "reset_logging",
]

REDACTED = "***"
_ROOT_NAME = "aggregator"
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
_KEY_ORDER = ("timestamp", "level", "logger", "event")
_MAX_DEPTH = 8

# A key is secret if its letters contain one of these ...
_SECRET_SUBSTRINGS = (
    "apikey",
    "password",
    "passwd",
    "secret",
    "authorization",
    "cookie",
    "credential",
    "privatekey",
)
# ... or one of its words (split on punctuation and camelCase) is one of these.
_SECRET_WORDS = frozenset({"token", "auth", "bearer", "env", "environ", "environment", "header", "headers"})

_CREDENTIAL_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Authorization schemes: "Bearer abc.def", "Basic dXNlcjpw"
    (re.compile(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9\-._~+/]+=*"), rf"\1\2{REDACTED}"),
    # Query parameters: ?access_token=..., &api_key=..., &sig=...
    (
        re.compile(r"(?i)([?&][\w.-]*(?:token|key|secret|password|passwd|auth|sig|signature)[\w.-]*=)[^&\s#\"']+"),
        rf"\1{REDACTED}",
    ),
    # Credentials in URLs: scheme://user:password@host
    (re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^/\s:@]+:)[^@\s/]+@"), rf"\1{REDACTED}@"),
    # Assignments in free text: password=..., api_key: ..., "token": "..."
    (
        re.compile(r"(?i)\b([\w-]*(?:api[-_]?key|token|password|passwd|secret)[\"']?\s*[:=]\s*[\"']?)[^\s\"',;&}]+"),
        rf"\1{REDACTED}",
    ),
)

_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")

MIN_SECRET_CHARS = 6  # shorter values ("1", "true", "dev") cannot be masked without garbling text
_secret_values: set[str] = set()
_secret_pattern: re.Pattern[str] | None = None


def register_secrets(values: Iterable[str]) -> None:
    """Mask these values (and their escaped and trimmed forms, and their words) from now on."""
    global _secret_pattern
    before = len(_secret_values)
    for value in values:
        _secret_values.update(v for v in _secret_variants(value) if len(v) >= MIN_SECRET_CHARS)
    if len(_secret_values) != before:
        ordered = sorted(_secret_values, key=lambda v: (-len(v), v))  # longest first: no partial leftovers
        _secret_pattern = re.compile("|".join(re.escape(v) for v in ordered))


def _secret_variants(value: str) -> set[str]:
    """How a value shows up in text: as is, trimmed, escaped (repr, JSON), and word by word
    (the token of ``Bearer <token>``)."""
    variants = {value, value.strip(), json.dumps(value)[1:-1], repr(value)[1:-1]}
    variants |= {value.encode("unicode_escape").decode("ascii", "replace")}
    variants |= set(value.split())
    return variants


def forget_secrets() -> None:
    """Drop every registered secret (for tests)."""
    global _secret_pattern
    _secret_values.clear()
    _secret_pattern = None


def is_secret_key(key: str) -> bool:
    """True if a value stored under ``key`` must not be logged."""
    compact = re.sub(r"[^a-z0-9]", "", key.lower())
    if any(part in compact for part in _SECRET_SUBSTRINGS):
        return True
    return any(word.lower() in _SECRET_WORDS for word in _WORDS.findall(key))


def redact_text(text: str) -> str:
    """Mask registered secret values and credentials that appear inside a string."""
    if _secret_pattern is not None:
        text = _secret_pattern.sub(REDACTED, text)
    for pattern, replacement in _CREDENTIAL_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def redacted(value: Any) -> Any:
    """`value` as it may be shown: strings masked, and the values under secret-looking keys of any
    mapping in it replaced (the log processor's rule, for output that is not a log line)."""
    return _redact_value(value)


def _redact_value(value: Any, depth: int = 0) -> Any:
    if depth > _MAX_DEPTH:
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {
            key: REDACTED if isinstance(key, str) and is_secret_key(key) else _redact_value(item, depth + 1)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple | set | frozenset):
        return [_redact_value(item, depth + 1) for item in value]
    if isinstance(value, BaseException):
        return redact_text(f"{type(value).__name__}: {value}")
    model_dump = getattr(value, "model_dump", None)  # pydantic models: their repr may hold secrets
    if callable(model_dump):
        try:
            return _redact_value(model_dump(mode="json"), depth + 1)
        except Exception:
            return f"<{type(value).__name__}>"
    return value


def redact_event(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """structlog processor: mask secret-keyed values and credentials inside strings."""
    for key in list(event_dict):
        if key.startswith("_"):  # structlog internals (_record, _from_structlog)
            continue
        value = event_dict[key]
        event_dict[key] = REDACTED if is_secret_key(key) else _redact_value(value)
    return event_dict


def _render(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> str:
    """One logfmt-style line: timestamp, level, logger, event first; newlines escaped."""
    keys = [key for key in _KEY_ORDER if key in event_dict]
    keys += [key for key in event_dict if key not in _KEY_ORDER and not key.startswith("_")]
    return " ".join(f"{_render_key(key)}={_render_value(event_dict[key])}" for key in keys)


def _render_key(key: str) -> str:
    return re.sub(r"[\s=\"]", "_", key) or "_"


def _render_value(value: Any) -> str:
    text = "" if value is None else str(value)
    if isinstance(value, bool):
        text = "true" if value else "false"
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    escaped = escaped.replace("\t", "\\t")
    if not text or any(c in text for c in ' ="\\\n\r\t'):
        return f'"{escaped}"'
    return escaped


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at emit time (pytest and the SDK may swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        """Ignored: the stream is always the current sys.stderr."""


_installed: list[logging.Handler] = []


def _level_number(level: str) -> int:
    try:
        return _LEVELS[level.strip().lower()]
    except KeyError:
        valid = ", ".join(sorted(_LEVELS, key=_LEVELS.__getitem__))
        raise ValueError(f"unknown log level {level!r}; use one of {valid}") from None


def _shared_processors() -> list[Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]


def configure_logging(level: str = "warning", file: Path | None = None) -> None:
    """Send all logging to stderr (or ``file``), one redacted line per event. Safe to call again.

    Raises ValueError for an unknown level and OSError if ``file`` cannot be opened.
    """
    number = _level_number(level)
    handler: logging.Handler
    if file is None:
        handler = _StderrHandler()
    else:
        path = Path(file).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*_shared_processors(), structlog.stdlib.PositionalArgumentsFormatter()],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                redact_event,
                _render,
            ],
        )
    )
    _install(handler, number)
    _configure_structlog(structlog.stdlib.ProcessorFormatter.wrap_for_formatter)


def _configure_structlog(last: Processor) -> None:
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_shared_processors(),
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            last,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,  # so that a second configure_logging() takes effect
    )


def _install(handler: logging.Handler, level: int) -> None:
    """Replace the handler installed by an earlier call; set the root and our own levels."""
    root = logging.getLogger()
    for old in _installed:
        root.removeHandler(old)
        old.close()
    _installed.clear()
    root.addHandler(handler)
    _installed.append(handler)
    root.setLevel(max(logging.WARNING, level))
    logging.getLogger(_ROOT_NAME).setLevel(level)


def reset_logging() -> None:
    """Undo `configure_logging`: remove and close its handler, reset levels (for tests)."""
    root = logging.getLogger()
    for old in _installed:
        root.removeHandler(old)
        old.close()
    _installed.clear()
    root.setLevel(logging.WARNING)
    logging.getLogger(_ROOT_NAME).setLevel(logging.NOTSET)
    _configure_structlog(_render_redacted)


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A structlog logger; use ``get_logger(__name__)`` so the level of ``aggregator.*`` applies."""
    return structlog.stdlib.get_logger(name)  # type: ignore[no-any-return]


def _render_redacted(logger: WrappedLogger, method: str, event_dict: EventDict) -> str:
    return _render(logger, method, redact_event(logger, method, event_dict))


# Until configure_logging() runs, structlog's own default would print to *stdout*, which carries
# the protocol in stdio mode. Route events through the stdlib instead: its last-resort handler
# writes WARNING and above to stderr.
if not structlog.is_configured():
    _configure_structlog(_render_redacted)
