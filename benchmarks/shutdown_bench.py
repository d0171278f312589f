"""How long `aggregator serve --transport http` takes to exit on SIGTERM, with idle upstreams.

    .venv/bin/python benchmarks/shutdown_bench.py [--reps 3]

For each setting the aggregator is started with its upstreams eager (`start: eager`), left until
every one is ready and idle, then sent SIGTERM; the figure is the wall time until the process has
exited (its upstreams' process groups ended first). Baseline in the same run: no upstreams at all.
Also counts the warning/error lines logged during the shutdown (target: none).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.conftest import aggregator_env, example, free_port, kit_upstream, wait_for_port, write_config

SETTINGS = {
    "no upstreams (baseline)": {},
    "2 stdlib upstreams (testkit)": {"a": kit_upstream(start="eager"), "b": kit_upstream(start="eager")},
    "1 SDK upstream (toolbox)": {"tb": example("toolbox", start="eager")},
}


def one_shutdown(directory: Path, upstreams: dict[str, object]) -> tuple[float, int]:
    config = write_config(directory, upstreams)
    port = free_port()
    command = [sys.executable, "-m", "aggregator", "serve", "--transport", "http", "--port", str(port)]
    proc = subprocess.Popen(
        [*command, "--config", str(config), "--log-level", "info"], stderr=subprocess.PIPE, env=aggregator_env()
    )
    assert proc.stderr is not None
    wait_for_port(port, proc)
    ready = 0
    while ready < len(upstreams):
        line = proc.stderr.readline().decode()
        assert line, "the aggregator ended early"
        ready += "upstream ready" in line
    time.sleep(0.5)  # idle
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=60)
    elapsed = time.monotonic() - started
    noisy = sum("level=warning" in line or "level=error" in line for line in rest.decode().splitlines())
    return elapsed, noisy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    reps = parser.parse_args().reps
    results: dict[str, list[tuple[float, int]]] = {label: [] for label in SETTINGS}
    for _ in range(reps):  # interleaved, so machine noise hits every setting alike
        for label, upstreams in SETTINGS.items():
            with tempfile.TemporaryDirectory() as tmp:
                results[label].append(one_shutdown(Path(tmp), upstreams))
    base = statistics.median(t for t, _ in results["no upstreams (baseline)"])
    print(f"{'setting':<30} {'median s':>8} {'max s':>6} {'vs baseline':>11} {'warnings':>8}")
    for label, runs in results.items():
        times = [t for t, _ in runs]
        median = statistics.median(times)
        warned = sum(n for _, n in runs)
        print(f"{label:<30} {median:>8.2f} {max(times):>6.2f} {median / base:>11.2f} {warned:>8}")


if __name__ == "__main__":
    main()
