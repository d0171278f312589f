"""Memory and admission under an HTTP session flood (issue 11 case 13).

Run by hand: `.venv/bin/python benchmarks/http_sessions.py [--sessions N] [--close]`.
Starts a real `aggregator serve --transport http` (no upstreams) on 127.0.0.1,
opens N sessions (initialize, initialized, tools/list) and leaves them open, or
closes each with DELETE (`--close`), then prints the server's RSS before and
after, the growth per session, and whether a brand-new client is still admitted.
Limits come from the environment as usual (AGGREGATOR_HTTP_MAX_SESSIONS, ...).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import free_port, wait_for_port, write_config  # noqa: E402
from tests.test_downstream_faults import INIT, rss_kib  # noqa: E402
from tests.test_http_limits import HEADERS, list_tools_status, open_session  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--close", action="store_true", help="DELETE each session after using it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = write_config(Path(tmp), {})
        port = free_port()
        serve = ["serve", "--config", str(config), "--transport", "http", "--port", str(port)]
        proc = subprocess.Popen(
            [sys.executable, "-m", "aggregator", *serve],
            env=dict(os.environ),
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_port(port, proc)
            url = f"http://127.0.0.1:{port}/mcp"
            with httpx2.Client(timeout=60) as http:
                list_tools_status(http, url, open_session(http, url))  # warm up
                before = rss_kib(proc.pid)
                started = time.monotonic()
                refused = 0
                for _ in range(args.sessions):
                    try:
                        session = open_session(http, url)
                    except AssertionError:
                        refused += 1
                        continue
                    list_tools_status(http, url, session)
                    if args.close:
                        http.delete(url, headers={**HEADERS, "mcp-session-id": session})
                elapsed = time.monotonic() - started
                after = rss_kib(proc.pid)
                fresh = http.post(
                    url,
                    json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT},
                    headers=HEADERS,
                ).status_code
            grown = after - before
            print(f"sessions opened: {args.sessions} ({'closed' if args.close else 'left open'}), refused: {refused}")
            print(f"RSS before {before / 1024:.1f} MiB, after {after / 1024:.1f} MiB, grew {grown / 1024:.1f} MiB")
            print(f"per session: {grown / max(args.sessions, 1):.1f} KiB; time {elapsed:.1f} s")
            print(f"a new client's initialize after the flood: HTTP {fresh}")
            stopping = time.monotonic()
            proc.terminate()
            proc.wait(timeout=120)
            print(f"SIGTERM to exit: {time.monotonic() - stopping:.1f} s")
        finally:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
