"""A deliberately scriptable MCP test server, written with the standard library only.

It speaks MCP JSON-RPC over stdio (one JSON message per line) and starts in a few tens of
milliseconds because it never imports the mcp SDK. Tests and benchmarks use it to provoke the
situations a proxy must survive: paginated listings, progress, cancellation, late results, crashes,
stderr chatter, huge results, malformed tool definitions, ``tools/list_changed`` and stray
grandchild processes.

Run it as ``python -m aggregator.examples.testkit [flags]`` or ``python examples/testkit.py [flags]``.

Flags:
  --page-size N        tools/list page size (default: everything in one page)
  --tools N            add N trivial echo tools noop_001 ... noop_N
  --malformed          also list three broken tool definitions
  --hang-initialize    never answer ``initialize``
  --exit-at-start      write an error to stderr and exit 1 at once
  --spawn-grandchild   start ``sleep 300`` in this process group, its pid in --pid-file
  --pid-file PATH      where --spawn-grandchild writes the grandchild's pid
  --grandchild-keeps-stdout  the grandchild inherits stdout, so the pipe outlives this process
  --tag NAME           serverInfo.name becomes ``testkit-NAME``
  --spawn-log PATH     append one line per start (pid, tag, time)
  --ignore-cancel      keep running cancelled calls and send their results anyway
  --event-log PATH     append a line per notable event (cancellations, listings) to this file
  --catalog PATH       list the tools of this JSON file (a list, or an object with "tools") instead of
                       the core tools; calling one answers with its name and arguments
  --startup-delay S    sleep S seconds before serving, as a launcher (npx, uvx) would
  --list-changed-storm send ``tools/list_changed`` after every ``tools/list`` answer
  --extra-tools PATH   also list the tool definitions in this JSON file (a list), however broken
  --extra-prompts PATH also list the prompts in this JSON file (a list); getting one answers its description
  --deep-tool N        also list a tool ``deep`` whose inputSchema is nested N levels
  --print-env NAME     write the value of environment variable NAME to stderr at start
  --grandchild-setsid  the grandchild calls setsid(): it leaves our process group
  --ignore-term        ignore SIGTERM, and keep running after stdin EOF
  --http PORT          serve MCP over streamable HTTP (JSON responses) on 127.0.0.1:PORT, not stdio

Tools: echo, add, image, structured, fail, slow, crash, stderr, big, set_tools, pid, reply (see
``CORE_TOOLS``), plus noop_NNN, the names given to ``set_tools`` and, with ``--malformed``, the broken
definitions. Stdout carries protocol messages only; diagnostics go to stderr. The process exits on
stdin EOF; running calls live in daemon threads and never keep it alive.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_VERSION = "2025-11-25"
SERVER_VERSION = "1.0.0"

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
RESOURCE_NOT_FOUND = -32002

BIG_LIMIT = 64 * 1024 * 1024

# A 1x1 RGB PNG (one orange pixel), checked to decode.
TINY_PNG_BASE64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP438AAAAQBAYDFKhhdAAAAAElFTkSuQmCC"

_READ_ONLY = {"readOnlyHint": True}
_MESSAGE_SCHEMA = {
    "type": "object",
    "properties": {"message": {"type": "string", "description": "Text to echo back."}},
}

CORE_TOOLS: list[dict[str, Any]] = [
    {
        "name": "echo",
        "description": "Echo a message back as text.",
        "inputSchema": {**_MESSAGE_SCHEMA, "required": ["message"]},
        "annotations": _READ_ONLY,
    },
    {
        "name": "add",
        "description": "Add two numbers; the sum comes as text and as structuredContent.",
        "inputSchema": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
        "outputSchema": {
            "type": "object",
            "properties": {"sum": {"type": "number"}},
            "required": ["sum"],
        },
        "annotations": _READ_ONLY,
    },
    {
        "name": "image",
        "description": "Return a tiny PNG image content block plus a text block.",
        "inputSchema": {"type": "object", "properties": {}},
        "annotations": _READ_ONLY,
    },
    {
        "name": "structured",
        "description": "Return structuredContent that matches the tool's outputSchema.",
        "inputSchema": {"type": "object", "properties": {}},
        "outputSchema": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "count": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "nested": {
                    "type": "object",
                    "properties": {"ok": {"type": "boolean"}},
                    "required": ["ok"],
                },
            },
            "required": ["name", "count", "tags", "nested"],
        },
        "annotations": _READ_ONLY,
    },
    {
        "name": "fail",
        "description": "Return a tool error (isError: true) carrying the given message.",
        "inputSchema": {
            "type": "object",
            "properties": {"message": {"type": "string"}},
            "required": ["message"],
        },
    },
    {
        "name": "slow",
        "description": "Sleep for `seconds`, sending `steps` progress notifications evenly, then answer.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "seconds": {"type": "number", "minimum": 0},
                "steps": {"type": "integer", "minimum": 0, "default": 1},
            },
            "required": ["seconds"],
        },
        "annotations": _READ_ONLY,
    },
    {
        "name": "crash",
        "description": "Write a line to stderr and exit with code 3 without answering.",
        "inputSchema": {"type": "object", "properties": {}},
        "annotations": {"destructiveHint": True},
    },
    {
        "name": "stderr",
        "description": "Write text to the server's stderr.",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
    {
        "name": "big",
        "description": "Return a text block of exactly n bytes (ASCII).",
        "inputSchema": {
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 0, "maximum": BIG_LIMIT}},
            "required": ["n"],
        },
        "annotations": _READ_ONLY,
    },
    {
        "name": "set_tools",
        "description": "Replace the extra tool set with echo tools of these names; sends tools/list_changed.",
        "inputSchema": {
            "type": "object",
            "properties": {"names": {"type": "array", "items": {"type": "string"}}},
            "required": ["names"],
        },
    },
    {
        "name": "pid",
        "description": "Return this server's process id.",
        "inputSchema": {"type": "object", "properties": {}},
        "annotations": _READ_ONLY,
    },
    {
        "name": "ask",
        "description": "Send a request to the client (sampling/createMessage, roots/list, ...) and return its answer; "
        "with cancel_after, cancel it after that many seconds instead.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "method": {"type": "string"},
                "params": {"type": "object"},
                "cancel_after": {"type": "number", "minimum": 0},
            },
            "required": ["method"],
        },
    },
    {
        "name": "meta",
        "description": "Return the _meta of this tools/call request as it arrived (structuredContent.meta).",
        "inputSchema": {"type": "object", "properties": {}},
        "annotations": _READ_ONLY,
    },
    {
        "name": "reply",
        "description": (
            "Answer with whatever is asked, valid or not: `result` as the JSON-RPC result, `error` as the"
            " JSON-RPC error, a result nested `nest` levels deep, or `line` written raw (ID replaced by the id)."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "result": {},
                "error": {},
                "nest": {"type": "integer", "minimum": 0},
                "line": {"type": "string"},
            },
        },
    },
]
CORE_NAMES = frozenset(tool["name"] for tool in CORE_TOOLS)

MALFORMED_TOOLS: list[dict[str, Any]] = [
    {
        "name": "bad_schema_no_type",
        "description": 'Broken on purpose: its inputSchema lacks "type".',
        "inputSchema": {"properties": {"message": {"type": "string"}}},
    },
    {
        "name": "bad_schema_string",
        "description": "Broken on purpose: its inputSchema is a string.",
        "inputSchema": "not a schema",
    },
    {
        "description": "Broken on purpose: this tool has no name.",
        "inputSchema": {"type": "object", "properties": {}},
    },
]

PROMPTS: list[dict[str, Any]] = [
    {
        "name": "greet",
        "description": "Greet someone by name.",
        "arguments": [{"name": "name", "description": "Who to greet.", "required": True}],
    },
    {
        "name": "review_code",
        "description": "Ask for a review of a piece of code.",
        "arguments": [
            {"name": "code", "description": "The code to review.", "required": True},
            {"name": "language", "description": "Its programming language.", "required": False},
        ],
    },
]

RESOURCES: list[dict[str, Any]] = [
    {
        "uri": "testkit://readme",
        "name": "readme",
        "description": "What the testkit server is for.",
        "mimeType": "text/markdown",
    },
    {
        "uri": "testkit://status",
        "name": "status",
        "description": "The server's process id and extra tool names, as JSON.",
        "mimeType": "application/json",
    },
]

RESOURCE_TEMPLATES: list[dict[str, Any]] = [
    {
        "uriTemplate": "testkit://items/{item_id}",
        "name": "item",
        "description": "One item by id.",
        "mimeType": "text/plain",
    },
    {
        "uriTemplate": "testkit://logs/{date}/{level}",
        "name": "log",
        "description": "The log lines of one day at one level.",
        "mimeType": "text/plain",
    },
]


class ToolFailure(Exception):
    """A tool-level failure: answered as a result with ``isError: true``."""


class RpcError(Exception):
    """A protocol-level failure: answered as a JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Wire:
    """Newline-delimited JSON-RPC on a binary stream; one writer at a time."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        try:
            line = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()
        except UnicodeEncodeError:  # a lone surrogate: sent as the \\udXXX escape JSON allows
            line = json.dumps(message, separators=(",", ":")).encode()
        self.send_raw(line + b"\n")

    def send_raw(self, data: bytes, request_id: Any = None) -> None:
        """Write bytes as they are (`request_id`: the request they answer, if its id may be garbled)."""
        with self._lock:
            try:
                self._stream.write(data)
                self._stream.flush()
            except (BrokenPipeError, ValueError):
                os._exit(0)  # the client went away: nothing left to serve

    def result(self, request_id: Any, result: dict[str, Any]) -> None:
        self.send({"jsonrpc": "2.0", "id": request_id, "result": result})

    def error(self, request_id: Any, code: int, message: str) -> None:
        self.send({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})

    def abandon(self, request_id: Any) -> None:
        """A cancelled request gets no answer on stdio (see HttpWire for HTTP)."""

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})


class Call:
    """One in-flight ``tools/call``: its id, progress token and cancellation flag."""

    __slots__ = ("cancelled", "meta", "progress_token", "request_id")

    def __init__(self, request_id: Any, progress_token: Any, meta: Any = None) -> None:
        self.request_id = request_id
        self.progress_token = progress_token
        self.meta = meta
        self.cancelled = threading.Event()


def nested(depth: int) -> dict[str, Any]:
    """An object schema nested `depth` levels (built without recursion, so any depth works)."""
    value: dict[str, Any] = {"type": "object"}
    for _ in range(depth):
        value = {"type": "object", "properties": {"a": value}}
    return value


def log(text: str) -> None:
    """Diagnostics go to stderr, never to stdout."""
    sys.stderr.write(f"testkit[{os.getpid()}]: {text}\n")
    sys.stderr.flush()


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def text_block_message(prompt: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": text_block(str(prompt.get("description")))}


def text_result(text: str) -> dict[str, Any]:
    return {"content": [text_block(text)], "isError": False}


_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "strings": lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v),
}


def _arg(args: dict[str, Any], name: str, kind: str, default: Any = ...) -> Any:
    """Fetch and type-check one tool argument; a wrong or missing one is a tool failure."""
    if name not in args:
        if default is ...:
            raise ToolFailure(f"missing required argument: {name}")
        return default
    value = args[name]
    if not _TYPE_CHECKS[kind](value):
        raise ToolFailure(f"argument {name} must be of type {kind}")
    return value


def echo_tool(name: str) -> dict[str, Any]:
    """The definition of a trivial tool that echoes its message (noop_NNN and set_tools names)."""
    return {
        "name": name,
        "description": f"Trivial tool {name}: echoes its message (or its own name).",
        "inputSchema": _MESSAGE_SCHEMA,
        "annotations": _READ_ONLY,
    }


class Testkit:
    """The server's state and its JSON-RPC method handlers."""

    def __init__(self, opts: argparse.Namespace, wire: Wire) -> None:
        self.opts = opts
        self.wire = wire
        width = max(3, len(str(opts.tools)))
        self.noop_names = [f"noop_{i:0{width}d}" for i in range(1, opts.tools + 1)]
        self.extra_names: list[str] = []
        self.catalog = load_catalog(opts.catalog) if opts.catalog else None
        self.calls: dict[Any, Call] = {}
        self.asked: dict[str, tuple[threading.Event, list[dict[str, Any]]]] = {}  # our requests to the client
        self.asked_count = 0
        self.calls_lock = threading.Lock()
        self.state_lock = threading.Lock()
        self.requests: dict[str, Callable[[dict[str, Any]], dict[str, Any] | None]] = {
            "initialize": self.initialize,
            "ping": lambda _params: {},
            "tools/list": self.list_tools,
            "prompts/list": lambda params: self.paginate(self.all_prompts(), params, "prompts"),
            "prompts/get": self.get_prompt,
            "resources/list": lambda params: self.paginate(RESOURCES, params, "resources"),
            "resources/templates/list": lambda params: self.paginate(RESOURCE_TEMPLATES, params, "resourceTemplates"),
            "resources/read": self.read_resource,
        }
        self.tools: dict[str, Callable[[dict[str, Any], Call], dict[str, Any] | None]] = {
            "echo": lambda args, _call: text_result(_arg(args, "message", "string")),
            "add": self.tool_add,
            "image": self.tool_image,
            "structured": self.tool_structured,
            "fail": lambda args, _call: {
                "content": [text_block(_arg(args, "message", "string"))],
                "isError": True,
            },
            "slow": self.tool_slow,
            "crash": self.tool_crash,
            "stderr": self.tool_stderr,
            "big": self.tool_big,
            "set_tools": self.tool_set_tools,
            "pid": lambda _args, _call: text_result(str(os.getpid())),
            "ask": self.tool_ask,
            "meta": lambda _args, call: {
                "content": [text_block(json.dumps(call.meta))],
                "structuredContent": {"meta": call.meta},
            },
            "reply": self.tool_reply,
        }

    # ---- dispatch -------------------------------------------------------------------------

    def handle_line(self, raw: bytes) -> None:
        """Parse one line from stdin and route it (request, notification, or ignored response)."""
        if not raw.strip():
            return
        try:
            message = json.loads(raw)
        except ValueError:
            self.wire.error(None, PARSE_ERROR, "Parse error")
            return
        if not isinstance(message, dict) or not isinstance(message.get("method", ""), str):
            self.wire.error(None, INVALID_REQUEST, "Invalid Request")
            return
        method = message.get("method")
        params = message.get("params")
        if params is None:
            params = {}
        if method is None:
            waiter = self.asked.get(str(message.get("id")))
            if waiter is not None:  # the answer to an `ask`
                waiter[1].append(message)
                waiter[0].set()
            return  # otherwise a response to a request we never sent: ignore it
        if "id" not in message:
            self.handle_notification(method, params)
            return
        request_id = message["id"]
        if not isinstance(params, dict):
            self.wire.error(request_id, INVALID_PARAMS, "params must be an object")
            return
        if method == "tools/call":
            self.start_call(request_id, params)
            return
        handler = self.requests.get(method)
        if handler is None:
            self.wire.error(request_id, METHOD_NOT_FOUND, f"Method not found: {method}")
            return
        try:
            result = handler(params)
        except RpcError as exc:
            self.wire.error(request_id, exc.code, exc.message)
            return
        if result is not None:
            self.wire.result(request_id, result)
        if method == "tools/list":
            record_event(self.opts, "tools/list")
            if self.opts.list_changed_storm:
                self.wire.notify("notifications/tools/list_changed", {})

    def handle_notification(self, method: str, params: Any) -> None:
        if method == "notifications/cancelled" and isinstance(params, dict):
            with self.calls_lock:
                call = self.calls.get(params.get("requestId"))
            if call is not None:
                call.cancelled.set()
            record_event(self.opts, f"cancelled {params.get('requestId')}")
        # notifications/initialized and anything else need no action

    # ---- lifecycle and listings -----------------------------------------------------------

    def initialize(self, params: dict[str, Any]) -> dict[str, Any] | None:
        if self.opts.hang_initialize:
            log("--hang-initialize: not answering initialize")
            return None
        asked = params.get("protocolVersion")
        version = asked if asked in HANDSHAKE_VERSIONS else LATEST_VERSION
        name = f"testkit-{self.opts.tag}" if self.opts.tag else "testkit"
        return {
            "protocolVersion": version,
            "capabilities": {
                "tools": {"listChanged": True},
                "prompts": {"listChanged": False},
                "resources": {"listChanged": False, "subscribe": False},
            },
            "serverInfo": {"name": name, "version": SERVER_VERSION},
            "instructions": "Scriptable MCP test server; see the tool descriptions.",
        }

    def all_prompts(self) -> list[dict[str, Any]]:
        """The prompts; with --malformed also one whose arguments are not a list."""
        extra: list[dict[str, Any]] = []
        if self.opts.extra_prompts:
            with open(self.opts.extra_prompts) as fh:
                extra = json.load(fh)
        return PROMPTS + extra + ([{"name": "bad_prompt", "arguments": 5}] if self.opts.malformed else [])

    def all_tools(self) -> list[dict[str, Any]]:
        with self.state_lock:
            extras = list(self.extra_names)
        tools = list(CORE_TOOLS) if self.catalog is None else list(self.catalog)
        if self.opts.malformed:
            tools += MALFORMED_TOOLS
        tools += [echo_tool(name) for name in self.noop_names]
        tools += [echo_tool(name) for name in extras]
        if self.opts.extra_tools:
            with open(self.opts.extra_tools) as fh:
                tools += json.load(fh)
        if self.opts.deep_tool:
            tools.append(
                {
                    "name": "deep",
                    "description": "A schema nested very deep.",
                    "inputSchema": nested(self.opts.deep_tool),
                }
            )
        return tools

    def list_tools(self, params: dict[str, Any]) -> dict[str, Any]:
        return self.paginate(self.all_tools(), params, "tools", self.opts.page_size)

    @staticmethod
    def paginate(
        items: list[dict[str, Any]], params: dict[str, Any], key: str, page_size: int | None = None
    ) -> dict[str, Any]:
        """One page of `items`; the cursor is the decimal offset of the page's first item."""
        cursor = params.get("cursor")
        start = 0
        if cursor is not None:
            if not isinstance(cursor, str) or not cursor.isdigit() or int(cursor) > len(items):
                raise RpcError(INVALID_PARAMS, f"Invalid cursor: {cursor!r}")
            start = int(cursor)
        end = len(items) if not page_size else min(len(items), start + page_size)
        page: dict[str, Any] = {key: items[start:end]}
        if end < len(items):
            page["nextCursor"] = str(end)
        return page

    def get_prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        name = params.get("name")
        args = params.get("arguments") or {}
        prompt = next((p for p in self.all_prompts() if p["name"] == name), None)
        if prompt is None:
            raise RpcError(INVALID_PARAMS, f"Unknown prompt: {name}")
        if prompt not in PROMPTS:
            return {"description": prompt.get("description"), "messages": [text_block_message(prompt)]}
        for argument in prompt["arguments"]:
            if argument["required"] and argument["name"] not in args:
                raise RpcError(INVALID_PARAMS, f"Missing required argument: {argument['name']}")
        if name == "greet":
            text = f"Say hello to {args['name']} in one friendly sentence."
        else:
            language = args.get("language", "unknown language")
            text = f"Review this {language} code for bugs and clarity:\n\n{args['code']}"
        return {
            "description": prompt["description"],
            "messages": [{"role": "user", "content": text_block(text)}],
        }

    def read_resource(self, params: dict[str, Any]) -> dict[str, Any]:
        uri = params.get("uri")
        if not isinstance(uri, str):
            raise RpcError(INVALID_PARAMS, "uri must be a string")
        mime = "text/plain"
        if uri == "testkit://readme":
            mime, text = "text/markdown", "# testkit\n\nA scriptable MCP server for tests.\n"
        elif uri == "testkit://status":
            with self.state_lock:
                extras = list(self.extra_names)
            mime, text = "application/json", json.dumps({"pid": os.getpid(), "extra_tools": extras})
        elif uri.startswith("testkit://items/") and len(uri) > len("testkit://items/"):
            text = f"item {uri.removeprefix('testkit://items/')}"
        elif uri.startswith("testkit://logs/") and uri.count("/") == 4:
            date, level = uri.removeprefix("testkit://logs/").split("/")
            text = f"{date} {level.upper()} nothing happened"
        else:
            raise RpcError(RESOURCE_NOT_FOUND, f"Resource not found: {uri}")
        return {"contents": [{"uri": uri, "mimeType": mime, "text": text}]}

    # ---- tool calls -----------------------------------------------------------------------

    def start_call(self, request_id: Any, params: dict[str, Any]) -> None:
        """Run one tools/call in a daemon thread so a slow call never blocks the others."""
        name = params.get("name")
        args = params.get("arguments") or {}
        handler = self.lookup_tool(name)
        if handler is None:
            self.wire.error(request_id, INVALID_PARAMS, f"Unknown tool: {name}")
            return
        if not isinstance(args, dict):
            self.wire.error(request_id, INVALID_PARAMS, "arguments must be an object")
            return
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        call = Call(request_id, token, meta)
        with self.calls_lock:
            self.calls[request_id] = call
        threading.Thread(target=self.run_call, args=(handler, args, call), daemon=True).start()

    def lookup_tool(self, name: Any) -> Callable[[dict[str, Any], Call], dict[str, Any] | None] | None:
        if self.catalog is not None and any(tool.get("name") == name for tool in self.catalog):
            return lambda args, _call: text_result(f"called {name} with {json.dumps(args, sort_keys=True)}")
        if name in self.tools:
            return self.tools[name]
        with self.state_lock:
            extra = name in self.extra_names
        trivial = {t.get("name") for t in MALFORMED_TOOLS} - {None}
        if extra or name in self.noop_names or (self.opts.malformed and name in trivial):
            return lambda args, _call: text_result(str(args.get("message", name)))
        return None

    def run_call(
        self,
        handler: Callable[[dict[str, Any], Call], dict[str, Any] | None],
        args: dict[str, Any],
        call: Call,
    ) -> None:
        try:
            result = handler(args, call)
        except ToolFailure as exc:
            result = {"content": [text_block(str(exc))], "isError": True}
        except Exception as exc:  # a bug here must still answer the call
            log(f"tool raised {exc!r}")
            result = {"content": [text_block(f"internal error: {exc}")], "isError": True}
        with self.calls_lock:
            self.calls.pop(call.request_id, None)
        if call.cancelled.is_set() and not self.opts.ignore_cancel:
            self.wire.abandon(call.request_id)  # cancelled: the client expects no answer
            return
        if result is None:
            return
        self.wire.result(call.request_id, result)

    def tool_ask(self, args: dict[str, Any], _call: Call) -> dict[str, Any]:
        method = _arg(args, "method", "string")
        params = args.get("params") or {}
        cancel_after = args.get("cancel_after")
        with self.state_lock:
            self.asked_count += 1
            request_id = f"ask-{self.asked_count}"
        done, answer = threading.Event(), []
        self.asked[request_id] = (done, answer)
        try:
            self.wire.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            if not done.wait(cancel_after if isinstance(cancel_after, int | float) else 120):
                self.wire.notify("notifications/cancelled", {"requestId": request_id, "reason": "testkit gave up"})
                record_event(self.opts, f"ask cancelled {request_id}")
                return text_result("cancelled")
        finally:
            self.asked.pop(request_id, None)
        response = answer[0]
        outcome = {"result": response["result"]} if "result" in response else {"error": response.get("error")}
        return {"content": [text_block(json.dumps(outcome))], "structuredContent": outcome}

    def tool_add(self, args: dict[str, Any], _call: Call) -> dict[str, Any]:
        total = _arg(args, "a", "number") + _arg(args, "b", "number")
        return {"content": [text_block(str(total))], "structuredContent": {"sum": total}, "isError": False}

    def tool_image(self, _args: dict[str, Any], _call: Call) -> dict[str, Any]:
        return {
            "content": [
                {"type": "image", "data": TINY_PNG_BASE64, "mimeType": "image/png"},
                text_block("a 1x1 orange PNG"),
            ],
            "isError": False,
        }

    def tool_structured(self, _args: dict[str, Any], _call: Call) -> dict[str, Any]:
        data = {"name": "testkit", "count": 3, "tags": ["a", "b", "c"], "nested": {"ok": True}}
        return {"content": [text_block(json.dumps(data))], "structuredContent": data, "isError": False}

    def tool_slow(self, args: dict[str, Any], call: Call) -> dict[str, Any] | None:
        seconds = float(_arg(args, "seconds", "number"))
        steps = _arg(args, "steps", "integer", 1)
        if seconds < 0 or steps < 0:
            raise ToolFailure("seconds and steps must not be negative")
        started = time.monotonic()
        for step in range(1, steps + 1):
            if self.pause(call, started + seconds * step / steps):
                return None
            if call.progress_token is not None:
                self.wire.notify(
                    "notifications/progress",
                    {
                        "progressToken": call.progress_token,
                        "progress": step,
                        "total": steps,
                        "message": f"step {step}/{steps}",
                    },
                )
        if steps == 0 and self.pause(call, started + seconds):
            return None
        return text_result(f"slept {seconds:g}s in {steps} steps")

    def pause(self, call: Call, deadline: float) -> bool:
        """Wait until `deadline`; True when the call was cancelled (and cancels are honoured)."""
        remaining = deadline - time.monotonic()
        if self.opts.ignore_cancel:
            if remaining > 0:
                time.sleep(remaining)
            return False
        return call.cancelled.wait(max(0.0, remaining))

    def tool_crash(self, _args: dict[str, Any], _call: Call) -> None:
        log("crash requested: exiting with code 3")
        os._exit(3)

    def tool_stderr(self, args: dict[str, Any], _call: Call) -> dict[str, Any]:
        text = _arg(args, "text", "string")
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()
        return text_result(f"wrote {len(text)} characters to stderr")

    def tool_big(self, args: dict[str, Any], _call: Call) -> dict[str, Any]:
        n = _arg(args, "n", "integer")
        if not 0 <= n <= BIG_LIMIT:
            raise ToolFailure(f"n must be between 0 and {BIG_LIMIT}")
        pattern = "0123456789abcdef"
        return text_result((pattern * (n // len(pattern) + 1))[:n])

    def tool_reply(self, args: dict[str, Any], call: Call) -> None:
        """Send exactly the response asked for, however malformed (see the tool's description)."""
        if "line" in args:
            line = str(args["line"]).replace("ID", json.dumps(call.request_id))
            self.wire.send_raw(line.encode() + b"\n", call.request_id)
        elif "error" in args:
            self.wire.send({"jsonrpc": "2.0", "id": call.request_id, "error": args["error"]})
        elif "nest" in args:
            self.wire.send({"jsonrpc": "2.0", "id": call.request_id, "result": nested(int(args["nest"]))})
        else:
            self.wire.send({"jsonrpc": "2.0", "id": call.request_id, "result": args.get("result")})

    def tool_set_tools(self, args: dict[str, Any], _call: Call) -> dict[str, Any]:
        names = _arg(args, "names", "strings")
        clashes = sorted(set(names) & (CORE_NAMES | set(self.noop_names)))
        if clashes:
            raise ToolFailure(f"names already in use: {', '.join(clashes)}")
        with self.state_lock:
            self.extra_names = list(dict.fromkeys(names))
        self.wire.notify("notifications/tools/list_changed", {})
        return text_result(f"extra tools: {', '.join(names) or '(none)'}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="testkit", description="Scriptable MCP test server (stdio).")
    parser.add_argument("--page-size", type=int, default=0, help="tools/list page size (0: one page)")
    parser.add_argument("--tools", type=int, default=0, help="add N trivial tools noop_001..")
    parser.add_argument("--malformed", action="store_true", help="also list broken tool definitions")
    parser.add_argument("--hang-initialize", action="store_true", help="never answer initialize")
    parser.add_argument("--exit-at-start", action="store_true", help="exit 1 at once")
    parser.add_argument("--spawn-grandchild", action="store_true", help="start `sleep 300` in our group")
    parser.add_argument("--pid-file", help="file for the grandchild's pid")
    parser.add_argument(
        "--grandchild-keeps-stdout", action="store_true", help="the grandchild inherits stdout (pipe outlives us)"
    )
    parser.add_argument("--tag", default="", help="serverInfo name suffix")
    parser.add_argument("--spawn-log", help="append one line per start to this file")
    parser.add_argument("--ignore-cancel", action="store_true", help="answer cancelled calls anyway")
    parser.add_argument("--event-log", help="append a line per notable event (cancellations, listings) to this file")
    parser.add_argument("--list-changed-storm", action="store_true", help="list_changed after every tools/list")
    parser.add_argument("--extra-prompts", help="JSON file with a list of extra prompt definitions")
    parser.add_argument("--extra-tools", help="JSON file with a list of extra (possibly broken) tool definitions")
    parser.add_argument("--deep-tool", type=int, default=0, help="list a tool whose schema is nested N levels")
    parser.add_argument("--print-env", help="write the value of this environment variable to stderr at start")
    parser.add_argument("--grandchild-setsid", action="store_true", help="the grandchild leaves our session")
    parser.add_argument("--ignore-term", action="store_true", help="ignore SIGTERM and stdin EOF")
    parser.add_argument("--http", type=int, default=0, help="serve streamable HTTP on 127.0.0.1:PORT")
    parser.add_argument("--catalog", help="JSON file of tools to list instead of the core tools")
    parser.add_argument("--startup-delay", type=float, default=0.0, help="seconds to sleep before serving")
    opts = parser.parse_args(argv)
    if opts.page_size < 0 or opts.tools < 0:
        parser.error("--page-size and --tools must not be negative")
    if opts.spawn_grandchild and not opts.pid_file:
        parser.error("--spawn-grandchild needs --pid-file")
    return opts


def load_catalog(path: str) -> list[dict[str, Any]]:
    """The tools of a `tools/list` dump: a list, or an object whose "tools" is one."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    tools = data.get("tools") if isinstance(data, dict) else data
    if not isinstance(tools, list):
        raise SystemExit(f"testkit: {path} holds no list of tools")
    return [tool for tool in tools if isinstance(tool, dict)]


def record_event(opts: argparse.Namespace, line: str) -> None:
    """Append one line to --event-log, so tests can see what reached this server."""
    if opts.event_log:
        with open(opts.event_log, "a") as fh:
            fh.write(f"{line}\n")


def spawn_grandchild(pid_file: str, keep_stdout: bool = False, setsid: bool = False) -> None:
    """Start `sleep 300` in our own process group (no new session) and record its pid atomically.

    With `keep_stdout` the grandchild inherits our stdout, as a launcher's leftovers often do:
    our exit then does not end the pipe. With `setsid` it leaves our session and process group, as a
    daemonizing helper does: signalling our group no longer reaches it.
    """
    import subprocess  # only this flag needs it: keep start-up fast otherwise

    child = subprocess.Popen(
        ["sleep", "300"],
        stdin=subprocess.DEVNULL,
        stdout=None if keep_stdout else subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=setsid,
    )
    tmp = f"{pid_file}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(f"{child.pid}\n")
    os.replace(tmp, pid_file)
    log(f"spawned grandchild {child.pid}")


class HttpWire(Wire):
    """Routes each response to the HTTP request waiting for its id; notifications are dropped."""

    def __init__(self) -> None:
        super().__init__(None)
        self.waiting: dict[str, tuple[threading.Event, list[bytes]]] = {}

    def expect(self, request_id: Any) -> tuple[threading.Event, list[bytes]]:
        slot: tuple[threading.Event, list[bytes]] = (threading.Event(), [])
        with self._lock:
            self.waiting[json.dumps(request_id)] = slot
        return slot

    def abandon(self, request_id: Any) -> None:
        """An HTTP request must end: a cancelled one is answered with an error, as SDK servers do."""
        self.error(request_id, -32800, "Request cancelled")

    def send_raw(self, data: bytes, request_id: Any = None) -> None:
        """Route a response to its waiting POST: by its id, else by the request it answers."""
        try:
            key = json.dumps(json.loads(data).get("id"))
        except (ValueError, AttributeError, RecursionError):
            key = None
        with self._lock:
            slot = self.waiting.pop(key, None) if key is not None else None
            if slot is None and request_id is not None:
                slot = self.waiting.pop(json.dumps(request_id), None)  # garbled: it still ends its POST
        if slot is not None:
            slot[1].append(data)
            slot[0].set()


def serve_http(opts: argparse.Namespace) -> None:
    """Stateless streamable HTTP: each POSTed request is answered with one JSON body."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    wire = HttpWire()
    server = Testkit(opts, wire)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # no server-to-client stream
            self.send_response(405)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_DELETE(self) -> None:
            self.do_GET()

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                message = json.loads(body)
            except ValueError:
                message = None
            slot = (
                wire.expect(message["id"])
                if isinstance(message, dict) and "id" in message and "method" in message
                else None
            )
            server.handle_line(body)
            if slot is None:
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            slot[0].wait()
            data = slot[1][0]
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", opts.http), Handler)
    httpd.daemon_threads = True
    log(f"serving HTTP on 127.0.0.1:{opts.http}")
    httpd.serve_forever()


def main(argv: list[str] | None = None) -> None:
    opts = parse_args(argv)
    if opts.spawn_log:
        with open(opts.spawn_log, "a") as fh:
            fh.write(f"{time.time():.6f} pid={os.getpid()} tag={opts.tag or '-'}\n")
    if opts.print_env:
        log(f"starting with {os.environ.get(opts.print_env, '')}")
    if opts.exit_at_start:
        log("--exit-at-start: failing on purpose")
        sys.exit(1)
    if opts.spawn_grandchild:
        spawn_grandchild(opts.pid_file, opts.grandchild_keeps_stdout, opts.grandchild_setsid)
    if opts.startup_delay > 0:
        time.sleep(opts.startup_delay)
    if opts.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if opts.http:
        serve_http(opts)
        return
    server = Testkit(opts, Wire(sys.stdout.buffer))
    for raw in sys.stdin.buffer:
        server.handle_line(raw)
    if opts.ignore_term:
        log("--ignore-term: stdin closed, running on")
        while True:
            time.sleep(3600)
    # stdin EOF: leave at once; calls still running live in daemon threads and are abandoned.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
