"""Issue 11, downstream: what a misbehaving client does to a real `aggregator serve` over stdio.

Each test reproduces one case of the adversarial run against a real subprocess:
broken JSON-RPC (8), an oversized message (9), a client that never reads its
answers (10), stdin closed with requests in flight (11), stdin or stdout that
is not a pipe (12), and the search tools' bounds (18).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import aggregator_env, kit_upstream, rpc, spawn_raw_aggregator, write_config

INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}


def send(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin
    proc.stdin.write(data)
    proc.stdin.flush()


def request(request_id: Any, method: str, params: dict[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return json.dumps(message).encode() + b"\n"


def next_message(proc: subprocess.Popen[bytes]) -> Any:
    """The next answer (a message with an id, or a batch); notifications such as list_changed are passed over."""
    assert proc.stdout
    while True:
        line = proc.stdout.readline()
        assert line, "the aggregator closed its stdout"
        message = json.loads(line)
        if isinstance(message, list) or "id" in message:  # an answer, or a batch's answers
            return message


def answers_of(output: bytes) -> list[Any]:
    """The answers (messages with an id) among what the aggregator wrote; notifications are passed over."""
    return [message for message in map(json.loads, output.splitlines()) if "id" in message]


def call_tool(request_id: int, name: str, **arguments: Any) -> bytes:
    return request(request_id, "tools/call", {"name": name, "arguments": arguments})


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def finish(proc: subprocess.Popen[bytes]) -> bytes:
    """Close stdin, wait for a clean exit, return stderr (when captured)."""
    assert proc.stdin
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    return proc.stderr.read() if proc.stderr else b""


# ---------------------------------------------------------------- 8: broken JSON-RPC

BROKEN_LINES: list[tuple[bytes, Any, Any]] = [
    # (line, expected answer: (code, id) or a list of them for a batch, or None for no answer)
    (b"not json at all", (-32700, None), None),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "ping"', (-32700, None), None),
    (b"[" * 100_000, (-32700, None), None),
    (b"[]", (-32600, None), None),
    (b"42", (-32600, None), None),
    (b'"ping"', (-32600, None), None),
    (b'{"jsonrpc": "2.0", "id": 3.5, "method": "ping"}', (-32600, 3.5), None),
    (b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}', (-32600, None), None),
    (b'{"jsonrpc": "2.0", "id": [1], "method": "ping"}', (-32600, None), None),
    (b'{"jsonrpc": "2.0", "id": null, "method": "ping"}', (-32600, None), None),
    (b'{"jsonrpc": "2.0", "id": true, "method": "ping"}', (-32600, None), None),
    (b'{"jsonrpc": "2.0", "id": 4, "method": "tools/list", "params": [1, 2]}', (-32600, 4), None),
    (b'{"jsonrpc": "1.0", "id": 5, "method": "ping"}', (-32600, 5), None),
    (b'{"id": 6, "method": "ping"}', (-32600, 6), None),
    (b'{"jsonrpc": "2.0", "id": "s", "method": 7}', (-32600, "s"), None),
    (
        b'[{"jsonrpc": "2.0", "id": 8, "method": "ping"}, {"jsonrpc": "2.0", "method": "n"}, 1]',
        [(-32600, 8), (-32600, None)],
        None,
    ),
    (b'{"jsonrpc": "2.0", "method": "notifications/bogus", "params": [1]}', None, None),  # a notification
    (b'{"jsonrpc": "2.0", "id": 99, "result": "a response to nothing"}', None, None),
    (b"   ", None, None),
]


def test_broken_json_rpc_is_answered_and_the_session_goes_on(tmp_path: Path) -> None:
    proc = spawn_raw_aggregator(write_config(tmp_path, {}), stderr=subprocess.PIPE)
    try:
        for n, (line, expected, _) in enumerate(BROKEN_LINES):
            ping_id = f"after-{n}"
            send(proc, line + b"\n" + request(ping_id, "ping"))
            answers = []
            while True:
                message = next_message(proc)
                if isinstance(message, dict) and message.get("id") == ping_id:
                    assert message["result"] == {}, (line, message)
                    break
                answers.append(message)
            if expected is None:
                assert answers == [], (line, answers)
            elif isinstance(expected, list):
                assert len(answers) == 1 and isinstance(answers[0], list), (line, answers)
                assert [(a["error"]["code"], a["id"]) for a in answers[0]] == expected
            else:
                assert [(a["error"]["code"], a["id"]) for a in answers] == [expected], (line, answers)
    finally:
        stderr = finish(proc)
    assert b"Traceback" not in stderr


# ---------------------------------------------------------------- 9: an oversized message


def test_an_oversized_message_is_refused_and_serving_goes_on(tmp_path: Path) -> None:
    proc = spawn_raw_aggregator(write_config(tmp_path, {}))
    try:
        head = b'{"jsonrpc": "2.0", "id": "big", "method": "tools/call", "params": {"name": "x", "arguments": {"s": "'
        send(proc, head + b"a" * (33 * 1024 * 1024) + b'"}}}\n')
        refused = next_message(proc)
        assert refused["id"] == "big" and refused["error"]["code"] == -32600
        assert "exceeds" in refused["error"]["message"]
        assert rpc(proc, 2, "ping", {})["result"] == {}
    finally:
        finish(proc)


# ---------------------------------------------------------------- 10: backpressure


def test_a_client_that_never_reads_cannot_grow_our_memory(tmp_path: Path) -> None:
    """20k requests and no reads grew RSS by 440 MB; now stdin is not read past 64 unanswered requests."""
    proc = spawn_raw_aggregator(write_config(tmp_path, {}))
    count = 6000
    listed = rpc(proc, 1, "tools/list", {})
    assert len(json.dumps(listed)) > 4000  # each answer is several KB
    baseline = rss_kib(proc.pid)
    sent = [0]

    def flood() -> None:
        for i in range(count):
            send(proc, request(10 + i, "tools/list", {}))
            sent[0] = i + 1

    writer = threading.Thread(target=flood, daemon=True)
    writer.start()
    last, still = -1, 0.0
    while writer.is_alive() and still < 3:  # wait until our writes block: the pipe is full, nobody reads it
        time.sleep(0.25)
        still = still + 0.25 if sent[0] == last else 0.0
        last = sent[0]
    assert writer.is_alive(), "the aggregator read every request although its answers were not read"
    grown_mib = (rss_kib(proc.pid) - baseline) / 1024
    assert grown_mib < 40, f"RSS grew {grown_mib:.0f} MiB with {sent[0]} requests sent and none answered read"

    answered = set()
    while len(answered) < count:  # reading resumes the flood; every request is answered
        message = next_message(proc)
        answered.add(message["id"])
        assert "result" in message
    writer.join(timeout=30)
    finish(proc)


# ---------------------------------------------------------------- 11: drain on EOF


def test_stdin_closed_with_requests_in_flight_answers_every_one(tmp_path: Path) -> None:
    proc = spawn_raw_aggregator(write_config(tmp_path, {"kit": kit_upstream()}))
    warm = rpc(proc, 1, "tools/call", {"name": "catalog_call_tool", "arguments": {"server": "kit", "tool": "pid"}})
    assert "result" in warm
    slow = {"server": "kit", "tool": "slow", "arguments": {"seconds": 1, "steps": 0}}
    send(proc, b"".join(call_tool(100 + i, "catalog_call_tool", **slow) for i in range(20)))
    assert proc.stdin
    proc.stdin.close()
    assert proc.stdout
    answers = answers_of(proc.stdout.read())
    assert proc.wait(timeout=30) == 0
    assert sorted(a["id"] for a in answers) == list(range(100, 120))
    assert all(not a["result"].get("isError") for a in answers), answers


def test_requests_still_running_after_the_drain_window_are_cancelled_and_answered(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream()})
    proc = spawn_raw_aggregator(config, AGGREGATOR_DRAIN_SECONDS="0.5", AGGREGATOR_MAX_IN_FLIGHT="2")
    slow = {"server": "kit", "tool": "slow", "arguments": {"seconds": 60, "steps": 0}}  # 2 run, 3 wait
    send(proc, b"".join(call_tool(200 + i, "catalog_call_tool", **slow) for i in range(5)))
    time.sleep(1)  # the calls are running
    assert proc.stdin and proc.stdout
    proc.stdin.close()
    answers = answers_of(proc.stdout.read())
    assert proc.wait(timeout=30) == 0
    assert sorted(a["id"] for a in answers) == list(range(200, 205))
    assert all("error" in a for a in answers), answers


def test_a_full_session_still_hears_cancellations_and_frees_the_slots(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream()})
    proc = spawn_raw_aggregator(config, AGGREGATOR_MAX_IN_FLIGHT="2")
    try:
        slow = {"server": "kit", "tool": "slow", "arguments": {"seconds": 60, "steps": 0}}
        send(proc, call_tool(300, "catalog_call_tool", **slow) + call_tool(301, "catalog_call_tool", **slow))
        send(proc, request(302, "ping"))  # the session is full: this one waits in the backlog ...
        time.sleep(1)
        for request_id in (300, 301):  # ... while what the client sends next still gets through
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}}
            send(proc, json.dumps(cancel).encode() + b"\n")
        assert next_message(proc) == {"jsonrpc": "2.0", "id": 302, "result": {}}  # cancelled ones: no answer
    finally:
        finish(proc)


def test_the_session_ends_when_the_client_closes_stdout(tmp_path: Path) -> None:
    proc = spawn_raw_aggregator(write_config(tmp_path, {}))
    assert proc.stdout
    proc.stdout.close()
    send(proc, request(2, "ping"))  # its answer meets a closed pipe
    assert proc.wait(timeout=30) == 0


# ---------------------------------------------------------------- 12: stdin or stdout not a pipe


def serve_argv(config: Path) -> list[str]:
    return [sys.executable, "-m", "aggregator", "serve", "--config", str(config)]


@pytest.mark.parametrize("stdin", ["devnull", "closed", "file"])
def test_serve_without_a_pipe_on_stdin_exits_cleanly(tmp_path: Path, stdin: str) -> None:
    config = write_config(tmp_path, {})
    script = tmp_path / "in.jsonl"
    script.write_bytes(request(1, "initialize", INIT) + request(2, "ping"))
    command = {
        "devnull": f"exec {' '.join(serve_argv(config))} </dev/null",
        "closed": f"exec {' '.join(serve_argv(config))} <&-",
        "file": f"exec {' '.join(serve_argv(config))} <{script}",
    }[stdin]
    done = subprocess.run(["sh", "-c", command], capture_output=True, env=aggregator_env(), timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    assert b"Traceback" not in done.stderr
    answers = answers_of(done.stdout)
    assert [a["id"] for a in answers] == ([1, 2] if stdin == "file" else [])


def test_serve_with_stdout_to_a_file(tmp_path: Path) -> None:
    config = write_config(tmp_path, {})
    out = tmp_path / "out.jsonl"
    with out.open("wb") as sink:
        done = subprocess.run(
            serve_argv(config),
            input=request(1, "initialize", INIT) + request(2, "ping"),
            stdout=sink,
            stderr=subprocess.PIPE,
            env=aggregator_env(),
            timeout=60,
        )
    assert done.returncode == 0 and b"Traceback" not in done.stderr
    assert [json.loads(line)["id"] for line in out.read_bytes().splitlines()] == [1, 2]


# ---------------------------------------------------------------- 18: search tools' bounds


def tool_payload(proc: subprocess.Popen[bytes], request_id: int, name: str, **arguments: Any) -> dict[str, Any]:
    answer = rpc(proc, request_id, "tools/call", {"name": name, "arguments": arguments})
    return dict(answer["result"])


def test_search_index_on_an_empty_index_and_its_bounds(tmp_path: Path) -> None:
    proc = spawn_raw_aggregator(
        write_config(tmp_path, {}), stderr=subprocess.PIPE, AGGREGATOR_DATA_DIR=str(tmp_path / "data")
    )
    try:
        fresh = tool_payload(proc, 1, "search_index", query="anything")  # `default` on a fresh start
        assert not fresh.get("isError") and fresh["structuredContent"]["results"] == []
        tool_payload(proc, 2, "search_create_index", index_name="empty", backend="sqlite")
        empty = tool_payload(proc, 3, "search_index", query='+a -b "c d"', index_name="empty")
        assert not empty.get("isError") and empty["structuredContent"]["total_matches"] == 0

        huge_k = tool_payload(proc, 4, "search_index", query="x", k=10**12)
        assert huge_k["isError"] and huge_k["structuredContent"] == {"error": "k must be at most 1000"}

        for i in range(60):
            tool_payload(
                proc,
                10 + i,
                "search_add_document",
                doc_id=f"d{i:02}",
                content="common words",
                metadata={"pad": "p" * 8000},
            )
        capped = tool_payload(proc, 100, "search_index", query="common", k=1000)["structuredContent"]
        assert capped["total_matches"] == 60 and capped["truncated"] is True
        assert 0 < len(capped["results"]) < 60
        assert len(json.dumps(capped, separators=(",", ":")).encode()) <= 262_144
    finally:
        stderr = finish(proc)
    assert b"Traceback" not in stderr and b"math domain error" not in stderr


def test_apropos_answers_are_capped(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"kit": kit_upstream("--tools", "400")})
    proc = spawn_raw_aggregator(config, AGGREGATOR_MAX_RESULT_BYTES="4096")
    try:
        tool_payload(proc, 1, "catalog_list_tools", server="kit")  # loads the catalog
        text = tool_payload(proc, 2, "apropos-search", pattern="")["content"][0]["text"]
        assert text.startswith("Found 4")  # every entry is counted ...
        assert len(text.encode()) < 4096 + 300  # ... but only what fits is listed
        assert "more symbols not shown" in text
    finally:
        finish(proc)
