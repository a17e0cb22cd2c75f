"""Engine benchmark: throughput of decode + fold against msgspec decoding alone, and
the memory an open run holds.

    PYTHONPATH=services python -m benchmarks.bench_engine [--runs 400] [--rounds 5]

* Throughput: a generated, thinking-heavy corpus (``emitter.corpus``) is encoded to
  wire bytes first; then, side by side in one process and interleaved round by
  round, (a) ``decode_event`` over every message and (b) ``decode_event`` plus
  ``RunFold.push`` into a per-run registry, as the worker does. Best round of each.
  ``ratio`` is (b)'s time over (a)'s: what the engine costs on top of decoding.
* Deltas only: the same side-by-side figures for a stream of nothing but small
  thinking deltas (the hot path) of 50 interleaved runs.
* Memory: ``--open-runs`` runs are each opened mid-thinking (``run_start`` and three
  small deltas, so a tail is pending) under ``tracemalloc``; bytes per run are
  reported beyond the tail's own strings, with and without the registry dict.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from stepstream.core.fold import RunFold
from stepstream.core.wire import (
    RunStart,
    RunStartPayload,
    ThinkingDelta,
    ThinkingDeltaPayload,
    decode_event,
    encode_event,
)
from stepstream.emitter.corpus import generate_events

Report = Callable[[str, float, str], None]


def _decode_only(blobs: list[bytes]) -> float:
    decode = decode_event
    started = time.perf_counter()
    for blob in blobs:
        decode(blob)
    return time.perf_counter() - started


def _decode_and_fold(blobs: list[bytes]) -> tuple[float, int]:
    decode = decode_event
    folds: dict[tuple[str, str], RunFold] = {}
    outputs = 0
    started = time.perf_counter()
    for i, blob in enumerate(blobs):
        event = decode(blob)
        key = (event.company_id, event.run_id)
        fold = folds.get(key)
        if fold is None:
            fold = folds[key] = RunFold(key[0], key[1])
        out = fold.push(event, i * 1e-4)
        if out is not None and out.state is not None:
            outputs += 1
    for fold in folds.values():
        fold.flush()
    return time.perf_counter() - started, outputs


def throughput(report: Report, *, seed: int, runs: int, rounds: int) -> None:
    events = generate_events(seed, runs=runs, companies=5)
    blobs = [encode_event(e) for e in events]
    deltas = sum(1 for e in events if isinstance(e, ThinkingDelta))
    del events
    report("events", len(blobs), "")
    report("thinking_delta_share", 100.0 * deltas / len(blobs), "%")
    report("mean_message_bytes", sum(map(len, blobs)) / len(blobs), "B")
    best_decode = best_fold = float("inf")
    durable = 0
    gc.collect()
    for _ in range(rounds):
        best_decode = min(best_decode, _decode_only(blobs))
        took, durable = _decode_and_fold(blobs)
        best_fold = min(best_fold, took)
    n = len(blobs)
    report("decode_only", n / best_decode, "events/s")
    report("decode_plus_fold", n / best_fold, "events/s")
    report("fold_cost_per_event", 1e6 * (best_fold - best_decode) / n, "us")
    report("ratio_fold_to_decode", best_fold / best_decode, "x")
    report("durable_outputs", durable, "")


def _delta_blobs(seed: int, runs: int, per_run: int) -> list[bytes]:
    """Only small thinking deltas (5-80 characters, mixed scripts), runs interleaved."""
    import random

    from stepstream.emitter.corpus import _Gen

    rng = random.Random(seed)
    gen = _Gen(rng)
    t0 = datetime(2026, 11, 29, 9, 0, tzinfo=timezone.utc)
    blobs = []
    for k in range(per_run):
        for r in range(runs):
            event = ThinkingDelta(
                v=1,
                event_id=f"d{r}-{k}",
                company_id="co-0",
                run_id=f"run-{r}",
                seq=k,
                ts=t0 + timedelta(microseconds=1000 * k + r),
                payload=ThinkingDeltaPayload(text=gen.text(5, 80)),
            )
            blobs.append(encode_event(event))
    return blobs


def deltas(report: Report, *, seed: int, rounds: int) -> None:
    blobs = _delta_blobs(seed, runs=50, per_run=2000)
    best_decode = best_fold = float("inf")
    for _ in range(rounds):
        best_decode = min(best_decode, _decode_only(blobs))
        best_fold = min(best_fold, _decode_and_fold(blobs)[0])
    n = len(blobs)
    report("deltas_only.events", n, "")
    report("deltas_only.decode_only", n / best_decode, "events/s")
    report("deltas_only.decode_plus_fold", n / best_fold, "events/s")
    report("deltas_only.fold_cost_per_event", 1e6 * (best_fold - best_decode) / n, "us")
    report("deltas_only.ratio_fold_to_decode", best_fold / best_decode, "x")


def _open_run_blobs(count: int) -> list[list[bytes]]:
    t0 = datetime(2026, 11, 29, 9, 0, tzinfo=timezone.utc)
    out = []
    for i in range(count):
        common: dict[str, Any] = {"v": 1, "company_id": f"co-{i % 5}", "run_id": f"run-{i:06d}"}
        msgs = [RunStart(event_id=f"e{i}-0", seq=0, ts=t0, payload=RunStartPayload(agent_name="bot"), **common)]
        for k in range(1, 4):
            text = f"thought {k} of run {i}"
            msgs.append(
                ThinkingDelta(
                    event_id=f"e{i}-{k}",
                    seq=k,
                    ts=t0 + timedelta(milliseconds=k),
                    payload=ThinkingDeltaPayload(text=text),
                    **common,
                )
            )
        out.append([encode_event(m) for m in msgs])
    return out


def memory(report: Report, *, open_runs: int) -> None:
    per_run = _open_run_blobs(open_runs)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    folds: dict[tuple[str, str], RunFold] = {}
    for blobs in per_run:
        for blob in blobs:
            event = decode_event(blob)
            key = (event.company_id, event.run_id)
            fold = folds.get(key)
            if fold is None:
                fold = RunFold(event.company_id, event.run_id)
                folds[(fold.company_id, fold.run_id)] = fold  # the fold's interned company id
            fold.push(event, 0.0)
        del event
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert all(f.pending for f in folds.values())
    tail = sum(sys.getsizeof(t) + 8 for f in folds.values() for t in f._tail)  # the strings + their list slots
    registry = sys.getsizeof(folds) + sum(sys.getsizeof(k) for k in folds)  # the caller's dict and key tuples
    report("open_runs", open_runs, "")
    report("tail_bytes_per_run", tail / open_runs, "B")
    report("held_beyond_tail_per_run", (held - tail) / open_runs, "B")
    report("held_beyond_tail_and_registry_per_run", (held - tail - registry) / open_runs, "B")


def run(report: Report, *, seed: int = 7, runs: int = 400, rounds: int = 5, open_runs: int = 10_000) -> None:
    """Run both measurements, reporting ``(name, value, unit)`` through ``report``."""
    throughput(report, seed=seed, runs=runs, rounds=rounds)
    deltas(report, seed=seed, rounds=rounds)
    memory(report, open_runs=open_runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_engine", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--runs", type=int, default=400, help="runs in the corpus [400]")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds, best kept [5]")
    parser.add_argument("--open-runs", type=int, default=10_000, help="runs held open for the memory figure [10000]")
    args = parser.parse_args(argv)

    def report(name: str, value: float, unit: str) -> None:
        shown = f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"
        print(f"engine.{name:<44} {shown:>14} {unit}")

    print(f"# stepstream engine benchmark (Python {sys.version.split()[0]})")
    run(report, seed=args.seed, runs=args.runs, rounds=args.rounds, open_runs=args.open_runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
