"""Backfill against live ingest: ``stepstream ingest-file`` beside the worker, into
SQLite, on both corpora, in one run (target: ingest-file at least 1.0x the worker).

    PYTHONPATH=services python -m benchmarks.bench_backfill --broker HOST:PORT [--rounds N] [--quick]

The corpora are ``bench_worker``'s (thinking-heavy, many-runs). Per corpus and round,
interleaved so that a burst of the machine's other load hits both paths:

* ``ingest-file`` of the corpus as a JSON-lines file (``ingest_file_timed``: timed
  inside its process, from the CLI's entry to its exit, so opening the stores and the
  last write count, the interpreter's start and imports do not);
* the worker (``stepstream worker``, SQLite at its default durability) over the same
  events pre-loaded on a topic, from its first durable batch to the last one
  (``worker_process.Worker.measure``).

Each row gives events/s, CPU microseconds per event (ingest-file: its own process;
the worker: every thread and writer process) and the share of wall time runnable but
waiting for a core; the ratio is of the best round of each. Prints a table and
``BENCH_BACKFILL_JSON {...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.bench_worker import FULL, QUICK, SINKS, Corpus, ingest_file, many_runs, new_topic, preload, thinking_heavy, worker_run  # fmt: skip
from benchmarks.worker_process import Throughput

TARGET = 1.0


def _figures(t: Throughput) -> dict[str, float]:
    return {"events": t.events, "seconds": t.seconds, "rate": t.rate, "cpu_us_per_event": t.cpu_us_per_event,
            "runqueue_share": t.runqueue_share}  # fmt: skip


async def corpus_run(args: argparse.Namespace, corpus: Corpus, rounds: int, tmp: Path) -> dict[str, Any]:
    plan = QUICK if args.quick else FULL
    corpus.topic = await new_topic(args.broker, f"bench-backfill-{corpus.name}")
    await preload(args.broker, corpus.topic, corpus.blobs())
    sqlite = SINKS[0]
    assert sqlite.key == "sqlite"
    files: list[Throughput] = []
    live: list[Throughput] = []
    errors: list[str] = []
    for round_ in range(rounds):
        files.append(ingest_file(corpus, tmp))
        try:
            result: Throughput | str = await worker_run(args, plan, corpus, sqlite, tmp)
        except OSError as exc:  # its /metrics did not answer in time (an overloaded machine): no figure
            result = f"n/a: the worker's /metrics did not answer ({exc!r})"
        if isinstance(result, str):
            errors.append(result)
        else:
            live.append(result)
        print(f"{corpus.name} round {round_ + 1}: ingest-file {files[-1].rate:,.0f}/s, worker "
              + (f"{live[-1].rate:,.0f}/s" if not isinstance(result, str) else result), file=sys.stderr, flush=True)  # fmt: skip
    out: dict[str, Any] = {"events": len(corpus.events), "runs": corpus.runs}
    best_file = max(files, key=lambda t: t.rate)
    out["ingest_file"] = {**_figures(best_file), "rounds": [t.rate for t in files]}
    if live:
        best_live = max(live, key=lambda t: t.rate)
        out["worker"] = {**_figures(best_live), "rounds": [t.rate for t in live]}
        out["ratio"] = best_file.rate / best_live.rate
    if errors:
        out["worker_errors"] = errors
    return out


def report(result: dict[str, Any]) -> str:
    lines = [f"{'corpus':<16} {'path':<12} {'events/s':>10} {'CPU us/ev':>10} {'runq':>6}  rounds (events/s)"]
    for name, c in result["corpora"].items():
        for key, label in (("ingest_file", "ingest-file"), ("worker", "worker")):
            f = c.get(key)
            if f is None:
                lines.append(f"{name:<16} {label:<12} n/a: {'; '.join(c.get('worker_errors', []))[:200]}")
                continue
            rounds = ", ".join(f"{r:,.0f}" for r in f["rounds"])
            lines.append(f"{name:<16} {label:<12} {f['rate']:>10,.0f} {f['cpu_us_per_event']:>10.1f} "
                         f"{f['runqueue_share']:>6.2f}  {rounds}")  # fmt: skip
        if "ratio" in c:
            verdict = "pass" if c["ratio"] >= TARGET else "FAIL"
            lines.append(f"{name:<16} ingest-file / worker: {c['ratio']:.2f}x (target >= {TARGET:.1f}x: {verdict})")
    lines.append(f"load average {result['loadavg_at_start']:.1f} at the start, {result['loadavg_at_end']:.1f} at the end")
    if result["mode"] == "quick":
        lines.append("(--quick: small corpora, one round, worker windows of a fraction of a second: "
                     "not comparable with the full run's figures)")  # fmt: skip
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    plan = QUICK if args.quick else FULL
    rounds = 1 if args.quick else args.rounds
    tmp = Path(tempfile.mkdtemp(prefix="stepstream-bench-backfill-"))
    result: dict[str, Any] = {"mode": "quick" if args.quick else "full", "loadavg_at_start": os.getloadavg()[0],
                              "cpus": os.cpu_count(), "corpora": {}}  # fmt: skip
    try:
        for corpus in (thinking_heavy(plan.thinking_events), many_runs(plan.many_runs)):
            result["corpora"][corpus.name] = await corpus_run(args, corpus, rounds, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["loadavg_at_end"] = os.getloadavg()[0]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker", default=os.environ.get("STEPSTREAM_TEST_BROKER"), help="bootstrap host:port")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="small corpora, one round, for a smoke run")
    args = parser.parse_args(argv)
    args.mongo = None  # worker_run's MongoDB option: SQLite only here
    if not args.broker:
        parser.error("--broker (or STEPSTREAM_TEST_BROKER) is required; `make bench` starts one")
    result = asyncio.run(main_async(args))
    print(report(result), flush=True)
    print("BENCH_BACKFILL_JSON " + json.dumps(result, default=str), flush=True)
    ratios = [c["ratio"] for c in result["corpora"].values() if "ratio" in c]
    return 0 if len(ratios) == len(result["corpora"]) and min(ratios) >= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
