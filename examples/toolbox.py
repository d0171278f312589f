"""toolbox: an example MCP server with two dozen small, genuinely working utility tools.

Families: time (current time, time-zone conversion, durations), text (counts, slugs, case, regex,
replace, diff), data (JSON, CSV, YAML, base64, hashes, UUIDs, URLs) and math (safe arithmetic, unit and
number-base conversion, statistics). Enough tools, with descriptive names and argument schemas, that
tool search has something to rank.

Run:
  python -m aggregator.examples.toolbox                      # stdio (default)
  python examples/toolbox.py streamable-http --port 8931     # http://127.0.0.1:8931/mcp
  python examples/toolbox.py sse --port 8932                 # http://127.0.0.1:8932/sse
"""

import argparse
import ast
import base64
import csv
import difflib
import hashlib
import inspect
import io
import json
import math
import re
import secrets
import statistics
import string
import unicodedata
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

MAX_TEXT = 1_000_000

# ---- time -------------------------------------------------------------------------------------


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name.strip() or "UTC")
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ToolError(f"unknown time zone {name!r}; use an IANA name such as 'Europe/Paris'") from exc


def _parse_time(text: str, zone: ZoneInfo) -> datetime:
    """Parse an ISO 8601 timestamp ('now' allowed); a naive time is read in `zone`."""
    if text.strip().lower() == "now":
        return datetime.now(zone)
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise ToolError(f"not an ISO 8601 time: {text!r} (example: 2025-03-14T15:09:26)") from exc
    return moment if moment.tzinfo else moment.replace(tzinfo=zone)


def _describe(moment: datetime) -> dict[str, str]:
    return {
        "iso": moment.isoformat(),
        "zone": str(moment.tzinfo),
        "utc_offset": moment.strftime("%z")[:3] + ":" + moment.strftime("%z")[3:],
        "weekday": moment.strftime("%A"),
    }


def current_time(
    timezone: Annotated[str, Field(description="IANA time zone, e.g. 'UTC', 'America/New_York'.")] = "UTC",
) -> dict[str, str]:
    """Get the current date and time in a time zone, with its UTC offset and weekday."""
    return _describe(datetime.now(_zone(timezone)))


def convert_timezone(
    time: Annotated[str, Field(description="ISO 8601 time, e.g. '2025-03-14T09:30', or 'now'.")],
    from_zone: Annotated[str, Field(description="IANA zone the time is in (unless it has an offset).")],
    to_zone: Annotated[str, Field(description="IANA zone to convert the time to.")],
) -> dict[str, str]:
    """Convert a time from one time zone to another (daylight saving time aware)."""
    moment = _parse_time(time, _zone(from_zone))
    return {"from": moment.isoformat(), **_describe(moment.astimezone(_zone(to_zone)))}


def add_duration(
    time: Annotated[str, Field(description="ISO 8601 start time, or 'now'.")],
    days: Annotated[float, Field(description="Days to add (negative to subtract).")] = 0,
    hours: Annotated[float, Field(description="Hours to add.")] = 0,
    minutes: Annotated[float, Field(description="Minutes to add.")] = 0,
    seconds: Annotated[float, Field(description="Seconds to add.")] = 0,
    zone: Annotated[str, Field(description="IANA zone for a naive time and for the result.")] = "UTC",
) -> str:
    """Add (or subtract) a duration in days, hours, minutes and seconds to a date/time."""
    tz = _zone(zone)
    try:
        delta = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
        # Wall-clock arithmetic in UTC, so adding 24 h across a DST change gives 24 real hours.
        result = (_parse_time(time, tz).astimezone(UTC) + delta).astimezone(tz)
    except OverflowError as exc:
        raise ToolError("the result is outside the supported date range") from exc
    return result.isoformat()


def time_difference(
    start: Annotated[str, Field(description="ISO 8601 start time, or 'now'.")],
    end: Annotated[str, Field(description="ISO 8601 end time, or 'now'.")],
    zone: Annotated[str, Field(description="IANA zone for naive times.")] = "UTC",
) -> dict[str, Any]:
    """Compute the elapsed duration between two date/times (negative when end is before start)."""
    tz = _zone(zone)
    delta = _parse_time(end, tz) - _parse_time(start, tz)
    total = delta.total_seconds()
    magnitude = abs(total)
    days, rest = divmod(magnitude, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    sign = "-" if total < 0 else ""
    seconds_part = f"{int(secs):02d}" if secs.is_integer() else f"{secs:06.3f}"
    clock = f"{int(hours):02d}:{int(minutes):02d}:{seconds_part}"
    return {
        "seconds": total,
        "human": f"{sign}{int(days)}d {clock}",
        "days": total / 86400,
        "hours": total / 3600,
    }


# ---- text -------------------------------------------------------------------------------------

TextArg = Annotated[str, Field(description="The input text.", max_length=MAX_TEXT)]


def word_count(text: TextArg) -> dict[str, int]:
    """Count words, characters, lines, sentences and paragraphs in a text."""
    stripped = text.strip()
    return {
        "words": len(re.findall(r"\b\w[\w'-]*\b", text)),
        "characters": len(text),
        "characters_no_spaces": len(re.sub(r"\s", "", text)),
        "lines": len(text.splitlines()),
        "sentences": len(re.findall(r"[^.!?]+[.!?]+", stripped)) or (1 if stripped else 0),
        "paragraphs": len([p for p in re.split(r"\n\s*\n", stripped) if p.strip()]),
    }


def _words(text: str) -> list[str]:
    """Split text into words at spaces, punctuation, '_', '-' and camelCase boundaries."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", text)
    spaced = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", spaced)
    return [w for w in re.split(r"[^0-9A-Za-z\u00C0-\uFFFF]+", spaced) if w]


def slugify(
    text: TextArg,
    separator: Annotated[str, Field(description="Separator between words.", max_length=3)] = "-",
    max_length: Annotated[int, Field(description="Maximum slug length.", ge=1, le=500)] = 80,
) -> str:
    """Turn text into a URL-friendly ASCII slug, e.g. 'Hello, World!' -> 'hello-world'."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().replace("'", "")
    words = re.findall(r"[a-z0-9]+", ascii_text.lower())
    return separator.join(words)[:max_length].strip(separator)


def change_case(
    text: TextArg,
    style: Annotated[
        Literal["upper", "lower", "title", "sentence", "snake", "kebab", "camel", "pascal", "constant"],
        Field(description="Target case style."),
    ],
) -> str:
    """Convert text between case styles: snake_case, kebab-case, camelCase, PascalCase, UPPER, Title..."""
    words = _words(text)
    match style:
        case "upper":
            return text.upper()
        case "lower":
            return text.lower()
        case "title":
            return re.sub(r"(^|\s)(\w)", lambda m: m.group(1) + m.group(2).upper(), text)
        case "sentence":
            lowered = text.lower()
            return lowered[:1].upper() + lowered[1:]
        case "snake":
            return "_".join(w.lower() for w in words)
        case "kebab":
            return "-".join(w.lower() for w in words)
        case "constant":
            return "_".join(w.upper() for w in words)
        case "camel":
            return "".join(w.lower() if i == 0 else w.capitalize() for i, w in enumerate(words))
        case _:
            return "".join(w.capitalize() for w in words)


def _compile(pattern: str, ignore_case: bool, multiline: bool) -> re.Pattern[str]:
    flags = (re.IGNORECASE if ignore_case else 0) | (re.MULTILINE if multiline else 0)
    try:
        return re.compile(pattern, flags)
    except re.error as exc:
        raise ToolError(f"invalid regular expression: {exc}") from exc


def regex_find(
    pattern: Annotated[str, Field(description="Python regular expression.")],
    text: TextArg,
    ignore_case: Annotated[bool, Field(description="Match case-insensitively.")] = False,
    multiline: Annotated[bool, Field(description="'^' and '$' match at every line.")] = False,
    max_matches: Annotated[int, Field(description="Stop after this many matches.", ge=1, le=10000)] = 100,
) -> dict[str, Any]:
    """Find all matches of a regular expression in a text, with positions and captured groups."""
    regex = _compile(pattern, ignore_case, multiline)
    matches = []
    for found in regex.finditer(text):
        if len(matches) == max_matches:
            break
        span = {"start": found.start(), "end": found.end()}
        matches.append({"match": found.group(0), **span, "groups": list(found.groups())})
    return {"count": len(matches), "matches": matches}


def replace_text(
    text: TextArg,
    find: Annotated[str, Field(description="Text (or regular expression) to search for.", min_length=1)],
    replacement: Annotated[str, Field(description="Replacement; with regex, \\1 refers to group 1.")],
    regex: Annotated[bool, Field(description="Treat `find` as a regular expression.")] = False,
    ignore_case: Annotated[bool, Field(description="Match case-insensitively.")] = False,
) -> dict[str, Any]:
    """Find and replace every occurrence of a string or regular expression in a text."""
    compiled = _compile(find if regex else re.escape(find), ignore_case, False)
    try:
        result, count = compiled.subn(replacement if regex else replacement.replace("\\", "\\\\"), text)
    except re.error as exc:
        raise ToolError(f"invalid replacement: {exc}") from exc
    return {"replacements": count, "text": result}


def text_diff(
    before: Annotated[str, Field(description="The original text.", max_length=MAX_TEXT)],
    after: Annotated[str, Field(description="The changed text.", max_length=MAX_TEXT)],
    context_lines: Annotated[int, Field(description="Unchanged lines around each change.", ge=0, le=100)] = 3,
) -> str:
    """Compare two texts line by line and return a unified diff of the changes."""
    diff = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile="before",
        tofile="after",
        n=context_lines,
    )
    lines = [line if line.endswith("\n") else line + "\n" for line in diff]
    return "".join(lines) or "(no differences)"


# ---- data -------------------------------------------------------------------------------------


def _load_json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ToolError(f"invalid JSON: {exc}") from exc


def json_format(
    json_text: Annotated[str, Field(description="A JSON document.", max_length=MAX_TEXT)],
    indent: Annotated[int, Field(description="Spaces per level; 0 gives one compact line.", ge=0, le=8)] = 2,
    sort_keys: Annotated[bool, Field(description="Sort object keys alphabetically.")] = False,
) -> str:
    """Validate and pretty-print (or minify) a JSON document."""
    value = _load_json(json_text)
    if indent == 0:
        return json.dumps(value, sort_keys=sort_keys, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(value, indent=indent, sort_keys=sort_keys, ensure_ascii=False)


_PATH_TOKEN = re.compile(r"\.?([^.\[\]]+)|\[(-?\d+)\]|\[\"([^\"]*)\"\]|\['([^']*)'\]")


def _path_steps(path: str) -> list[str | int]:
    """Split 'a.b[0]["c d"]' into ['a', 'b', 0, 'c d']; a leading '$' is ignored."""
    rest = path.strip().removeprefix("$")
    steps: list[str | int] = []
    position = 0
    while position < len(rest):
        token = _PATH_TOKEN.match(rest, position)
        if token is None:
            raise ToolError(f"cannot parse path {path!r} at position {position}")
        key, index, dq, sq = token.groups()
        steps.append(int(index) if index is not None else next(s for s in (key, dq, sq) if s is not None))
        position = token.end()
    return steps


def json_query(
    json_text: Annotated[str, Field(description="A JSON document.", max_length=MAX_TEXT)],
    path: Annotated[str, Field(description="Path such as 'users[0].name' or '$.a.b[\"key with dots.\"]'.")],
) -> str:
    """Extract the value at a path (dot keys and [index]) from a JSON document, returned as JSON."""
    value = _load_json(json_text)
    for step in _path_steps(path):
        try:
            if isinstance(step, int) and isinstance(value, list):
                value = value[step]
            elif isinstance(value, dict) and str(step) in value:
                value = value[str(step)]
            else:
                raise KeyError(step)
        except (IndexError, KeyError) as exc:
            raise ToolError(f"path {path!r} not found: no {step!r}") from exc
    return json.dumps(value, indent=2, ensure_ascii=False)


def csv_to_json(
    csv_text: Annotated[str, Field(description="CSV text.", max_length=MAX_TEXT)],
    delimiter: Annotated[str, Field(description="Field delimiter.", min_length=1, max_length=1)] = ",",
    header: Annotated[bool, Field(description="The first row holds column names.")] = True,
) -> str:
    """Convert CSV text into JSON: a list of objects keyed by the header row (or a list of rows)."""
    try:
        rows = list(csv.reader(io.StringIO(csv_text), delimiter=delimiter))
    except csv.Error as exc:
        raise ToolError(f"invalid CSV: {exc}") from exc
    if header and rows:
        names = rows[0]
        data: list[Any] = [dict(zip(names, row, strict=False)) for row in rows[1:]]
    else:
        data = rows
    return json.dumps(data, indent=2, ensure_ascii=False)


def yaml_to_json(
    yaml_text: Annotated[str, Field(description="A YAML document.", max_length=MAX_TEXT)],
) -> str:
    """Convert a YAML document into JSON (safe loading: no custom tags, no code)."""
    import yaml  # PyYAML, imported on first use to keep the server's start-up fast

    try:
        value = yaml.safe_load(yaml_text)
    except yaml.YAMLError as exc:
        raise ToolError(f"invalid YAML: {exc}") from exc
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def base64_encode(
    text: TextArg,
    url_safe: Annotated[bool, Field(description="Use the URL-safe alphabet (- and _).")] = False,
) -> str:
    """Encode UTF-8 text as base64."""
    raw = text.encode()
    return (base64.urlsafe_b64encode(raw) if url_safe else base64.b64encode(raw)).decode()


def base64_decode(
    data: Annotated[str, Field(description="Base64 data (padding optional).", max_length=MAX_TEXT)],
    url_safe: Annotated[bool, Field(description="The data uses the URL-safe alphabet.")] = False,
) -> str:
    """Decode base64 data into UTF-8 text."""
    cleaned = re.sub(r"\s", "", data)
    cleaned += "=" * (-len(cleaned) % 4)
    try:
        raw = base64.b64decode(cleaned, altchars=b"-_" if url_safe else None, validate=True)
        return raw.decode()
    except ValueError as exc:  # binascii.Error and UnicodeDecodeError are ValueErrors
        raise ToolError(f"cannot decode: {exc}") from exc


def hash_text(
    text: TextArg,
    algorithm: Annotated[
        Literal["md5", "sha1", "sha256", "sha512", "sha3_256", "blake2b"],
        Field(description="Hash algorithm."),
    ] = "sha256",
) -> str:
    """Compute a hex checksum/digest of UTF-8 text (sha256, md5, sha1, sha512, sha3_256, blake2b)."""
    return hashlib.new(algorithm, text.encode()).hexdigest()


def generate_uuid(
    count: Annotated[int, Field(description="How many UUIDs.", ge=1, le=100)] = 1,
    name: Annotated[
        str | None, Field(description="If given, a deterministic UUID5 of this name (URL namespace).")
    ] = None,
) -> str:
    """Generate random UUID4 identifiers, or a name-based UUID5, one per line."""
    if name is not None:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, name))
    return "\n".join(str(uuid.uuid4()) for _ in range(count))


def url_parse(url: Annotated[str, Field(description="The URL to split.")]) -> dict[str, Any]:
    """Split a URL into scheme, host, port, path, query parameters and fragment."""
    parts = urlsplit(url.strip())
    try:
        port = parts.port
    except ValueError as exc:
        raise ToolError(f"invalid port in {url!r}") from exc
    return {
        "scheme": parts.scheme,
        "username": parts.username,
        "host": parts.hostname,
        "port": port,
        "path": parts.path,
        "query": parse_qs(parts.query, keep_blank_values=True),
        "fragment": parts.fragment,
    }


def generate_password(
    length: Annotated[int, Field(description="Password length.", ge=8, le=256)] = 16,
    symbols: Annotated[bool, Field(description="Include punctuation symbols.")] = True,
) -> str:
    """Generate a cryptographically random password with letters, digits and (optionally) symbols."""
    classes = [string.ascii_lowercase, string.ascii_uppercase, string.digits]
    if symbols:
        classes.append("!#$%&()*+,-./:;<=>?@[]^_{|}~")
    alphabet = "".join(classes)
    while True:
        password = "".join(secrets.choice(alphabet) for _ in range(length))
        if all(any(c in cls for c in password) for cls in classes):
            return password


# ---- math -------------------------------------------------------------------------------------

_BINARY_OPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: _safe_pow(a, b),
}
_UNARY_OPS: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: lambda a: +a, ast.USub: lambda a: -a}
_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau, "inf": math.inf}
_MATH_NAMES = (
    "sqrt",
    "cbrt",
    "exp",
    "log",
    "log2",
    "log10",
    "sin",
    "cos",
    "tan",
    "asin",
    "acos",
    "atan",
    "atan2",
    "sinh",
    "cosh",
    "tanh",
    "degrees",
    "radians",
    "floor",
    "ceil",
    "hypot",
    "gcd",
    "lcm",
    "trunc",
)
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    **{name: getattr(math, name) for name in _MATH_NAMES},
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "factorial": lambda n: math.factorial(n) if 0 <= n <= 1000 else _too_big(),
}


def _too_big() -> Any:
    raise ToolError("number too large")


def _safe_pow(base: Any, exponent: Any) -> Any:
    """Refuse powers whose integer result would exceed about a million bits (a cheap denial of service)."""
    integers = isinstance(base, int) and isinstance(exponent, int)
    if integers and exponent > 0 and abs(base).bit_length() * exponent > 1_000_000:
        return _too_big()
    return base**exponent


def _evaluate(node: ast.AST) -> Any:
    match node:
        case ast.Expression(body=body):
            return _evaluate(body)
        case ast.Constant(value=value) if isinstance(value, int | float) and not isinstance(value, bool):
            return value
        case ast.Name(id=name) if name in _CONSTANTS:
            return _CONSTANTS[name]
        case ast.BinOp(left=left, op=op, right=right) if type(op) in _BINARY_OPS:
            return _BINARY_OPS[type(op)](_evaluate(left), _evaluate(right))
        case ast.UnaryOp(op=op, operand=operand) if type(op) in _UNARY_OPS:
            return _UNARY_OPS[type(op)](_evaluate(operand))
        case ast.Call(func=ast.Name(id=name), args=args, keywords=[]) if name in _FUNCTIONS:
            return _FUNCTIONS[name](*(_evaluate(arg) for arg in args))
    raise ToolError(f"unsupported expression element: {ast.dump(node)[:80]}")


def calculate(
    expression: Annotated[
        str, Field(description="Math, e.g. '2 * (3 + 4) ** 2' or 'sqrt(2) * sin(pi / 4)'.", max_length=900)
    ],
) -> str:
    """Evaluate an arithmetic expression safely (+ - * / // % **, math functions, pi, e); no code runs."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
        value = _evaluate(tree)
    except SyntaxError as exc:
        raise ToolError(f"invalid expression: {exc.msg}") from exc
    except RecursionError as exc:
        raise ToolError("expression nested too deeply") from exc
    except (ArithmeticError, ValueError, TypeError) as exc:
        raise ToolError(f"cannot evaluate: {exc}") from exc
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


# Unit aliases per dimension, with the factor to the dimension's base unit. Temperatures are apart.
_UNIT_TABLES: dict[str, dict[tuple[str, ...], float]] = {
    "length": {
        ("mm", "millimeter", "millimetre"): 0.001,
        ("cm", "centimeter", "centimetre"): 0.01,
        ("m", "meter", "metre"): 1.0,
        ("km", "kilometer", "kilometre"): 1000.0,
        ("in", "inch", "inches"): 0.0254,
        ("ft", "foot", "feet"): 0.3048,
        ("yd", "yard"): 0.9144,
        ("mi", "mile"): 1609.344,
        ("nmi", "nautical_mile"): 1852.0,
    },
    "mass": {
        ("mg", "milligram"): 1e-6,
        ("g", "gram"): 0.001,
        ("kg", "kilogram"): 1.0,
        ("t", "tonne", "metric_ton"): 1000.0,
        ("oz", "ounce"): 0.028349523125,
        ("lb", "lbs", "pound"): 0.45359237,
        ("st", "stone"): 6.35029318,
    },
    "time": {
        ("ms", "millisecond"): 0.001,
        ("s", "sec", "second"): 1.0,
        ("min", "minute"): 60.0,
        ("h", "hr", "hour"): 3600.0,
        ("d", "day"): 86400.0,
        ("wk", "week"): 604800.0,
    },
    "volume": {
        ("ml", "milliliter", "millilitre"): 0.001,
        ("l", "liter", "litre"): 1.0,
        ("m3", "cubic_meter"): 1000.0,
        ("gal", "gallon", "us_gallon"): 3.785411784,
        ("qt", "quart"): 0.946352946,
        ("pt", "pint"): 0.473176473,
        ("cup",): 0.2365882365,
        ("floz", "fluid_ounce"): 0.0295735295625,
    },
    "speed": {
        ("m/s", "mps"): 1.0,
        ("km/h", "kph", "kmh"): 1 / 3.6,
        ("mph",): 0.44704,
        ("kn", "knot"): 1852 / 3600,
    },
    "data": {
        ("bit",): 0.125,
        ("b", "byte"): 1.0,
        ("kb", "kilobyte"): 1e3,
        ("mb", "megabyte"): 1e6,
        ("gb", "gigabyte"): 1e9,
        ("tb", "terabyte"): 1e12,
        ("kib", "kibibyte"): 1024.0,
        ("mib", "mebibyte"): 1024.0**2,
        ("gib", "gibibyte"): 1024.0**3,
        ("tib", "tebibyte"): 1024.0**4,
    },
}


def _unit_index() -> dict[str, tuple[str, float]]:
    """Alias -> (dimension, factor to the base unit)."""
    return {
        alias: (dimension, factor)
        for dimension, table in _UNIT_TABLES.items()
        for aliases, factor in table.items()
        for alias in aliases
    }


_UNITS = _unit_index()
_TEMPERATURES = {"c": "C", "celsius": "C", "f": "F", "fahrenheit": "F", "k": "K", "kelvin": "K"}


def _unit_key(unit: str) -> str:
    key = unit.strip().lower().replace(" ", "_")
    if key not in _UNITS and key not in _TEMPERATURES and key.endswith("s") and key[:-1] in _UNITS:
        return key[:-1]  # plural: "meters", "hours"
    return key


def _convert_temperature(value: float, source: str, target: str) -> float:
    kelvin = {"C": value + 273.15, "F": (value - 32) * 5 / 9 + 273.15, "K": value}[source]
    return {"C": kelvin - 273.15, "F": (kelvin - 273.15) * 9 / 5 + 32, "K": kelvin}[target]


def convert_units(
    value: Annotated[float, Field(description="The quantity to convert.")],
    from_unit: Annotated[str, Field(description="Source unit, e.g. 'km', 'lb', 'F', 'GiB', 'mph'.")],
    to_unit: Annotated[str, Field(description="Target unit of the same kind.")],
) -> str:
    """Convert a measurement between units of length, mass, time, volume, speed, data size or temperature."""
    source, target = _unit_key(from_unit), _unit_key(to_unit)
    if source in _TEMPERATURES and target in _TEMPERATURES:
        result = _convert_temperature(value, _TEMPERATURES[source], _TEMPERATURES[target])
    elif source in _UNITS and target in _UNITS:
        (source_kind, source_factor), (target_kind, target_factor) = _UNITS[source], _UNITS[target]
        if source_kind != target_kind:
            raise ToolError(f"cannot convert {source_kind} ({from_unit}) to {target_kind} ({to_unit})")
        result = value * source_factor / target_factor
    else:
        unknown = from_unit if source not in _UNITS and source not in _TEMPERATURES else to_unit
        raise ToolError(f"unknown or incompatible unit {unknown!r}")
    return f"{value:g} {from_unit} = {result:.10g} {to_unit}"


class NumberStats(BaseModel):
    """Descriptive statistics of a list of numbers."""

    count: int
    sum: float
    mean: float
    median: float
    minimum: float
    maximum: float
    range: float
    stdev: float | None = Field(description="Sample standard deviation; null for fewer than 2 numbers.")
    variance: float | None = Field(description="Sample variance; null for fewer than 2 numbers.")


def number_statistics(
    numbers: Annotated[list[float], Field(description="The numbers.", min_length=1, max_length=1_000_000)],
) -> NumberStats:
    """Compute descriptive statistics of numbers: count, sum, mean, median, min, max, standard deviation."""
    many = len(numbers) > 1
    try:
        return NumberStats(
            count=len(numbers),
            sum=math.fsum(numbers),
            mean=statistics.fmean(numbers),
            median=statistics.median(numbers),
            minimum=min(numbers),
            maximum=max(numbers),
            range=max(numbers) - min(numbers),
            stdev=statistics.stdev(numbers) if many else None,
            variance=statistics.variance(numbers) if many else None,
        )
    except (ArithmeticError, statistics.StatisticsError) as exc:
        raise ToolError(f"cannot compute statistics: {exc}") from exc


_DIGITS = string.digits + string.ascii_lowercase


def convert_number_base(
    value: Annotated[str, Field(description="An integer, e.g. 'ff', '0b1010', '-42'.", max_length=1000)],
    from_base: Annotated[
        int, Field(description="Base of `value` (2-36); 0 reads 0x/0o/0b prefixes.", ge=0, le=36)
    ] = 10,
    to_base: Annotated[int, Field(description="Base of the result (2-36).", ge=2, le=36)] = 16,
) -> str:
    """Convert an integer between number bases (binary, octal, decimal, hexadecimal, up to base 36)."""
    if from_base == 1:
        raise ToolError("from_base must be 0 or between 2 and 36")
    try:
        number = int(value.strip().replace("_", ""), from_base)
    except ValueError as exc:
        raise ToolError(f"{value!r} is not an integer in base {from_base}") from exc
    sign, number = ("-", -number) if number < 0 else ("", number)
    digits = []
    while True:
        number, digit = divmod(number, to_base)
        digits.append(_DIGITS[digit])
        if number == 0:
            return sign + "".join(reversed(digits))


# ---- server -----------------------------------------------------------------------------------

_PURE = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
_VARYING = ToolAnnotations(read_only_hint=True, idempotent_hint=False, open_world_hint=False)

# (function, title, annotations); number_statistics is the one tool with structured output.
TOOLS: list[tuple[Callable[..., Any], str, ToolAnnotations]] = [
    (current_time, "Current time in a time zone", _VARYING),
    (convert_timezone, "Convert a time between time zones", _PURE),
    (add_duration, "Add a duration to a date/time", _PURE),
    (time_difference, "Duration between two times", _PURE),
    (word_count, "Word and character count", _PURE),
    (slugify, "Slugify text", _PURE),
    (change_case, "Change text case", _PURE),
    (regex_find, "Regex find", _PURE),
    (replace_text, "Find and replace", _PURE),
    (text_diff, "Diff two texts", _PURE),
    (json_format, "Format JSON", _PURE),
    (json_query, "Query JSON by path", _PURE),
    (csv_to_json, "CSV to JSON", _PURE),
    (yaml_to_json, "YAML to JSON", _PURE),
    (base64_encode, "Base64 encode", _PURE),
    (base64_decode, "Base64 decode", _PURE),
    (hash_text, "Hash text", _PURE),
    (generate_uuid, "Generate UUIDs", _VARYING),
    (url_parse, "Parse a URL", _PURE),
    (generate_password, "Generate a password", _VARYING),
    (calculate, "Calculator", _PURE),
    (convert_units, "Convert units", _PURE),
    (number_statistics, "Statistics of numbers", _PURE),
    (convert_number_base, "Convert number base", _PURE),
]


def build_server() -> MCPServer:
    """The toolbox server with every tool registered."""
    server: MCPServer = MCPServer(
        "toolbox",
        version="1.0.0",
        instructions="Utility tools: time zones, text, JSON/CSV/base64/hash data helpers and math.",
        log_level="WARNING",
    )
    for fn, title, annotations in TOOLS:
        server.add_tool(
            fn,
            title=title,
            description=inspect.cleandoc(fn.__doc__ or ""),
            annotations=annotations,
            structured_output=fn is number_statistics,
        )
    return server


def local_security(host: str, port: int) -> TransportSecuritySettings | None:
    """DNS-rebinding protection that accepts this server's own loopback Host headers."""
    if host not in ("127.0.0.1", "localhost", "::1"):
        return None  # the SDK's default for other hosts: no Host check
    hosts = [f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"http://{h}" for h in hosts],
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="toolbox", description="Example MCP server of utility tools.")
    parser.add_argument("transport", nargs="?", default="stdio", choices=["stdio", "streamable-http", "sse"])
    parser.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8931, help="HTTP port (default 8931)")
    args = parser.parse_args(argv)
    server = build_server()
    if args.transport == "stdio":
        server.run("stdio")
        return
    security = local_security(args.host, args.port)
    server.run(args.transport, host=args.host, port=args.port, transport_security=security)


if __name__ == "__main__":
    main()
