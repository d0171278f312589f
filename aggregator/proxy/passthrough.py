"""Everything besides tools, passed through (DESIGN §2.6): the client → upstream direction.

Downstream handlers for prompts, resources, completions, logging and tasks.
Routing decisions live in `aggregator.proxy.routing`; the upstream → client direction
(sampling, elicitation, roots, notifications) in `aggregator.proxy.relay`; this
module moves requests.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import mcp.types as types
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import PromptsListChanged, ResourcesListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from aggregator.catalog.model import Catalog, ResourceEntry, ResourceTemplateEntry
from aggregator.faults import Fault
from aggregator.log import get_logger
from aggregator.proxy.exposure import Clash, log_clashes, name_prefixes
from aggregator.proxy.relay import Clients, Relay
from aggregator.proxy.routing import ExposedPrompt, ResourceRouter, TaskRouter, build_prompt_table
from aggregator.sdk import client_connection
from aggregator.tools.base import ToolContext
from aggregator.upstream.pool import ConfigDiff, UpstreamPool

log = get_logger(__name__)

RESOURCE_NOT_FOUND = -32002
OWNER_META_KEY = "aggregator/upstream"  # on listed resources: which upstream serves this copy
_RESERVED_META_PREFIX = "io.modelcontextprotocol/"
_KEPT_RESERVED_META = {"io.modelcontextprotocol/related-task"}
_FAULT_CODES = {"timeout": types.REQUEST_TIMEOUT, "unknown_server": types.INVALID_PARAMS}


class Passthrough:
    """The handlers of the non-tool protocol; installs the `Relay` as the pool's `Downstream`."""

    def __init__(self, pool: UpstreamPool, clients: Clients, bus: InMemorySubscriptionBus) -> None:
        self.pool = pool
        self.clients = clients
        self.bus = bus
        self.resources = ResourceRouter(pool.upstream_names())
        self.tasks = TaskRouter()
        self._prompts: dict[str, ExposedPrompt] = {}
        self._fingerprints: dict[str, tuple[Any, Any]] = {}  # per server: (prompt names, resource keys)
        self._subscribers: dict[str, weakref.WeakSet[Connection]] = {}
        self.relay = Relay(pool, clients, bus, self.tasks, self._subscribers)
        clients.on_forget.append(pool.client_gone)
        self._changed_prompts = False
        self._changed_resources = False
        self.on_change: Callable[[], None] = lambda: None  # the server wakes its fan-out
        self._catalogs: dict[str, Catalog] = {}  # the last catalog each upstream listed, by name (sorted)
        self._clashes: set[Clash] = set()  # prompt names claimed twice, reported once
        for server, catalog in pool.store.loaded().items():
            self._on_catalog(server, catalog)
        self._changed_prompts = self._changed_resources = False
        pool.store.subscribe(self._on_catalog)
        pool.on_reconfigure(self._reconfigured)
        pool.downstream = self.relay
        pool.on_call_result = self.note_result

    # ------------------------------------------------------------ catalogs → tables

    def _on_catalog(self, server: str, catalog: Catalog | None) -> None:
        if catalog is None:  # a dropped catalog (crash, stop) keeps its entries listed, as direct tools do
            return
        prompts = tuple((p.name, p.title, p.description, p.arguments) for p in catalog.prompts)
        resources = (
            tuple((r.uri, r.name, r.title, r.description, r.mime_type) for r in catalog.resources),
            tuple((t.uri_template, t.name, t.title, t.description, t.mime_type) for t in catalog.resource_templates),
        )
        old = self._fingerprints.get(server)
        self._fingerprints[server] = (prompts, resources)
        self._catalogs = dict(sorted({**self._catalogs, server: catalog}.items()))
        self._prompts = self._prompt_table()
        self.resources.rebuild(self._catalogs)
        if old is None or old[0] != prompts:
            self._changed_prompts = self._changed_prompts or bool(prompts) or old is not None
        if old is None or old[1] != resources:
            self._changed_resources = self._changed_resources or any(resources) or old is not None
        if self._changed_prompts or self._changed_resources:
            self.on_change()

    def _prompt_table(self) -> dict[str, ExposedPrompt]:
        clashes: list[Clash] = []
        table = build_prompt_table(self._catalogs, name_prefixes(self.pool.config), clashes)
        log_clashes(clashes, self._clashes)
        return table

    def _reconfigured(self, diff: ConfigDiff) -> None:
        """After a config reload: removed upstreams' entries go, prompt names follow the (new) `prefix:`."""
        for name in diff.removed:
            self._catalogs.pop(name, None)
            self._fingerprints.pop(name, None)
        if diff.removed:
            self.resources.rebuild(self._catalogs)
            self._changed_resources = True
        prompts = self._prompt_table()
        self._changed_prompts = self._changed_prompts or list(prompts) != list(self._prompts)
        self._prompts = prompts
        if self._changed_prompts or self._changed_resources:
            self.on_change()

    async def announce(self, legacy: Sequence[Connection]) -> None:
        """Tell clients what changed since the last call (the server's fan-out calls this)."""
        prompts, resources = self._changed_prompts, self._changed_resources
        self._changed_prompts = self._changed_resources = False
        if prompts:
            await self.bus.publish(PromptsListChanged())
            for connection in legacy:
                await connection.send_prompt_list_changed()
        if resources:
            await self.bus.publish(ResourcesListChanged())
            for connection in legacy:
                await connection.send_resource_list_changed()

    # ------------------------------------------------------------ prompts

    async def _start_direct(self) -> None:
        """A listing is a need of the direct upstreams never listed (as for tools/list): start them."""
        pending = self.pool.unlisted(direct=True)
        if pending:
            await self.pool.start_all(pending)

    async def _prompt(self, name: str) -> ExposedPrompt:
        """The prompt exposed as `name`, starting the upstreams that may offer it (`find_starting`)."""
        entry = await self.pool.find_starting(lambda: self._prompts.get(name))
        if entry is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown prompt {name!r}; see prompts/list")
        return entry

    async def list_prompts(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        await self._start_direct()
        return types.ListPromptsResult(prompts=[_prompt_wire(entry) for entry in self._prompts.values()])

    async def get_prompt(self, ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> dict[str, Any]:
        return await self.get_prompt_for(ctx.params or {}, caller_of(ctx), ctx.protocol_version)

    async def get_prompt_for(self, params: Mapping[str, Any], caller: ToolContext, version: str) -> dict[str, Any]:
        """`prompts/get` with the request's params as validated (also the raw path's, `proxy/raw.py`)."""
        entry = await self._prompt(params["name"])
        forwarded = {**forwarded_meta(params), "name": entry.prompt.name}
        if params.get("arguments") is not None:
            forwarded["arguments"] = params["arguments"]
        return await self.forward_for(entry.server, "prompts/get", forwarded, caller, version)

    def prompt_owner(self, name: str) -> str | None:
        """The upstream serving the prompt exposed as `name`, as known now (nothing is started)."""
        entry = self._prompts.get(name)
        return entry.server if entry is not None else None

    # ------------------------------------------------------------ resources

    async def list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        await self._start_direct()
        resources = [
            types.Resource(uri=r.uri, **_listed(server, r))
            for server, catalog in self._catalogs.items()
            for r in catalog.resources
        ]
        return types.ListResourcesResult(resources=resources)

    async def list_resource_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        await self._start_direct()
        templates = [
            types.ResourceTemplate(uri_template=t.uri_template, **_listed(server, t))
            for server, catalog in self._catalogs.items()
            for t in catalog.resource_templates
        ]
        return types.ListResourceTemplatesResult(resource_templates=templates)

    async def _resource_owner(self, uri: str, template: bool = False) -> str:
        """The upstream serving `uri` (or, with `template`, offering it as a URI template), started if need be."""
        server = await self.pool.find_starting(lambda: self._resource_known_owner(uri, template))
        if server is None:
            raise MCPError(RESOURCE_NOT_FOUND, f"no upstream lists, returned or templates the resource {uri!r}")
        return server

    def _resource_known_owner(self, uri: str, template: bool) -> str | None:
        """The upstream serving `uri` as known now (with `template`, the one offering it as a template first)."""
        owner = self.resources.template_owner(uri) if template else None
        return owner or self.resources.resolve(uri)

    async def read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> dict[str, Any]:
        return await self.read_resource_for(ctx.params or {}, caller_of(ctx), ctx.protocol_version)

    async def read_resource_for(self, params: Mapping[str, Any], caller: ToolContext, version: str) -> dict[str, Any]:
        """`resources/read` with the request's params as validated (also the raw path's)."""
        uri = str(params["uri"])
        server = await self._resource_owner(uri)
        return await self.forward_for(server, "resources/read", {**forwarded_meta(params), "uri": uri}, caller, version)

    async def subscribe(self, ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams) -> dict[str, Any]:
        uri = str(params.uri)
        result = await self.forward(
            await self._resource_owner(uri), "resources/subscribe", {**forwarded_meta(ctx.params), "uri": uri}, ctx
        )
        connection = getattr(ctx.session, "_connection", None)
        if connection is not None:
            self._subscribers.setdefault(uri, weakref.WeakSet()).add(connection)
        return result

    async def unsubscribe(
        self, ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
    ) -> dict[str, Any]:
        uri = str(params.uri)
        connection = getattr(ctx.session, "_connection", None)
        subscribers = self._subscribers.get(uri)
        if subscribers is not None and connection is not None:
            subscribers.discard(connection)
        if subscribers and not self._own_session(uri, ctx):  # another client listens on the shared session
            return {}
        self._subscribers.pop(uri, None)
        return await self.forward(
            await self._resource_owner(uri), "resources/unsubscribe", {**forwarded_meta(ctx.params), "uri": uri}, ctx
        )

    def _own_session(self, uri: str, ctx: ServerRequestContext[Any]) -> bool:
        """True if the caller reaches the owner of `uri` on an upstream session of its own (docs/isolation.md)."""
        server = self.resources.resolve(uri)
        if server is None or server not in self.pool.upstream_names():
            return False
        return self.pool.connection(server).config.per_client_sessions and self.relay.client_of(ctx) is not None

    # ------------------------------------------------------------ completions, logging, roots

    async def complete(self, ctx: ServerRequestContext[Any], params: types.CompleteRequestParams) -> dict[str, Any]:
        return await self.complete_for(ctx.params or {}, caller_of(ctx), ctx.protocol_version)

    def completion_owner(self, params: Mapping[str, Any]) -> str | None:
        """The upstream a `completion/complete` goes to, as known now (nothing is started)."""
        ref = params.get("ref")
        if not isinstance(ref, Mapping):
            return None
        if ref.get("type") == "ref/prompt":
            return self.prompt_owner(str(ref.get("name")))
        return self._resource_known_owner(str(ref.get("uri")), template=True)

    async def complete_for(self, params: Mapping[str, Any], caller: ToolContext, version: str) -> dict[str, Any]:
        """`completion/complete` with the request's params as validated (also the raw path's)."""
        raw = dict(params)
        ref = dict(raw.get("ref") or {})
        if ref.get("type") == "ref/prompt":
            entry = await self._prompt(str(ref.get("name")))
            server, ref["name"] = entry.server, entry.prompt.name
        else:
            uri = str(ref.get("uri"))
            server = await self._resource_owner(uri, template=True)
        raw["ref"] = ref
        raw.pop("_meta", None)
        return await self.forward_for(server, "completion/complete", {**forwarded_meta(params), **raw}, caller, version)

    async def set_level(self, ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams) -> types.EmptyResult:
        await self.pool.set_log_level(params.level, self.relay.client_of(ctx))
        return types.EmptyResult()

    async def roots_changed(self, ctx: ServerRequestContext[Any], params: Any) -> None:
        await self.pool.notify_running("notifications/roots/list_changed", client=self.relay.client_of(ctx))

    # ------------------------------------------------------------ tasks

    async def call_as_task(
        self, server: str, tool: str, ctx: ServerRequestContext[Any], arguments: Mapping[str, Any]
    ) -> dict[str, Any]:
        """A task-augmented `tools/call`: the upstream creates the task; we remember whose it is."""
        raw = ctx.params or {}
        extra = {**forwarded_meta(ctx.params), "task": raw.get("task")}
        forwarded = {**extra, "name": tool, "arguments": dict(arguments)}
        result = await self.forward(server, "tools/call", forwarded, ctx)
        self.tasks.remember(server, result, client_connection(ctx.session))
        return result

    async def task_request(self, ctx: ServerRequestContext[Any]) -> dict[str, Any]:
        """`tasks/get`, `tasks/result`, `tasks/cancel` by task id; `tasks/list` over every running upstream.

        A task belongs to the client whose call created it: to any other client it does not exist.
        """
        raw = dict(ctx.params or {})
        if ctx.method == "tasks/list":
            return await self._list_tasks(ctx)
        task_id = raw.get("taskId")
        server = self.tasks.server_for(task_id, client_connection(ctx.session)) if isinstance(task_id, str) else None
        if server is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown task {task_id!r}")
        raw.pop("_meta", None)
        return await self.forward(server, ctx.method, {**forwarded_meta(ctx.params), **raw}, ctx)

    async def _list_tasks(self, ctx: ServerRequestContext[Any]) -> dict[str, Any]:
        """The caller's own tasks, as the upstreams that run them list them."""
        caller = client_connection(ctx.session)
        tasks: list[Any] = []
        for conn in self.pool.ready_connections():
            caps = conn.server_capabilities
            if caps is None or caps.tasks is None or caps.tasks.list is None:
                continue
            try:
                result = await conn.request("tasks/list", None, origin=ctx)
            except (MCPError, Fault) as exc:
                log.warning("tasks/list failed", upstream=conn.name, error=str(exc)[:200])
                continue
            for task in result.get("tasks") or []:
                task_id = task.get("taskId") if isinstance(task, Mapping) else None
                if isinstance(task_id, str) and self.tasks.server_for(task_id, caller) == conn.name:
                    tasks.append(task)
        return {"tasks": tasks}

    # ------------------------------------------------------------ forwarding

    async def forward(
        self, server: str, method: str, params: Mapping[str, Any], ctx: ServerRequestContext[Any]
    ) -> dict[str, Any]:
        """One request to `server`, answered with its raw result; our faults become JSON-RPC errors."""
        return await self.forward_for(server, method, params, caller_of(ctx), ctx.protocol_version)

    async def forward_for(
        self, server: str, method: str, params: Mapping[str, Any], caller: ToolContext, version: str
    ) -> dict[str, Any]:
        """`forward` for a caller (its progress, its origin) speaking protocol `version`."""
        try:
            conn = self.pool.connection(server)
            return for_era(await conn.request(method, params, caller.report_progress, origin=caller.origin), version)
        except Fault as fault:
            code = _FAULT_CODES.get(fault.reason, types.INTERNAL_ERROR)
            raise MCPError(code, f"{fault.reason}: {fault.message}", {"reason": fault.reason}) from None

    def note_result(self, server: str, result: Any) -> None:
        """Every tool result passing by: the resource links it carries become readable."""
        self.resources.remember(server, result)


# ---------------------------------------------------------------- helpers


def for_era(result: Any, protocol_version: str) -> Any:
    """An upstream's raw result, stamped with what the client's protocol era requires.

    A 2026-07-28 client requires `resultType` on every result; upstreams of the
    handshake era never send it. Nothing else is touched.
    """
    if isinstance(result, dict) and protocol_version in MODERN_PROTOCOL_VERSIONS and "resultType" not in result:
        return {**result, "resultType": "complete"}
    return result


def caller_of(ctx: ServerRequestContext[Any]) -> ToolContext:
    """The SDK's request context as a forwarded request needs it: progress to the client, `_meta`, origin."""
    return ToolContext(report_progress=ctx.session.report_progress, extra=forwarded_meta(ctx.params), origin=ctx)


def forwarded_meta(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The `_meta` of a client's request params, as `{"_meta": {...}}` to spread into forwarded params (or `{}`).

    Custom keys pass untouched; the progress token is ours to set, and the
    2026-07-28 envelope keys (protocol version, client capabilities, …) describe
    the client's connection to us, not ours to the upstream.
    """
    raw = (params or {}).get("_meta")
    if not isinstance(raw, Mapping):
        return {}
    meta = {
        key: value
        for key, value in raw.items()
        if key != "progressToken" and (not key.startswith(_RESERVED_META_PREFIX) or key in _KEPT_RESERVED_META)
    }
    return {"_meta": meta} if meta else {}


def _listed(server: str, entry: ResourceEntry | ResourceTemplateEntry) -> dict[str, Any]:
    """The fields a listed resource and a listed template share, with the upstream that serves it."""
    return {
        "name": entry.name,
        "title": entry.title,
        "description": entry.description or None,
        "mime_type": entry.mime_type,
        "_meta": {OWNER_META_KEY: server},
    }


def _prompt_wire(entry: ExposedPrompt) -> types.Prompt:
    prompt = entry.prompt
    return types.Prompt(
        name=entry.exposed,
        title=f"{prompt.title or prompt.name} ({entry.server})",
        description=prompt.description or None,
        arguments=[
            types.PromptArgument(name=a.name, description=a.description or None, required=a.required)
            for a in prompt.arguments
        ],
    )
