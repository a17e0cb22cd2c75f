"""Memory bound of the worker on a real broker: a backlog of cap-sized bodies.

    PYTHONPATH=services python -m benchmarks.bench_memory --broker HOST:PORT [--quick] [--unbounded]

A topic is pre-loaded with thousands of events whose bodies are all at their caps
(``core.limits.Limits``): per cycle of a run, a thinking run past the reasoning cap
(9 deltas of 8,192 characters), a tool call whose arguments' JSON text is at the
arguments cap and its result with an output at the output cap. The bodies' text
rotates over four alphabets, one of them ASCII with a single emoji, which CPython
stores at 4 bytes per character (the worst a body can weigh in memory per byte of
its message). Then one ``stepstream worker`` (SQLite sink, default settings) starts
on the backlog and consumes it whole.

The figure is the peak resident memory of the worker process plus that of each of
its descendants (the SQLite writer processes), each its own ``VmHWM`` from
``/proc`` (so at least the peak of their sum), beside the largest sum of ``VmRSS``
sampled every 50 ms. PASS when the peak is under 1 GiB (docs/worker.md, "Memory").

``--widest`` makes every body ASCII with one emoji (the worst case: 4 bytes in memory
per byte of message). ``--unbounded`` also runs the same backlog with ``STEPSTREAM_BATCH_BYTES`` so large
that only the row bound is left (the worker before batches had a byte bound), for
comparison; it is not part of ``make bench`` (it needs several GiB).

Prints a table and one ``BENCH_JSON {...}`` line. Exit status 1 on FAIL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import msgspec

from stepstream.config import load_settings
from stepstream.core.limits import Limits
from stepstream.core.wire import (
    RunEnd,
    RunEndPayload,
    RunStart,
    RunStartPayload,
    ThinkingDelta,
    ThinkingDeltaPayload,
    ToolCall,
    ToolCallPayload,
    ToolResult,
    ToolResultPayload,
    encode_event,
    partition_key,
)

from benchmarks.bench_worker import PARTITIONS, new_topic, preload
from benchmarks.worker_process import Worker, WorkerFailed, tree

LIMIT_MIB = 1024
DELTA_CHARS = 8192
DELTAS = 9  # 73,728 characters: past the reasoning cap, so the last delta is clipped
# What a body's characters are made of: each byte of a message weighs 1 to 4 bytes in memory.
ALPHABETS = ("a", "\u00e9", "\u4e2d", "a\U0001f600")  # ASCII, Latin-1, CJK, ASCII with one emoji
WIDEST = ("a\U0001f600",)


class Plan(msgspec.Struct, frozen=True):
    runs: int
    cycles: int  # per run; one cycle is 11 events
    timeout: float


FULL = Plan(runs=64, cycles=20, timeout=900.0)  # 14,208 events, 370 MiB of messages
QUICK = Plan(runs=16, cycles=16, timeout=300.0)  # 2,848 events, 74 MiB


def _text(alphabet: str, chars: int, tag: str) -> str:
    """``chars`` characters of ``alphabet`` (a two-character alphabet: its second
    character once, at the end), starting with ``tag``."""
    if len(alphabet) == 1:
        return (tag + alphabet * chars)[:chars]
    return (tag + alphabet[0] * chars)[: chars - 1] + alphabet[1]


def backlog(plan: Plan, limits: Limits, alphabets: tuple[str, ...] = ALPHABETS) -> list[tuple[bytes, bytes]]:
    """``(key, value)`` of every event, the runs interleaved cycle by cycle."""
    t0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
    out: list[tuple[bytes, bytes]] = []
    seqs = [0] * plan.runs

    def add(r: int, cls: Any, payload: Any) -> None:
        company, run = f"big{r % 4}", f"cap-{r}"
        seq = seqs[r]
        seqs[r] += 1
        event = cls(v=1, event_id=f"{run}-{seq}", company_id=company, run_id=run, seq=seq,
                    ts=t0 + timedelta(milliseconds=seq), payload=payload)  # fmt: skip
        out.append((partition_key(company, run), encode_event(event)))

    for r in range(plan.runs):
        add(r, RunStart, RunStartPayload(agent_name="cap-sized"))
    wrapper = len('{"query":""}')
    for c in range(plan.cycles):
        for r in range(plan.runs):
            alphabet = alphabets[(r + c) % len(alphabets)]
            for d in range(DELTAS):
                add(r, ThinkingDelta, ThinkingDeltaPayload(text=_text(alphabet, DELTA_CHARS, f"{c}.{d} ")))
            arguments = {"query": _text(alphabet, limits.arguments_chars - wrapper, f"{c} ")}
            add(r, ToolCall, ToolCallPayload(call_id=f"c{c}", tool="search", arguments=arguments))
            add(r, ToolResult, ToolResultPayload(call_id=f"c{c}", output=_text(alphabet, limits.output_chars, f"{c} ")))
    for r in range(plan.runs):
        add(r, RunEnd, RunEndPayload(status="completed"))
    return out


def _status_kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_worker(broker: str, topic: str, total: int, tmp: Path, name: str, timeout: float,
               env: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """One worker over the backlog until every event is applied; its memory figures."""
    worker = Worker(broker, topic, tmp, name, steps_sink=f"sqlite:///{tmp / (name + '.db')}", partitions=PARTITIONS,
                    env=env)  # fmt: skip
    try:
        worker.wait_up()
        started = time.perf_counter()
        sampled_mib = 0.0
        hwm: dict[int, int] = {}
        applied = 0.0
        next_events = 0.0
        while True:
            if worker.proc.poll() is not None:
                raise worker.failure("exited during the backlog")
            pids = tree(worker.pid)
            sampled_mib = max(sampled_mib, sum(_status_kib(p, "VmRSS") for p in pids) / 1024)
            for p in pids:  # a child's peak is kept even if it is gone by the end
                hwm[p] = max(hwm.get(p, 0), _status_kib(p, "VmHWM"))
            now = time.perf_counter()
            if now >= next_events:
                next_events = now + 0.5
                applied = worker.events()
                if applied >= total:
                    break
            if now - started > timeout:
                raise worker.failure(f"applied {applied:.0f} of {total} events in {timeout:.0f}s")
            time.sleep(0.05)
        seconds = time.perf_counter() - started
        for p in tree(worker.pid):
            hwm[p] = max(hwm.get(p, 0), _status_kib(p, "VmHWM"))
        worker_mib = hwm.get(worker.pid, 0) / 1024
        children_mib = sum(v for p, v in hwm.items() if p != worker.pid) / 1024
        return {"applied": applied, "seconds": seconds, "peak_rss_mib": worker_mib + children_mib,
                "worker_mib": worker_mib, "writers_mib": children_mib, "writers": len(hwm) - 1,
                "sampled_rss_mib": sampled_mib}  # fmt: skip
    except WorkerFailed as exc:
        return {"error": str(exc)}
    finally:
        worker.stop()


async def _run(args: argparse.Namespace, plan: Plan, tmp: Path) -> dict[str, Any]:
    limits = Limits()
    blobs = backlog(plan, limits, WIDEST if args.widest else ALPHABETS)
    size = sum(len(value) for _, value in blobs)
    topic = await new_topic(args.broker, "bench-memory")
    started = time.perf_counter()
    await preload(args.broker, topic, blobs)
    settings = load_settings(environ={})
    print(f"memory: {len(blobs):,} events, {size / 2**20:,.0f} MiB of messages, preloaded in "
          f"{time.perf_counter() - started:.1f}s", file=sys.stderr, flush=True)  # fmt: skip
    result: dict[str, Any] = {
        "mode": ("quick" if args.quick else "full") + (", widest" if args.widest else ""),
        "events": len(blobs),
        "message_mib": size / 2**20,
        "max_message_bytes": max(len(value) for _, value in blobs),
        "batch_bytes": settings.batch_bytes,
        "batch_records": settings.batch_records,
        "limit_mib": LIMIT_MIB,
        "cpus": os.cpu_count(),
    }
    result["bounded"] = run_worker(args.broker, topic, len(blobs), tmp, "memory-bounded", plan.timeout)
    if args.unbounded:
        env = {"STEPSTREAM_BATCH_BYTES": str(2**62)}
        result["unbounded"] = run_worker(args.broker, topic, len(blobs), tmp, "memory-unbounded", plan.timeout, env)
    return result


def _line(label: str, figures: dict[str, Any], verdict: str) -> str:
    if "error" in figures:
        return f"{label:<34}n/a: {figures['error'].splitlines()[0][:100]}"
    return (f"{label:<34}{figures['peak_rss_mib']:>8,.0f} MiB  (worker {figures['worker_mib']:,.0f} + "
            f"{figures['writers']} writer(s) {figures['writers_mib']:,.0f}; sampled sum {figures['sampled_rss_mib']:,.0f})"
            f"  {figures['applied']:,.0f} events in {figures['seconds']:.1f}s  {verdict}")  # fmt: skip


def report(result: dict[str, Any]) -> str:
    bounded = result["bounded"]
    ok = "error" not in bounded and bounded["peak_rss_mib"] < LIMIT_MIB
    lines = [
        f"memory bound ({result['mode']}): a backlog of {result['events']:,} events with bodies at their caps, "
        f"{result['message_mib']:,.0f} MiB of messages (largest {result['max_message_bytes']:,} B), one worker -> SQLite",
        f"peak RSS of the worker and its writer processes (each its VmHWM), target < {LIMIT_MIB} MiB",
        _line(f"batch_bytes {result['batch_bytes'] / 2**20:g} MiB (default)", bounded,
              "PASS" if ok else "FAIL"),  # fmt: skip
    ]
    if "unbounded" in result:
        lines.append(_line("no byte bound (rows only)", result["unbounded"], "(comparison)"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_memory")
    parser.add_argument("--broker", default=os.environ.get("STEPSTREAM_TEST_BROKER"), required=False)
    parser.add_argument("--quick", action="store_true", help=f"a smaller backlog ({QUICK.runs * (QUICK.cycles * 11 + 2):,} events)")
    parser.add_argument("--widest", action="store_true", help="every body at 4 bytes a character in memory")
    parser.add_argument("--unbounded", action="store_true", help="also run with no byte bound, for comparison")
    args = parser.parse_args(argv)
    if not args.broker:
        parser.error("--broker (or STEPSTREAM_TEST_BROKER) is required")
    plan = QUICK if args.quick else FULL
    tmp = Path(tempfile.mkdtemp(prefix="stepstream-bench-memory-"))
    try:
        result = asyncio.run(_run(args, plan, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(report(result), flush=True)
    print("BENCH_JSON " + json.dumps(result), flush=True)
    bounded = result["bounded"]
    return 0 if "error" not in bounded and bounded["peak_rss_mib"] < LIMIT_MIB else 1


if __name__ == "__main__":
    raise SystemExit(main())
