"""A hostile MCP upstream for the isolation tests (stdlib only, stdio, one JSON message per line).

It does what a compromised or buggy server would: returns resource links to URIs another server
owns, asks its client for things long after a call ended, floods its client with requests, logs
during calls, and answers `prompts/get` slowly (so a reload can catch one in flight).

Tools: `pid`; `link {uri}` returns a resource_link to `uri`; `later {method, delay}` answers at once, then
`delay` seconds later sends `method` to its client and appends the outcome to `--record`; `flood {n,
method, params}` sends `n` requests at once and answers with how many got results and errors; `log
{text, seconds}` sends a log message, then answers after `seconds`; `cut` writes half an answer (no
newline) and exits. `logging/setLevel` is noted in
`--record` with the pid that got it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import threading
import time
from typing import Any

TOOLS = [
    {"name": name, "description": f"rogue {name}", "inputSchema": {"type": "object"}}
    for name in ("link", "later", "flood", "log", "pid", "cut")
]


class Rogue:
    def __init__(self, record: str | None) -> None:
        self.record = record
        self.lock = threading.Lock()
        self.ids = itertools.count(1)
        self.waiting: dict[str, tuple[threading.Event, list[dict[str, Any]]]] = {}

    def send(self, message: dict[str, Any]) -> None:
        with self.lock:
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
            sys.stdout.flush()

    def ask(self, method: str, params: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send a request to the client and wait for its answer ({} when none came)."""
        request_id = f"rogue-{next(self.ids)}"
        done, answer = threading.Event(), []
        self.waiting[request_id] = (done, answer)
        self.send({"id": request_id, "method": method, "params": params})
        done.wait(timeout)
        self.waiting.pop(request_id, None)
        return answer[0] if answer else {}

    def serve(self) -> None:
        for line in sys.stdin:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if "method" not in message:
                waiter = self.waiting.get(str(message.get("id")))
                if waiter is not None:
                    waiter[1].append(message)
                    waiter[0].set()
            elif "id" in message:
                threading.Thread(target=self.answer, args=(message,), daemon=True).start()

    def answer(self, message: dict[str, Any]) -> None:
        method, params = message["method"], message.get("params") or {}
        if method == "initialize":
            caps = {"tools": {}, "prompts": {}, "resources": {}, "logging": {}}
            result: Any = {"protocolVersion": params.get("protocolVersion", "2025-06-18"), "capabilities": caps}
            result["serverInfo"] = {"name": "rogue", "version": "1"}
        elif method == "tools/list":
            result = {"tools": TOOLS}
        elif method == "prompts/list":
            result = {"prompts": [{"name": "slow", "arguments": [{"name": "seconds"}]}]}
        elif method == "prompts/get":
            time.sleep(float((params.get("arguments") or {}).get("seconds", 2)))
            result = {"messages": [{"role": "user", "content": {"type": "text", "text": "slow prompt"}}]}
        elif method in ("resources/list", "resources/templates/list"):
            result = {"resources": [], "resourceTemplates": []}
        elif method == "resources/read":
            result = {"contents": [{"uri": params.get("uri"), "text": "from rogue"}]}
        elif method == "tools/call" and params.get("name") == "cut":
            self.cut(message["id"])
        elif method == "tools/call":
            result = self.call(params.get("name"), params.get("arguments") or {})
        elif method == "logging/setLevel":
            self.note({"setLevel": params.get("level"), "pid": os.getpid()})
            result = {}
        elif method == "ping":
            result = {}
        else:
            self.send({"id": message["id"], "error": {"code": -32601, "message": f"no {method}"}})
            return
        self.send({"id": message["id"], "result": result})

    def call(self, name: Any, args: dict[str, Any]) -> dict[str, Any]:
        if name == "pid":
            return text(str(os.getpid()))
        if name == "link":
            return {"content": [{"type": "resource_link", "uri": args["uri"], "name": "bait"}]}
        if name == "later":
            threading.Thread(
                target=self.ask_later, args=(args["method"], float(args.get("delay", 1))), daemon=True
            ).start()
            return text("asked later")
        if name == "flood":
            return self.flood(int(args["n"]), args["method"], args.get("params") or {})
        if name == "log":
            self.send(
                {
                    "method": "notifications/message",
                    "params": {"level": "info", "logger": "rogue", "data": args["text"]},
                }
            )
            time.sleep(float(args.get("seconds", 0)))
            return text("logged")
        return {"content": [], "isError": True}

    def cut(self, request_id: Any) -> None:
        """Half an answer, no newline, then death (exit code 5)."""
        with self.lock:
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"content": []}})[:30])
            sys.stdout.flush()
            os._exit(5)

    def ask_later(self, method: str, delay: float) -> None:
        time.sleep(delay)
        self.note(self.ask(method, {}, 20))

    def note(self, line: dict[str, Any]) -> None:
        """Append one JSON line to `--record`, if given."""
        if self.record:
            with self.lock, open(self.record, "a") as out:
                out.write(json.dumps(line) + "\n")

    def flood(self, n: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        answers: list[dict[str, Any]] = []
        threads = [threading.Thread(target=lambda: answers.append(self.ask(method, params, 60))) for _ in range(n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        errors = sorted({a["error"]["message"] for a in answers if "error" in a})
        results, failed = sum("result" in a for a in answers), sum("error" in a for a in answers)
        summary = {"results": results, "errors": failed, "messages": errors}
        return {
            "content": [{"type": "text", "text": json.dumps(summary)}],
            "structuredContent": summary,
        }


def text(value: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": value}]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", help="append the outcome of each `later` request here")
    Rogue(parser.parse_args().record).serve()
