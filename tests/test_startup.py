"""Start-up (issue 24): `serve` imports only what it uses, and no collection walks the imported modules."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aggregator.startup import settled_imports

# What a stdio `serve` loads on the way to its first answer (the CLI, config, logging, the server, the pool).
SERVE_IMPORTS = """
import gc, json, sys
from aggregator.cli import main
main(["serve"])  # a real stdio serve on the built-in default config; stdin is empty, so it ends at once
deferred = {name for name, module in sys.modules.items() if type(module).__name__ == "_StandIn"}  # not loaded
roots = sorted({name.split(".")[0] for name in set(sys.modules) - deferred})
with open(sys.argv[1], "w") as out:  # not stdout: in stdio mode that is the protocol's
    modules = sorted(set(sys.modules) - deferred)
    json.dump({"roots": roots, "modules": modules, "frozen": gc.get_freeze_count(), "gc": gc.isenabled()}, out)
"""


def _serve_imports(tmp_path: Path, **env: str) -> dict[str, object]:
    out = tmp_path / "imports.json"
    done = subprocess.run(
        [sys.executable, "-c", SERVE_IMPORTS, str(out)],
        env={k: v for k, v in os.environ.items() if k != "OTEL_EXPORTER_OTLP_ENDPOINT"} | env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def test_serve_imports_no_cli_only_module_and_no_rich(tmp_path: Path) -> None:
    found = _serve_imports(tmp_path)
    roots = set(found["roots"])  # type: ignore[arg-type]
    assert not roots & {"rich", "pygments", "ruamel", "tomlkit"}, roots
    # memory: PyJWT and the SDK's MCPServer bring cryptography (9-12 MB RSS), sse_starlette uvicorn (2.5), sqlite 0.9
    assert not roots & {"jwt", "cryptography", "uvicorn", "click", "sqlite3"}, roots  # uvicorn: --transport http only
    # the HTTP client: remote upstreams only (2.4 MB); json5: JSON configs only (0.6); pydantic-settings (1.2)
    assert not roots & {"httpx2", "idna", "webbrowser", "json5", "pydantic_settings"}, roots
    # starlette, sse-starlette, python-multipart: the SDK's HTTP app, `--transport http` only (2.8 MB)
    assert not roots & {"starlette", "sse_starlette", "python_multipart"}, roots
    # python-dotenv: configs with an envFile only (0.15 MB); difflib: a "did you mean" only (0.15)
    assert not roots & {"dotenv", "difflib"}, roots
    assert "opentelemetry" not in roots, roots  # its API: no span is made with no OTEL endpoint (0.4 MB)
    # importlib.metadata with email, zipfile, csv (1.3 MB): pydantic's plugin scan, with no plugin installed
    modules = set(found["modules"])  # type: ignore[arg-type]
    assert not modules & {"importlib.metadata", "email", "csv"}, modules
    assert "pickle" not in modules, modules  # structlog's one name from it (0.2 MB)
    assert "ctypes" not in roots, roots  # its one C call, the heap's trim after start-up, goes through _ctypes
    assert "Stemmer" not in roots, roots  # PyStemmer: the first search loads it (0.7 MB)


def test_serve_with_an_otel_endpoint_keeps_the_sdk_spans_and_their_api(tmp_path: Path) -> None:
    found = _serve_imports(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    assert "opentelemetry" in found["roots"]  # type: ignore[operator]


# The modules of the subcommands a stdio `serve` never runs (0.7 MB; `cli.commands` registers them lazily).
OTHER_COMMANDS = {f"aggregator.cli.{name}" for name in ("auth", "calls", "clients", "doctor", "editing", "upstreams")}


def test_serve_imports_no_other_subcommand_module(tmp_path: Path) -> None:
    modules = set(_serve_imports(tmp_path)["modules"])  # type: ignore[arg-type]
    assert "aggregator.cli.serve" in modules
    assert not modules & (OTHER_COMMANDS | {"aggregator.cli.service"})  # service: `--transport socket` only
    assert "mcp.shared.auth" not in modules  # the SDK's OAuth models: with the first OAuth upstream (0.3 MB)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["-h", "serve"], "uninstall"),  # help before the command word: every command listed
        (["--help"], "doctor"),
        (["serv"], "did you mean 'serve' or 'service'?"),  # 'service' is another module's
        (["--probe", "serve"], "unrecognized arguments: --probe"),  # as before: argparse's own words
        (["--transport", "http", "serve"], "'--transport' is an option of 'serve': put it after the command"),
        (["serve", "--transprt", "http"], "did you mean '--transport'?"),
    ],
)
def test_the_serve_only_parser_leaves_help_and_mistakes_as_they_were(argv: list[str], said: str) -> None:
    """`serve` builds a parser without the other modules' subcommands: whatever a user types around
    it is still answered as by the whole command line, as a user sees it (a real process)."""
    done = subprocess.run(
        [sys.executable, "-m", "aggregator", *argv],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert said in done.stdout + done.stderr, (done.stdout, done.stderr)
    assert done.returncode in (0, 2)


def test_serve_help_and_the_whole_parser_agree_on_serve() -> None:
    from aggregator.cli.commands import build_parser

    whole, serving = build_parser(), build_parser(serving=True)
    chosen = [next(a.choices for a in p._actions if a.dest == "command") for p in (whole, serving)]
    assert set(chosen[1]) < set(chosen[0])
    assert chosen[1]["serve"].format_help() == chosen[0]["serve"].format_help()


def test_the_cli_freezes_its_imports_and_collects_again_after(tmp_path: Path) -> None:
    found = _serve_imports(tmp_path)
    assert found["gc"] is True
    assert isinstance(found["frozen"], int) and found["frozen"] > 10_000


def test_rich_still_imports_for_the_cli_progress_bar() -> None:
    script = "import aggregator.log, rich.progress; print(rich.progress.__name__)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "rich.progress", done.stderr


def test_settled_imports_nests_and_restores_the_collector() -> None:
    assert gc.isenabled()
    try:
        with settled_imports():
            assert not gc.isenabled()
            with settled_imports():
                assert not gc.isenabled()
            assert not gc.isenabled()  # only the outermost block turns it back on
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable()


def test_a_serving_stdio_aggregator_never_loads_what_it_does_not_use(tmp_path: Path) -> None:
    """Memory (issue 24): after a proxied call and a catalog search, a real `serve` has mapped no
    `cryptography` (the SDK's MCPServer, PyJWT) and no sqlite (no sqlite text index was opened)."""
    from tests.conftest import kit_upstream, rpc, spawn_raw_aggregator, write_config

    proc = spawn_raw_aggregator(write_config(tmp_path, {"kit": kit_upstream()}))
    try:
        echo = {"server": "kit", "tool": "echo", "arguments": {"message": "m"}}
        called = rpc(proc, 1, "tools/call", {"name": "catalog_call_tool", "arguments": echo})
        assert not called["result"].get("isError"), called
        search = {"name": "catalog_search_tools", "arguments": {"query": "repeat a message back"}}
        assert not rpc(proc, 2, "tools/call", search)["result"].get("isError")
        maps = Path(f"/proc/{proc.pid}/maps").read_text()  # the extension modules and libraries loaded
        assert "cryptography" not in maps and "sqlite" not in maps
    finally:
        assert proc.stdin
        proc.stdin.close()
        proc.wait(timeout=30)


def test_a_serving_stdio_aggregator_loads_the_http_client_for_its_first_remote_upstream(tmp_path: Path) -> None:
    """The SDK's HTTP client modules are stand-ins in `serve` (`sdk.deferred.defer_http_clients`): a real
    `serve` still reaches a streamable HTTP and an SSE upstream, and a stdio one beside them."""
    from tests.conftest import example, free_port, kit_upstream, rpc, spawn_raw_aggregator, wait_for_port, write_config

    toolbox = example("toolbox")
    servers, upstreams = [], {"kit": kit_upstream()}
    try:
        for transport, path in (("streamable-http", "mcp"), ("sse", "sse")):
            port = free_port()
            argv = [toolbox["command"], *toolbox["args"], transport, "--port", str(port)]
            servers.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            wait_for_port(port, servers[-1])
            kind = "http" if path == "mcp" else "sse"
            upstreams[kind] = {"url": f"http://127.0.0.1:{port}/{path}", "transport": kind, "auth": "none"}
        proc = spawn_raw_aggregator(write_config(tmp_path, upstreams))
        try:
            for request_id, name in enumerate(("kit", "http", "sse"), start=1):
                tool = "echo" if name == "kit" else "word_count"
                arguments = {"message": "m"} if name == "kit" else {"text": "two words"}
                call = {
                    "name": "catalog_call_tool",
                    "arguments": {"server": name, "tool": tool, "arguments": arguments},
                }
                result = rpc(proc, request_id, "tools/call", call)["result"]
                assert not result.get("isError"), result
                if name != "kit":
                    assert json.loads(result["content"][0]["text"])["words"] == 2, result
        finally:
            assert proc.stdin
            proc.stdin.close()
            proc.wait(timeout=30)
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=10)


@pytest.mark.parametrize("flag", ["0", "1"])
def test_aggregator_uvloop_0_serves_on_asyncio_without_importing_uvloop(tmp_path: Path, flag: str) -> None:
    """`AGGREGATOR_UVLOOP=0` trades about 0.04 ms a call for 2 MB (benchmarks/uvloop_bench.py): the
    loop it runs is asyncio's own and uvloop is not even imported; by default uvloop runs when installed."""
    import importlib.util

    from tests.conftest import kit_upstream, rpc, spawn_raw_aggregator, write_config

    proc = spawn_raw_aggregator(write_config(tmp_path, {"kit": kit_upstream()}), AGGREGATOR_UVLOOP=flag)
    try:
        echo = {"server": "kit", "tool": "echo", "arguments": {"message": "m"}}
        called = rpc(proc, 1, "tools/call", {"name": "catalog_call_tool", "arguments": echo})
        assert not called["result"].get("isError"), called
        mapped = "uvloop" in Path(f"/proc/{proc.pid}/maps").read_text()
        assert mapped is (flag == "1" and importlib.util.find_spec("uvloop") is not None)
    finally:
        assert proc.stdin
        proc.stdin.close()
        proc.wait(timeout=30)
