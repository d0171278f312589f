"""Bytes of `tools/list` a client reads from `aggregator serve`, per family of own tools (`own_tools:`).

    .venv/bin/python benchmarks/tools_list_bytes.py

Spawns a real `aggregator serve` (stdio) once per `own_tools` setting, with one lazy upstream (nothing
is started), and prints the size of the `tools/list` result as the client receives it (compact JSON,
as a client would count it), the tools in it, and each family's share as a ratio of the full listing.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.conftest import aggregator_client, kit_upstream, write_config

SETTINGS = {
    "everything (default)": None,
    "catalog only": {"introspection": False, "text_index": False},
    "catalog + introspection": {"text_index": False},
    "catalog + text_index": {"introspection": False},
}


async def listed_bytes(directory: Path, own_tools: dict[str, bool] | None) -> tuple[int, list[str]]:
    top = {"own_tools": own_tools} if own_tools is not None else {}
    config = write_config(directory, {"kit": kit_upstream()}, **top)
    async with aggregator_client(config) as session:
        result = await session.list_tools()
    wire = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    return len(json.dumps(wire, separators=(",", ":")).encode()), [tool.name for tool in result.tools]


async def main() -> None:
    rows = []
    for label, own_tools in SETTINGS.items():
        with tempfile.TemporaryDirectory() as tmp:
            rows.append((label, *await listed_bytes(Path(tmp), own_tools)))
    full = rows[0][1]
    print(f"{'own_tools':<26} {'bytes':>6} {'tools':>5} {'of default':>10}")
    for label, size, names in rows:
        print(f"{label:<26} {size:>6} {len(names):>5} {size / full:>10.2f}")
    catalog = rows[1][1]
    print(f"\nintrospection adds {rows[2][1] - catalog} bytes; text_index adds {rows[3][1] - catalog} bytes")


if __name__ == "__main__":
    anyio.run(main)
