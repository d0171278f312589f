"""`aggregator tools [SERVER]`, `describe SERVER TOOL`, `call SERVER TOOL`: the catalog tools from a shell.

Each runs the same handler as the MCP tool of the same job (`CatalogTools`: catalog_list_servers,
catalog_list_tools, catalog_describe_tool, catalog_call_tool), so a shell user sees what a model
sees. Exit codes: 0 done, 1 the upstream or the tool failed (``isError``), 2 a usage error (an unknown
server or tool, bad arguments). A fault is one line on stderr naming the command that helps next.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mcp.types as types

from aggregator.catalog.search import ToolSearchIndex
from aggregator.cli.exit_codes import EXIT_FAILED, EXIT_USAGE
from aggregator.cli.progress import upstream_progress
from aggregator.config import AggregatorConfig
from aggregator.faults import PROGRAMMER_REASONS, Fault
from aggregator.settings import Settings, data_dir_of
from aggregator.suggest import did_you_mean
from aggregator.table import render_table
from aggregator.tools.base import ToolContext, ToolResult, fault_result
from aggregator.tools.catalog import LIST_LIMIT_MAX, CatalogTools
from aggregator.upstream.oauth_providers import cli_authenticator
from aggregator.upstream.pool import UpstreamPool

__all__ = ["parse_call_arguments", "register"]


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add the three subcommands to the CLI's subparsers."""
    tools = sub.add_parser(
        "tools",
        parents=[common],
        help="list upstreams, or one upstream's tools (starts it)",
        description="Without SERVER: every upstream (starts nothing). With it: that upstream's tools.",
    )
    tools.add_argument("server", nargs="?", help="an upstream name; without it, every upstream is listed")
    tools.add_argument("--json", action="store_true", help="print the tool's JSON result")
    tools.set_defaults(handler=_tools)

    describe = sub.add_parser(
        "describe",
        parents=[common],
        help="show one upstream tool's full definition",
        description="Show one tool's description, input and output schemas, annotations and a call line.",
    )
    describe.add_argument("server", help="the upstream's name (see: aggregator tools)")
    describe.add_argument("tool", help="the tool's name (see: aggregator tools SERVER)")
    describe.add_argument("--json", action="store_true", help="print the tool's JSON result")
    describe.set_defaults(handler=_describe)

    call = sub.add_parser(
        "call",
        parents=[common],
        help="call one upstream tool",
        description="Arguments come from --args (a JSON object) and/or key=value words; a value is read "
        "as JSON unless the tool's schema says the argument is a string (then it is kept as written).",
    )
    call.add_argument("server", help="the upstream's name (see: aggregator tools)")
    call.add_argument("tool", help="the tool's name (see: aggregator tools SERVER)")
    call.add_argument("pairs", nargs="*", metavar="key=value", help="one argument each")
    call.add_argument("--args", dest="arguments_json", metavar="JSON", help="the arguments as a JSON object")
    call.add_argument("--json", action="store_true", help="print the whole result as JSON")
    for command in (tools, describe, call):  # as serve --data-dir: its snapshots and sign-in tokens
        command.add_argument("--data-dir", type=Path, help="the data dir to use (snapshots, tokens)")
    call.set_defaults(handler=_call)


def _family(pool: UpstreamPool, config: AggregatorConfig) -> CatalogTools:
    index = ToolSearchIndex()
    for name in pool.upstream_names():
        index.set_server_metadata(name, *pool.metadata(name))
    index.attach(pool.store)
    return CatalogTools(pool, index, config.max_result_bytes)


# ---------------------------------------------------------------- tools


async def _tools(args: argparse.Namespace, config: AggregatorConfig, settings: Settings) -> int:
    data_dir = data_dir_of(args, settings)
    async with UpstreamPool.running(config, data_dir, authenticator=cli_authenticator(data_dir, settings)) as pool:
        family = _family(pool, config)
        if args.server is None:
            result = _model(await family.list_servers({}, ToolContext()))
            return _print_payload(result, args.json, _servers_table)
        return await _all_tools(family, args.server, args.json, _Hints(pool, args.server))


async def _all_tools(family: CatalogTools, server: str, as_json: bool, hints: _Hints) -> int:
    """Every page of catalog_list_tools, printed as one list."""
    items: list[Any] = []
    offset: int | None = 0
    while offset is not None:
        page = {"server": server, "limit": LIST_LIMIT_MAX, "offset": offset}
        result = await _ask(family.list_tools, page)
        payload = _structured(result)
        if result.is_error:
            return _print_payload(result, as_json, _tools_table, hints)
        items += payload["items"]
        offset = payload["next_offset"]
    merged = types.CallToolResult(content=[], structured_content={"items": items, "total": len(items)})
    return _print_payload(merged, as_json, _tools_table)


def _servers_table(payload: Mapping[str, Any]) -> str:
    rows = [
        [s["name"], s["transport"], s["state"], _dash(s["tool_count"]), s["description"]] for s in payload["servers"]
    ]
    return render_table(["name", "transport", "state", "tools", "description"], rows, right=(3,))


def _tools_table(payload: Mapping[str, Any]) -> str:
    rows = [
        [t["tool"], ", ".join(t["arg_keys"]), {True: "yes", False: "no", None: "-"}[t["read_only"]], t["summary"]]
        for t in payload["items"]
    ]
    return render_table(["tool", "arguments", "read-only", "summary"], rows)


# ---------------------------------------------------------------- describe


async def _describe(args: argparse.Namespace, config: AggregatorConfig, settings: Settings) -> int:
    data_dir = data_dir_of(args, settings)
    async with UpstreamPool.running(config, data_dir, authenticator=cli_authenticator(data_dir, settings)) as pool:
        family = _family(pool, config)
        result = await _ask(family.describe_tool, {"server": args.server, "tool": args.tool})
        return _print_payload(result, args.json, _description_text, _Hints(pool, args.server, args.tool))


def _description_text(payload: Mapping[str, Any]) -> str:
    lines = [f"{payload['server']} / {payload['tool']}" + (f" — {payload['title']}" if payload["title"] else "")]
    if payload["description"]:
        lines += ["", payload["description"]]
    lines += ["", "input schema:", json.dumps(payload["input_schema"], indent=2, ensure_ascii=False)]
    if payload["output_schema"] is not None:
        lines += ["", "output schema:", json.dumps(payload["output_schema"], indent=2, ensure_ascii=False)]
    if payload["annotations"]:
        lines += ["", "annotations: " + json.dumps(payload["annotations"], ensure_ascii=False)]
    example = " ".join(f"{key}=<{key}>" for key in payload["required"])
    lines += ["", f"call: aggregator call {payload['server']} {payload['tool']} {example}".rstrip()]
    return "\n".join(lines)


# ---------------------------------------------------------------- call


async def _call(args: argparse.Namespace, config: AggregatorConfig, settings: Settings) -> int:
    data_dir = data_dir_of(args, settings)
    async with UpstreamPool.running(config, data_dir, authenticator=cli_authenticator(data_dir, settings)) as pool:
        family = _family(pool, config)
        hints = _Hints(pool, args.server, args.tool)
        # the schema says which values stay strings and which are required; describing proves the tool exists
        described = await _ask(family.describe_tool, {"server": args.server, "tool": args.tool})
        if described.is_error:
            return _print_payload(described, args.json, _description_text, hints)
        schema: Mapping[str, Any] = _structured(described)["input_schema"]
        try:
            arguments = parse_call_arguments(args.arguments_json, args.pairs, schema)
            unknown = _unknown_parameters(args.tool, args.pairs, schema)
            _check_required(args.server, args.tool, arguments, _structured(described)["required"], unknown)
        except ValueError as exc:
            print(f"aggregator call: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        if unknown:  # a typo the tool may ignore in silence ("timezon=Europe/Paris" answers for UTC)
            print(f"aggregator call: note: {unknown}; sent as given", file=sys.stderr)
        request = {"server": args.server, "tool": args.tool, "arguments": arguments}
        with upstream_progress(f"{args.server} {args.tool}") as report:  # a bar on a terminal only
            ctx = ToolContext(report_progress=report) if report is not None else ToolContext()
            raw = _wire(await family.call_tool(request, ctx))
        is_error = bool(raw.get("isError"))
        fault = _fault_of(raw)
        if args.json:
            print(json.dumps(raw, indent=2, ensure_ascii=False))
        elif fault is not None:
            print(hints.line(fault), file=sys.stderr)
        else:
            text = _content_text(raw)
            if text:
                print(text, file=sys.stderr if is_error else sys.stdout)
    return _exit_code(fault) if is_error else 0


def parse_call_arguments(arguments_json: str | None, pairs: list[str], schema: Mapping[str, Any]) -> dict[str, Any]:
    """``--args`` (a JSON object) updated by ``key=value`` words; raises ValueError with the fix."""
    arguments: dict[str, Any] = {}
    if arguments_json is not None:
        try:
            parsed = strict_json(arguments_json, "--args")
        except json.JSONDecodeError as exc:
            raise ValueError(f"--args is not JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(parsed, dict):
            raise ValueError('--args must be a JSON object, e.g. --args \'{"path": "/tmp"}\'')
        arguments.update(parsed)
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{pair!r} is not key=value")
        arguments[key] = _argument_value(value, properties.get(key) if isinstance(properties, dict) else None, key)
    return arguments


def _unknown_parameters(tool: str, pairs: list[str], schema: Mapping[str, Any]) -> str:
    """Which `key=value` keys the tool's schema does not name ('' if all are known, or it names none);
    raises ValueError when the schema forbids other keys (`additionalProperties: false`)."""
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        return ""
    unknown = sorted({key for key, _, _ in (pair.partition("=") for pair in pairs) if key not in properties})
    if not unknown:
        return ""
    guesses = did_you_mean(unknown[0], properties)
    named = ("parameter " if len(unknown) == 1 else "parameters ") + ", ".join(repr(key) for key in unknown)
    text = f"{tool} has no {named}{guesses}; its parameters: {', '.join(sorted(properties))}"
    if schema.get("additionalProperties") is False:
        raise ValueError(text)
    return text


def _check_required(
    server: str, tool: str, arguments: Mapping[str, Any], required: list[str], unknown: str = ""
) -> None:
    """ValueError naming the required arguments not given (the tool would refuse the call anyway, often with
    a screenful of its validator's text), with the command line that gives them all; `unknown` says which
    given keys the tool does not name (a typo is the usual reason a required one is missing)."""
    missing = [key for key in required if key not in arguments]
    if missing:
        example = " ".join(f"{key}=<{key}>" for key in required)
        typo = f"; {unknown}" if unknown else ""
        raise ValueError(
            f"{tool} needs {', '.join(missing)} (not given{typo}); e.g. aggregator call {server} {tool} {example}"
        )


def strict_json(text: str, what: str) -> Any:
    """`json.loads`, refusing what JSON has no value for: NaN, Infinity, 1e999, nesting past the stack.

    Python's parser would accept the first three (and send them on as null); the last raises
    RecursionError. Each becomes a one-line ValueError naming `what`.
    """

    def constant(name: str) -> Any:
        raise ValueError(f"{what}: {name} is not a JSON number; quote it to pass a string")

    def number(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            raise ValueError(f"{what}: {literal} is too large for a JSON number")
        return value

    try:
        return json.loads(text, parse_constant=constant, parse_float=number)
    except RecursionError:
        raise ValueError(f"{what} is nested too deep") from None


def _argument_value(text: str, property_schema: Any, key: str) -> Any:
    """A key=value value: kept as written for a string argument, else JSON when it parses."""
    declared = property_schema.get("type") if isinstance(property_schema, dict) else None
    if declared == "string":
        return text
    try:
        return strict_json(text, key)
    except json.JSONDecodeError:
        return text


def _content_text(raw: Mapping[str, Any]) -> str:
    """A result's content as a person reads it: text as is, other blocks as one line each."""
    parts: list[str] = []
    for block in raw.get("content") or []:
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind in ("image", "audio"):
            size = len(str(block.get("data", ""))) * 3 // 4
            parts.append(f"[{kind}: {block.get('mimeType', '?')}, about {size} bytes]")
        elif kind == "resource":
            resource = block.get("resource") or {}
            parts.append(str(resource.get("text") or f"[resource: {resource.get('uri', '?')}]"))
        elif kind == "resource_link":
            parts.append(f"[resource link: {block.get('uri', '?')}]")
        else:
            parts.append(json.dumps(block, ensure_ascii=False))
    if not parts and raw.get("structuredContent") is not None:
        parts.append(json.dumps(raw["structuredContent"], indent=2, ensure_ascii=False))
    return "\n".join(parts)


# ---------------------------------------------------------------- output


def _model(result: ToolResult) -> types.CallToolResult:
    return result if isinstance(result, types.CallToolResult) else types.CallToolResult.model_validate(result)


def _wire(result: ToolResult) -> dict[str, Any]:
    """A result as the client receives it (camelCase); an upstream's raw dict is that already."""
    if isinstance(result, types.CallToolResult):
        return result.model_dump(mode="json", by_alias=True, exclude_none=True)
    return result


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _structured(result: types.CallToolResult) -> dict[str, Any]:
    return dict(result.structured_content or {})


def _print_payload(result: types.CallToolResult, as_json: bool, render: Any, hints: _Hints | None = None) -> int:
    """A catalog tool's result: its JSON, a rendering of it, or (on error) its one-line message."""
    payload = _structured(result)
    fault = _fault_of(payload)
    if as_json:
        print(json.dumps(payload, indent=2, ensure_ascii=False))
    elif fault is not None:
        print(hints.line(fault) if hints else f"aggregator: {fault['reason']}: {fault['message']}", file=sys.stderr)
    else:
        print(render(payload))
    return _exit_code(fault) if result.is_error else 0


async def _ask(handler: Any, arguments: Mapping[str, Any]) -> types.CallToolResult:
    """A catalog handler's result, its Fault (unknown server or tool, upstream down) as a fault result."""
    try:
        return _model(await handler(arguments, ToolContext()))
    except Fault as fault:
        return fault_result(fault)


def _fault_of(payload: Mapping[str, Any]) -> dict[str, str] | None:
    """The aggregator's own fault in a result (`structuredContent.error` with a reason), if it is one."""
    structured = payload.get("structuredContent", payload)
    error = structured.get("error") if isinstance(structured, Mapping) else None
    if isinstance(error, Mapping) and isinstance(error.get("reason"), str):
        return {"reason": str(error["reason"]), "message": str(error.get("message", ""))}
    return None


def _exit_code(fault: Mapping[str, str] | None) -> int:
    """2 for a mistake in the command (unknown server or tool, bad arguments), else 1."""
    return EXIT_USAGE if fault is not None and fault["reason"] in PROGRAMMER_REASONS else EXIT_FAILED


class _Hints:
    """A fault as one line for a person at a shell: the CLI command that helps, and "did you mean"."""

    def __init__(self, pool: UpstreamPool, server: str, tool: str | None = None) -> None:
        self.pool = pool
        self.server = server
        self.tool = tool

    def line(self, fault: Mapping[str, str]) -> str:
        reason, message = fault["reason"], fault["message"]
        names = self.pool.upstream_names()
        if reason == "unknown_server":
            known = ", ".join(names) or "none configured"
            return (
                f"aggregator: no upstream named {self.server!r}{did_you_mean(self.server, names)}; "
                f"known: {known}; `aggregator add` adds one"
            )
        name = self.pool.resolve(self.server) or self.server
        if reason == "unknown_tool" and self.tool is not None:
            catalog = self.pool.store.get(name)
            tools = [t.name for t in catalog.exposed_tools] if catalog is not None else []
            return (
                f"aggregator: {name} has no tool {self.tool!r}{did_you_mean(self.tool, tools, parts=True)}; "
                f"`aggregator tools {name}` lists its tools"
            )
        if reason == "upstream_unavailable":
            return f"aggregator: {message}; `aggregator doctor` checks its entry"
        return f"aggregator: {reason}: {message}"
