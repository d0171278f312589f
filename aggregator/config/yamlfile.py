"""YAML → Python data plus the line of every key path, with limits a config never needs to pass.

PyYAML's SafeLoader, hardened: duplicate keys are errors (PyYAML keeps the last one silently);
nesting is limited to `MAX_DEPTH` levels and aliases may not expand the document past `MAX_NODES`
nodes (a few hundred bytes of "billion laughs" otherwise take minutes and gigabytes); an alias
inside its own anchor is an error. Every problem is a one-line `ConfigError` naming the line.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from aggregator.config.errors import ConfigError, KeyPath, Lines

__all__ = ["MAX_DEPTH", "MAX_NODES", "parse_yaml"]

MAX_DEPTH = 64
"""Nesting levels allowed (a config uses about six)."""

MAX_NODES = 100_000
"""Nodes the document may hold once every alias is expanded."""

_SYNTAX_FIX = "correct the YAML syntax there (indent with spaces, not tabs; quote values containing ': ' or ' #')"


class _Rejected(Exception):
    """A document the loader refuses: a duplicate key, or a limit passed."""

    def __init__(self, problem: str, fix: str, line: int | None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix
        self.line = line


class _Loader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys, deep nesting and self-referencing aliases."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._open_anchors: set[str] = set()

    def compose_node(self, parent: Node | None, index: Any) -> Node:  # type: ignore[override]
        event = self.peek_event()
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        if isinstance(event, AliasEvent):
            if event.anchor in self._open_anchors:
                raise _Rejected(
                    f"the alias *{event.anchor} is inside its own anchor &{event.anchor}",
                    "refer to an anchor only after its node ends",
                    line,
                )
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        if self._depth >= MAX_DEPTH:
            raise _Rejected(f"nested more than {MAX_DEPTH} levels deep", "flatten the structure", line)
        anchor = getattr(event, "anchor", None)
        self._depth += 1
        if anchor is not None:
            self._open_anchors.add(anchor)
        try:
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        finally:
            self._depth -= 1
            self._open_anchors.discard(anchor)  # type: ignore[arg-type]

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:  # type: ignore[override]
        seen: set[str] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.value in seen:
                    raise _Rejected(
                        f"the key {key_node.value!r} appears twice in one mapping",
                        "keep one of them (server names must be unique)",
                        key_node.start_mark.line + 1,
                    )
                seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, source: str) -> tuple[Any, Lines]:
    """YAML → Python data, and the line of every key path (for messages)."""
    loader: _Loader | None = None
    try:
        loader = _Loader(text)  # reading starts here: a NUL or control character fails already
        node = loader.get_single_node()
        if node is not None:
            _check_expanded_size(node)
        data = loader.construct_document(node) if node is not None else None
    except _Rejected as exc:
        raise ConfigError(source, None, exc.problem, exc.fix, line=exc.line) from None
    except yaml.reader.ReaderError as exc:
        char = f"U+{exc.character:04X}" if isinstance(exc.character, int) else repr(exc.character)
        problem = f"the character {char} is not allowed in YAML"
        fix = "remove it, or write it as an escape in a quoted string"
        raise ConfigError(source, None, problem, fix, line=text.count("\n", 0, max(exc.position, 0)) + 1) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "cannot parse"
        at = mark.line + 1 if mark is not None else None
        raise ConfigError(source, None, f"invalid YAML: {problem}", _SYNTAX_FIX, line=at) from None
    except yaml.YAMLError as exc:
        raise ConfigError(source, None, f"invalid YAML ({type(exc).__name__})", "correct the YAML") from None
    except RecursionError:
        raise ConfigError(source, None, "the YAML is nested too deeply", "flatten the structure") from None
    finally:
        if loader is not None:
            loader.dispose()
    lines: Lines = {}
    if node is not None:
        _collect_lines(node, (), lines)
    return data, lines


def _children(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, SequenceNode):
        return list(node.value)
    return []


def _check_expanded_size(root: Node) -> None:
    """Reject a document whose aliases expand it past MAX_NODES nodes or MAX_DEPTH levels.

    Iterative and memoised per node, so measuring costs the size of the text, not of the expansion.
    """
    measured: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded size, expanded depth)
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in measured:
            continue
        children = _children(node)
        if not children_done:
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in measured)
            continue
        size = 1 + sum(measured[id(child)][0] for child in children)
        depth = 1 + max((measured[id(child)][1] for child in children), default=0)
        line = node.start_mark.line + 1
        if size > MAX_NODES:
            raise _Rejected(f"aliases expand the document past {MAX_NODES} nodes", "use fewer or smaller aliases", line)
        if depth > MAX_DEPTH:
            raise _Rejected(f"aliases nest the document more than {MAX_DEPTH} levels deep", "use fewer aliases", line)
        measured[id(node)] = (size, depth)


def _collect_lines(node: Node, path: KeyPath, lines: Lines) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, ScalarNode):
                child = (*path, key_node.value)
                lines.setdefault(child, key_node.start_mark.line + 1)
                _collect_lines(value_node, child, lines)
    elif isinstance(node, SequenceNode):
        for index, item in enumerate(node.value):
            _collect_lines(item, (*path, index), lines)
