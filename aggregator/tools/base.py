"""What every tool family shares: the tool record and result builders.

A family module exposes a function returning `list[OwnTool]`; the server
registers them under package `aggregator`. Handlers take the validated-by-nobody
`arguments` dict (the low-level server does not check schemas) and a
`ToolContext`, and return a `CallToolResult` or a raw result dict (passed
through untouched, as `catalog_call_tool` does with upstream results).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import mcp.types as types
from pydantic import ValidationError

from aggregator.catalog.caps import dumps
from aggregator.catalog.model import Catalog
from aggregator.faults import Fault
from aggregator.log import redact_text

ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]


async def _no_progress(progress: float, total: float | None, message: str | None) -> None:
    return None


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Per-call context: progress to the calling client, if it asked for it.

    `extra` holds request params a forwarded call passes on as they came (the
    client's `_meta` keys); `origin` is the client's request, so an upstream's
    own requests during the call (sampling, elicitation) reach that client.
    """

    report_progress: ProgressFn = _no_progress
    extra: Mapping[str, Any] | None = None
    origin: Any = None


ToolResult = types.CallToolResult | dict[str, Any]
ToolHandler = Callable[[Mapping[str, Any], ToolContext], Awaitable[ToolResult]]


@dataclass(frozen=True, slots=True)
class OwnTool:
    name: str
    description: str
    input_schema: dict[str, Any]
    handler: ToolHandler
    title: str | None = None
    annotations: dict[str, Any] | None = field(default=None)

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"name": self.name, "description": self.description, "inputSchema": self.input_schema}
        if self.title:
            wire["title"] = self.title
        if self.annotations:
            wire["annotations"] = self.annotations
        return wire


def json_result(payload: dict[str, Any], *, is_error: bool = False) -> types.CallToolResult:
    """structuredContent plus the same JSON as one text block."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=dumps(payload))],
        structured_content=payload,
        is_error=is_error,
    )


def text_result(text: str, *, is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=is_error)


def internal_error_result(tool: str, exc: Exception) -> types.CallToolResult:
    """A tool's unexpected exception as its result (redacted): the call fails, the session goes on."""
    message = redact_text(f"internal error in aggregator tool {tool}: {type(exc).__name__}: {exc}")
    return text_result(message, is_error=True)


def fault_result(fault: Fault) -> types.CallToolResult:
    """A fault of ours: one-line message as text, the taxonomy in structuredContent."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"{fault.reason}: {fault.message}")],
        structured_content=fault.to_dict(),
        is_error=True,
    )


def invalid_result(exc: ValidationError) -> types.CallToolResult:
    """The fault result that replaces an upstream's tools/call result the client's protocol forbids."""
    first = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "result"
    return fault_result(Fault("upstream_error", f"the upstream's result is invalid: {where}: {first['msg']}"))


READ_ONLY = {"readOnlyHint": True, "openWorldHint": False}


def snapshot_fields(catalog: Catalog | None) -> dict[str, Any]:
    """`{catalog_loaded: false, snapshot_age_s}` for an answer read from a snapshot, else nothing."""
    if catalog is None or not catalog.is_snapshot:
        return {}
    return {"catalog_loaded": False, "snapshot_age_s": round(catalog.age())}
