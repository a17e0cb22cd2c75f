"""Worker start-up on a real broker: the time from process start to the first durable
batch, with its breakdown (target: at most 3 s on this machine).

    PYTHONPATH=services python -m benchmarks.bench_start --broker HOST:PORT [--rounds N] [--quick]

Per round, a fresh topic holds a few hundred events and a fresh consumer group and
SQLite file wait: ``stepstream worker`` is started as KEDA would start it, and two
clocks run. Outside, this process notes when it spawned the worker and polls its
``/metrics`` every 20 ms until ``stepstream_events_total`` moves (events are counted
once their batch is durable): that is the figure. Inside, the worker's
``stepstream_worker_start_seconds{phase}`` says when each phase ended, from the
kernel's start time of the process: the breakdown (``stepstream.ingest.startup``).

Beside it, the floor of any Python worker on this machine: ``python -c pass`` and
``python -c "import faust"`` (spawned and waited for), measured in the same rounds.

``--compare PYTHON`` also starts another install's worker (the interpreter of a checkout
of an older commit) in the same rounds, interleaved, for a before/after ratio on a
machine too busy for absolute figures. Prints one line per round and the median, then
``BENCH_START_JSON {...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from stepstream.emitter.corpus import generate_many_runs
from stepstream.core.wire import encode_event, partition_key

from benchmarks.bench_worker import PARTITIONS, new_topic, preload
from benchmarks.worker_process import Worker, WorkerFailed, metric_sum

TARGET_SECONDS = 3.0
PHASES = ("imported", "preflight", "topics", "stores", "assigned", "first_batch")


def _interpreter(code: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - started


def _phases(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "stepstream_worker_start_seconds":
                out[sample.labels["phase"]] = sample.value
    return out


def one_start(broker: str, topic: str, tmp: Path, events: int, timeout: float = 60.0,
              python: str = sys.executable) -> dict[str, Any]:  # fmt: skip
    name = f"start-{uuid.uuid4().hex[:6]}"
    # PYTHONPATH emptied: the interpreter's own install decides which stepstream runs.
    env = {"STEPSTREAM_LOG_LEVEL": "info", "PYTHONPATH": ""}
    spawned = time.perf_counter()
    worker = Worker(broker, topic, tmp, name, steps_sink=f"sqlite:///{tmp / (name + '.db')}", partitions=PARTITIONS,
                    env=env, python=python)  # fmt: skip
    try:
        first = None
        while time.perf_counter() - spawned < timeout:
            if worker.proc.poll() is not None:
                raise worker.failure("exited during start-up")
            try:
                text = worker.metrics()
            except OSError:
                time.sleep(0.02)
                continue
            if metric_sum(text, "stepstream_events_total") > 0:
                first = time.perf_counter() - spawned
                break
            time.sleep(0.02)
        if first is None:
            raise worker.failure(f"no durable batch {timeout:.0f}s after the start")
        # The in-process first_batch mark comes from the batch timer: wait for it briefly.
        phases: dict[str, float] = {}
        for _ in range(50):
            phases = _phases(worker.metrics())
            if "first_batch" in phases:
                break
            time.sleep(0.02)
        applied = worker.wait_events(events, timeout=timeout)
        return {"first_durable": first, "phases": phases, "applied": applied}
    finally:
        worker.stop()


async def prepare(broker: str, events: int) -> str:
    topic = await new_topic(broker, "bench-start")
    blobs = [(partition_key(e.company_id, e.run_id), encode_event(e)) for e in generate_many_runs(7, runs=max(8, events // 9), companies=4)]  # fmt: skip
    await preload(broker, topic, blobs[:events])
    return topic


def report(result: dict[str, Any]) -> str:
    lines = [
        f"{'round':>5}  {'first durable':>13}  " + "  ".join(f"{p:>11}" for p in PHASES) + "  (seconds since the process started)"
    ]
    for i, r in enumerate(result["rounds"], 1):
        if "error" in r:
            lines.append(f"{i:>5}  error: {r['error'][:300]}")
            continue
        lines.append(f"{i:>5}  {r['first_durable']:>12.2f}s  " + "  ".join(
            f"{r['phases'].get(p, float('nan')):>10.2f}s" for p in PHASES))  # fmt: skip
    med = result.get("median_first_durable")
    if med is not None:
        verdict = "pass" if med <= TARGET_SECONDS else "FAIL"
        lines.append(f"median time to the first durable batch: {med:.2f}s (target <= {TARGET_SECONDS:.0f}s: {verdict})")
        lines.append(
            f"floor on this machine: python -c pass {result['floor']['python']:.2f}s, "
            f"python -c 'import faust' {result['floor']['import_faust']:.2f}s (medians)"
        )
    compare = result.get("compare")
    if compare:
        lines.append(
            f"beside it, in the same rounds, {compare['python']}: median {compare['median_first_durable']:.2f}s "
            f"(rounds {', '.join(f'{r:.2f}' for r in compare['rounds'])}); "
            f"this worker starts {compare['median_first_durable'] / med:.2f}x as fast"
        )
    lines.append(f"load average {result['loadavg_at_start']:.1f} at the start, {result['loadavg_at_end']:.1f} at the end")
    if result["mode"] == "quick":
        lines.append("(--quick: one round; a smoke run, not comparable with the full run's median)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker", default=os.environ.get("STEPSTREAM_TEST_BROKER"), help="bootstrap host:port")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--events", type=int, default=500, help="events on the topic (the first batch is a fraction)")
    parser.add_argument("--quick", action="store_true", help="one round")
    parser.add_argument("--compare", metavar="PYTHON",
                        help="also start the worker of another install (its interpreter, e.g. a checkout of an older "
                             "commit's .venv/bin/python), interleaved round by round: the ratio of the medians")  # fmt: skip
    args = parser.parse_args(argv)
    if not args.broker:
        parser.error("--broker (or STEPSTREAM_TEST_BROKER) is required; `make bench` starts one")
    rounds = 1 if args.quick else args.rounds
    result: dict[str, Any] = {"mode": "quick" if args.quick else "full", "loadavg_at_start": os.getloadavg()[0],
                              "rounds": []}  # fmt: skip
    floors: dict[str, list[float]] = {"python": [], "import_faust": []}
    with tempfile.TemporaryDirectory(prefix="stepstream-bench-start-") as tmp:
        for _ in range(rounds):
            topic = asyncio.run(prepare(args.broker, args.events))  # a fresh topic and group per round
            floors["python"].append(_interpreter("pass"))
            floors["import_faust"].append(_interpreter("import faust"))
            try:
                result["rounds"].append(one_start(args.broker, topic, Path(tmp), args.events))
            except WorkerFailed as exc:
                result["rounds"].append({"error": str(exc)})
            if args.compare:
                topic = asyncio.run(prepare(args.broker, args.events))
                try:
                    result.setdefault("compared", []).append(
                        one_start(args.broker, topic, Path(tmp), args.events, python=args.compare)
                    )
                except WorkerFailed as exc:
                    result.setdefault("compared", []).append({"error": str(exc)})
    good = [r["first_durable"] for r in result["rounds"] if "error" not in r]
    if good:
        result["median_first_durable"] = statistics.median(good)
        result["floor"] = {k: statistics.median(v) for k, v in floors.items()}
        result["median_phases"] = {
            p: statistics.median([r["phases"][p] for r in result["rounds"] if p in r.get("phases", {})] or [float("nan")])
            for p in PHASES
        }
    other = [r["first_durable"] for r in result.get("compared", []) if "error" not in r]
    if args.compare and good and other:
        result["compare"] = {"python": args.compare, "median_first_durable": statistics.median(other),
                             "rounds": other}  # fmt: skip
    result["loadavg_at_end"] = os.getloadavg()[0]
    print(report(result), flush=True)
    print("BENCH_START_JSON " + json.dumps(result, default=str), flush=True)
    return 0 if good and result["median_first_durable"] <= TARGET_SECONDS else 1


if __name__ == "__main__":
    raise SystemExit(main())
