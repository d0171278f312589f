"""notes: a small in-memory notes store served over MCP stdio, with tools, prompts and resources.

It gives the aggregator's introspection tools (apropos-search, who-references) every kind of entry:
tools (add_note, list_notes, get_note, search_notes, delete_note), prompts (summarize_notes,
draft_note), resources (notes://index, notes://tags) and a resource template (notes://{note_id}).
The store starts with two notes and lives as long as the process.

Run: ``python -m aggregator.examples.notes`` or ``python examples/notes.py`` (stdio only).
"""

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp.types import ToolAnnotations
from pydantic import Field


@dataclass
class Note:
    id: str
    title: str
    body: str
    tags: list[str] = field(default_factory=list)
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))


class NoteStore:
    """Notes by id; ids are increasing decimal strings and never reused."""

    def __init__(self) -> None:
        self._notes: dict[str, Note] = {}
        self._next_id = 1

    def add(self, title: str, body: str, tags: list[str]) -> Note:
        note = Note(str(self._next_id), title, body, sorted({t.strip().lower() for t in tags if t.strip()}))
        self._notes[note.id] = note
        self._next_id += 1
        return note

    def find(self, note_id: str) -> Note | None:
        return self._notes.get(note_id.strip())

    def get(self, note_id: str) -> Note:
        """The note, or a ToolError naming the missing id (the tools' answer)."""
        note = self.find(note_id)
        if note is None:
            raise ToolError(f"no note with id {note_id!r}")
        return note

    def delete(self, note_id: str) -> Note:
        note = self.get(note_id)
        del self._notes[note.id]
        return note

    def all(self, tag: str | None = None) -> list[Note]:
        wanted = tag.strip().lower() if tag else None
        return [n for n in self._notes.values() if wanted is None or wanted in n.tags]

    def search(self, query: str) -> list[Note]:
        words = query.lower().split()
        return [
            n for n in self._notes.values() if all(w in f"{n.title} {n.body} {' '.join(n.tags)}".lower() for w in words)
        ]

    def tags(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for note in self._notes.values():
            for tag in note.tags:
                counts[tag] = counts.get(tag, 0) + 1
        return dict(sorted(counts.items()))


def _summary(note: Note) -> dict[str, Any]:
    return {"id": note.id, "title": note.title, "tags": note.tags, "created": note.created}


def build_server(store: NoteStore | None = None) -> MCPServer:
    """The notes server over `store` (a fresh store with two sample notes by default)."""
    if store is None:
        store = NoteStore()
        store.add("Welcome", "This server keeps notes in memory until it exits.", ["meta"])
        store.add("Groceries", "Milk, eggs, coffee beans, basil.", ["personal", "shopping"])

    server: MCPServer = MCPServer(
        "notes",
        version="1.0.0",
        instructions="An in-memory notes store: add, list, search, read and delete notes.",
        log_level="WARNING",
    )
    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(
        title="Add a note",
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False),
        structured_output=False,
    )
    def add_note(
        title: Annotated[str, Field(description="Short title.", min_length=1, max_length=200)],
        body: Annotated[str, Field(description="The note's text.", max_length=100_000)],
        tags: Annotated[list[str] | None, Field(description="Optional tags, e.g. ['work'].")] = None,
    ) -> dict[str, Any]:
        """Create a new note with a title, a body and optional tags; returns the new note's id."""
        return _summary(store.add(title, body, tags or []))

    @server.tool(title="List notes", annotations=read_only, structured_output=False)
    def list_notes(
        tag: Annotated[str | None, Field(description="Only notes with this tag.")] = None,
    ) -> list[dict[str, Any]]:
        """List the notes (id, title, tags, creation time), optionally only those with a tag."""
        return [_summary(n) for n in store.all(tag)]

    @server.tool(title="Read a note", annotations=read_only, structured_output=False)
    def get_note(note_id: Annotated[str, Field(description="The note's id.")]) -> dict[str, Any]:
        """Read one note in full by its id."""
        return asdict(store.get(note_id))

    @server.tool(title="Search notes", annotations=read_only, structured_output=False)
    def search_notes(
        query: Annotated[str, Field(description="Words that must all appear in title, body or tags.")],
    ) -> list[dict[str, Any]]:
        """Find notes whose title, body or tags contain every word of the query."""
        return [_summary(n) for n in store.search(query)]

    @server.tool(
        title="Delete a note",
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
        ),
        structured_output=False,
    )
    def delete_note(note_id: Annotated[str, Field(description="The note's id.")]) -> str:
        """Delete a note permanently by its id."""
        return f"deleted note {store.delete(note_id).id}"

    @server.prompt(title="Summarize notes")
    def summarize_notes(
        topic: Annotated[str, Field(description="The subject the summary should focus on.")],
    ) -> str:
        """Ask for a summary of the stored notes about a topic."""
        listing = "\n".join(f"- [{n.id}] {n.title}: {n.body}" for n in store.all())
        return f"Summarize what these notes say about {topic!r}. Cite note ids.\n\n{listing or '(no notes)'}"

    @server.prompt(title="Draft a note")
    def draft_note(
        title: Annotated[str, Field(description="Title of the note to draft.")],
        tone: Annotated[str, Field(description="Writing tone, e.g. 'formal', 'casual', 'terse'.")],
    ) -> str:
        """Ask for a draft of a new note with a given title, written in a given tone."""
        return f"Draft a short note titled {title!r} in a {tone} tone, then save it with add_note."

    @server.resource("notes://index", name="index", title="Note index", mime_type="application/json")
    def index() -> str:
        """Every note's id, title, tags and creation time, as JSON."""
        return json.dumps([_summary(n) for n in store.all()], indent=2)

    @server.resource("notes://tags", name="tags", title="Tags", mime_type="application/json")
    def tags() -> str:
        """Each tag with the number of notes carrying it, as JSON."""
        return json.dumps(store.tags(), indent=2)

    @server.resource("notes://{note_id}", name="note", title="One note", mime_type="text/markdown")
    def note(note_id: str) -> str:
        """One note as Markdown, by id."""
        found = store.find(note_id)
        if found is None:
            raise ResourceNotFoundError(f"no note with id {note_id!r}")
        tag_line = f"\n\nTags: {', '.join(found.tags)}" if found.tags else ""
        return f"# {found.title}\n\n{found.body}{tag_line}\n"

    return server


def main() -> None:
    build_server().run("stdio")


if __name__ == "__main__":
    main()
