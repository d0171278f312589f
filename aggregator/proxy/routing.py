"""Which upstream owns a prompt, a resource URI or a task (DESIGN §2.6).

Three small tables, rebuilt from the catalogs or filled as results pass by:

- prompts are exposed as `<server>__<prompt>` by the same collision-proof
  naming as direct tools (`exposure.exposed_name`) and resolved back through
  the table, never by splitting the name;
- a resource URI routes, in this order, to (1) the upstreams that list it,
  (2) the upstreams with a matching URI template, (3) the upstream that most
  recently returned it in a result (a `resource_link` or embedded resource: what
  a call returned must be readable). Among several listing (or templating)
  upstreams, the one that returned it wins, else the first by name (the order
  `list-upstreams` shows) and a warning names them (the listing marks each
  copy's owner in `_meta`). A listing or a template is an upstream's own claim;
  a URI in a result is only what one upstream says, so it never takes a URI
  that other upstreams list or template away from them (a `resource_link` of
  `evil` naming a file the filesystem server lists cannot reroute its reads);
- a task id routes to the upstream whose `tools/call` created it.

The maps of URIs seen in results and of task ids are bounded (least recently
used entries go first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from mcp.shared.uri_template import UriTemplate

from aggregator.catalog.model import Catalog, PromptEntry
from aggregator.log import get_logger
from aggregator.proxy.exposure import Clash, claim, exposed_name

log = get_logger(__name__)

SEEN_URIS_MAX = 4096
TASKS_MAX = 4096
TASK_CREATORS_MAX = 8  # per task id: clients whose own sessions minted the same id

K = TypeVar("K")
V = TypeVar("V")


class BoundedMap(Generic[K, V]):
    """A dict that forgets its least recently used entries beyond `limit`."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._items: OrderedDict[K, V] = OrderedDict()

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self._limit:
            self._items.popitem(last=False)

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True, slots=True)
class ExposedPrompt:
    exposed: str
    server: str
    prompt: PromptEntry


def build_prompt_table(
    catalogs: Mapping[str, Catalog], prefixes: Mapping[str, str] | None = None, clashes: list[Clash] | None = None
) -> dict[str, ExposedPrompt]:
    """`<server>__<prompt>` (or `prefixes[server]` + prompt) → owner, over every catalog (sorted, so the
    same catalogs give the same table); names claimed twice go to `clashes`."""
    table: dict[str, ExposedPrompt] = {}
    taken: dict[str, str] = {}
    prefixes = prefixes or {}
    for server in sorted(catalogs):
        for prompt in catalogs[server].prompts:
            name = exposed_name(server, prompt.name, prefixes.get(server))
            if not claim(taken, name, server, "prompt", clashes):
                continue
            table[name] = ExposedPrompt(name, server, prompt)
    return table


class ResourceRouter:
    """URI → upstream, by the rule in this module's docstring."""

    def __init__(self, order: Sequence[str]) -> None:
        self._rank = {name: i for i, name in enumerate(order)}  # the pool's order (by name) decides ambiguities
        self._listed: dict[str, list[str]] = {}
        self._templates: list[tuple[str, UriTemplate]] = []
        self._seen: BoundedMap[str, str] = BoundedMap(SEEN_URIS_MAX)

    def rebuild(self, catalogs: Mapping[str, Catalog]) -> None:
        servers = sorted(catalogs, key=lambda s: (self._rank.get(s, len(self._rank)), s))
        listed: dict[str, list[str]] = {}
        templates: list[tuple[str, UriTemplate]] = []
        for server in servers:
            for resource in catalogs[server].resources:
                owners = listed.setdefault(resource.uri, [])
                if server not in owners:
                    owners.append(server)
            for template in catalogs[server].resource_templates:
                try:
                    templates.append((server, UriTemplate.parse(template.uri_template)))
                except ValueError as exc:
                    log.warning("unusable uriTemplate", server=server, template=template.uri_template, error=str(exc))
        for uri, owners in listed.items():
            if len(owners) > 1 and self._listed.get(uri) != owners:
                log.warning("resource listed by several upstreams; reads go to the first", uri=uri, upstreams=owners)
        self._listed, self._templates = listed, templates

    def owners(self, uri: str) -> list[str]:
        """Every upstream listing `uri`, first the one reads go to."""
        return list(self._listed.get(uri, ()))

    def remember(self, server: str, result: Any) -> None:
        """Note the URIs a result carries (resource links, embedded resources) as `server`'s."""
        for uri in result_uris(result):
            self._seen.put(uri, server)

    def resolve(self, uri: str) -> str | None:
        seen = self._seen.get(uri)
        owners = self._listed.get(uri)
        if owners:
            return seen if seen in owners else owners[0]
        matching = [server for server, template in self._templates if _matches(template, uri)]
        if seen in matching:
            return seen
        if len(set(matching)) > 1:
            log.warning("URI matches templates of several upstreams; using the first", uri=uri, upstreams=matching)
        return matching[0] if matching else seen

    def template_owner(self, uri_template: str) -> str | None:
        """The upstream offering exactly this URI template (completion references name templates)."""
        for server, template in self._templates:
            if template.template == uri_template:
                return server
        return None


def _matches(template: UriTemplate, uri: str) -> bool:
    try:
        return template.match(uri) is not None
    except ValueError:
        return False


def result_uris(result: Any) -> Iterable[str]:
    """URIs of `resource_link` and embedded `resource` blocks in a raw tool result."""
    if not isinstance(result, Mapping):
        return
    content = result.get("content")
    if not isinstance(content, list):
        return
    for block in content:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "resource_link":
            uri = block.get("uri")
        elif kind == "resource":
            inner = block.get("resource")
            uri = inner.get("uri") if isinstance(inner, Mapping) else None
        else:
            continue
        if isinstance(uri, str):
            yield uri


class TaskRouter:
    """Task id → the upstreams and clients that created a task of that id; filled from task-creating results.

    Ids are only unique per upstream session: with sessions per client (docs/isolation.md) two
    clients of one upstream may each get a task `1`. So a client's request for a task is resolved
    with that client (`server_for`), and an upstream's message about a task with that upstream
    (`creators`): one client's task id never names another's.
    """

    def __init__(self) -> None:
        self._owners: BoundedMap[str, tuple[tuple[str, Any], ...]] = BoundedMap(TASKS_MAX)

    def remember(self, server: str, result: Any, creator: Any = None) -> None:
        task = result.get("task") if isinstance(result, Mapping) else None
        task_id = task.get("taskId") if isinstance(task, Mapping) else None
        if isinstance(task_id, str):
            self._add(task_id, server, creator)

    def remember_id(self, server: str, task_id: str, creator: Any = None) -> None:
        if self._owners.get(task_id) is None:
            self._add(task_id, server, creator)

    def _add(self, task_id: str, server: str, creator: Any) -> None:
        kept = [(s, c) for s, c in self._owners.get(task_id) or () if not (s == server and c is creator)]
        self._owners.put(task_id, (*kept[-(TASK_CREATORS_MAX - 1) :], (server, creator)))

    def owner(self, task_id: str) -> tuple[str, Any] | None:
        """The latest (upstream, creator) of a task with this id."""
        entries = self._owners.get(task_id)
        return entries[-1] if entries else None

    def server_for(self, task_id: str, creator: Any) -> str | None:
        """The upstream running the task `task_id` that `creator` created (None: not one of its tasks)."""
        found = [s for s, c in self._owners.get(task_id) or () if c is not None and c is creator]
        return found[-1] if found else None

    def creators(self, task_id: str, server: str) -> list[Any]:
        """The clients that created a task `task_id` on `server`."""
        return [c for s, c in self._owners.get(task_id) or () if s == server and c is not None]
