"""The constants of the capacity model (docs/operations.md, "Sizing"), measured here.

    PYTHONPATH=services python -m benchmarks.bench_capacity --mongo URL [--quick]

For each corpus (thinking-heavy, many-runs; small versions of ``bench_worker``'s), the
engine and the MongoDB sink ingest it (``ingest_file``: the worker's pipeline without
Kafka or faust, batches of up to 5,000 records) into a fresh database, with a pymongo
command listener counting what goes to the server. Printed per corpus:

* ``cpu_us_per_event``: CPU of this process (decode, fold, sink, driver) per event;
  the worker adds Kafka and faust on top (``bench_worker``'s ``CPU us/ev`` column);
* ``store_commands_per_event``, ``store_operations_per_event`` (statements and
  documents), ``store_bytes_per_event`` (BSON sent);
* ``events_per_s`` into this server, single process;
* ``server_ferretdb_cpu_us_per_event``, ``server_postgresql_cpu_us_per_event``: the
  server's own CPU per event, when it runs on this machine (``server_cpu``): beside
  ``cpu_us_per_event`` it says whether the client or the server is the cost.

Each corpus goes in twice, into fresh databases: once counted, once timed (the count
encodes every command, which would weigh on the CPU figure).

Then 2 against 1 on one shared store: ``ingest-file`` processes (the worker's engine
and sink, no Kafka) into one database, each and together; and with ``--broker``, real
``stepstream worker`` processes (one alone, then two in one consumer group) over a
preloaded many-runs topic into one database (``capacity.shared_workers.*``).

Then the model's arithmetic for 10k, 100k and 1M events/s (see docs/operations.md):
cores of workers, partitions, store operations/s and MB/s. It is arithmetic on these
measurements, printed with the constants it uses.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

from benchmarks.bench_sinks import _drop, _mongo_db_url, count_traffic
from benchmarks.server_cpu import ServerCpu
from stepstream.core.wire import encode_event
from stepstream.emitter.corpus import generate_events, generate_many_runs
from stepstream.ingest.offline import ingest_file

# Events per second one partition is given at most in the model: one worker's share of
# a partition must fit in one core with room (a partition is consumed by one worker).
PARTITION_EVENTS_PER_S = 5_000
CORE_SHARE = 0.7  # a worker core is planned at 70% busy


def _corpora(quick: bool) -> dict[str, list[Any]]:
    return {
        "thinking-heavy": generate_events(1, runs=30 if quick else 100, companies=5),
        "many-runs": generate_many_runs(1, runs=300 if quick else 1500, companies=8),
    }


async def measure(url: str, events: list[Any], tmp: Path) -> dict[str, float]:
    path = tmp / f"events-{uuid.uuid4().hex[:6]}.jsonl"
    path.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    clock: dict[str, float] = {}

    server = ServerCpu.find(url)

    async def run(db: str) -> None:
        try:
            before = server.seconds() if server else {}
            cpu, wall = time.process_time(), time.perf_counter()
            report = await ingest_file(path, db, db, progress=False)
            clock["cpu"], clock["wall"] = time.process_time() - cpu, time.perf_counter() - wall
            for part, seconds in (server.seconds() if server else {}).items():
                clock[f"server_{part}"] = seconds - before[part]
            assert report.rejected == 0, report
        finally:
            await _drop(db)

    # Twice, into fresh databases: the traffic pass encodes every command to count its
    # bytes, so the time and CPU come from the pass without the listener.
    traffic = await count_traffic(lambda: run(_mongo_db_url(url, f"bench_capacity_{uuid.uuid4().hex[:8]}")))
    await run(_mongo_db_url(url, f"bench_capacity_{uuid.uuid4().hex[:8]}"))
    n = len(events)
    return {
        "events": n,
        "events_per_s": n / clock["wall"],
        "cpu_us_per_event": clock["cpu"] / n * 1e6,
        "store_commands_per_event": traffic.total() / n,
        "store_operations_per_event": traffic.operations / n,
        "store_bytes_per_event": traffic.bytes / n,
        # The server's own CPU (when it runs on this machine): FerretDB, and PostgreSQL under it.
        **{f"{part}_cpu_us_per_event": seconds / n * 1e6 for part, seconds in clock.items() if part.startswith("server_")},
    }


def _ingest_process(events_file: Path, url: str, result: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "STEPSTREAM_DEEP_SINK": url}
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.ingest_file_timed", str(events_file), url, str(result)], env=env,
        stdout=subprocess.DEVNULL,
    )  # fmt: skip


def shared_store(url: str, runs: int, tmp: Path) -> dict[str, float]:
    """Events/s of one ``ingest-file`` process into a fresh database, then of two at
    once into one shared database (distinct runs: many-runs seeds 1 and 2): each, and
    together. On 2 cores with the server on them too, this shows contention more than
    scale."""
    files = []
    for seed in (1, 2):
        events = generate_many_runs(seed, runs=runs, companies=8)
        path = tmp / f"shared-{seed}.jsonl"
        path.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
        files.append((path, len(events)))
    figures: dict[str, float] = {}
    for label, count in (("one", 1), ("two", 2)):
        db = _mongo_db_url(url, f"bench_shared_{uuid.uuid4().hex[:8]}")
        try:
            procs = [(_ingest_process(p, db, tmp / f"{label}-{i}.json"), n, tmp / f"{label}-{i}.json")
                     for i, (p, n) in enumerate(files[:count])]  # fmt: skip
            for proc, _, _ in procs:
                assert proc.wait() == 0
            seconds = []
            for i, (_, n, result) in enumerate(procs):
                timed = msgspec.json.decode(result.read_bytes())
                assert timed["exit"] == 0, timed
                figures[f"{label}.process_{i}_events_per_s"] = n / timed["seconds"]
                seconds.append(timed["seconds"])
            # Timed inside each process (interpreter start and imports left out); together:
            # every event over the longest of the processes' times.
            figures[f"{label}.together_events_per_s"] = sum(n for _, n, _ in procs) / max(seconds)
        finally:
            asyncio.run(_drop(db))
    return figures


def _events(worker: Any) -> float:
    """The worker's applied events; its ``/metrics`` can take seconds on a loaded machine."""
    for _ in range(5):
        try:
            return worker.events()
        except OSError:
            time.sleep(0.5)
    return worker.events()


def shared_workers(broker: str, url: str, runs: int, budget: float, tmp: Path) -> dict[str, float]:
    """Events/s of real ``stepstream worker`` processes on one shared store: one alone
    on a fresh database, then two in one consumer group (the topic's partitions split
    between them) on another, each and together, over the same ``budget`` seconds
    from the first applied event (the topic is filled once the group is ready). On 2 cores with the broker and the server on
    them too, this shows contention more than scale."""
    from benchmarks.bench_worker import PARTITIONS, many_runs, mongo_url, new_topic, preload
    from benchmarks.worker_process import Worker, metric_sum

    corpus = many_runs(runs)
    blobs = corpus.blobs()
    figures: dict[str, float] = {}
    for label, count in (("one", 1), ("two", 2)):
        topic = asyncio.run(new_topic(broker, f"bench-shared-{label}"))
        db = mongo_url(url, f"bench_shared_{uuid.uuid4().hex[:8]}")
        group = f"bench-shared-{uuid.uuid4().hex[:6]}"
        workers = [Worker(broker, topic, tmp, f"shared-{label}-{i}", steps_sink=db, partitions=PARTITIONS,
                          env={"STEPSTREAM_APP_ID": group}) for i in range(count)]  # fmt: skip
        try:
            for worker in workers:
                worker.wait_up()
            for worker in workers:
                if not worker.wait_ready(120):
                    raise worker.failure("not ready after 120 s")
            # The events go in once the group has settled: a member joining while the
            # others apply makes a rebalance, and the moved partitions are read again from
            # their last commit (duplicates skipped, not applied events).
            asyncio.run(preload(broker, topic, blobs))
            # From the first sample where every worker has applied events (startup, the
            # group's join and each one's first batch left out) until every event is
            # applied, or the budget passed.
            deadline = time.perf_counter() + 300 + budget
            first: list[tuple[float, float]] = []
            while True:
                now = [(time.perf_counter(), _events(w)) for w in workers]
                if not first and all(n > 0 for _, n in now):
                    first = now
                done = sum(n for _, n in now) >= len(corpus.events)
                if first and (done or now[-1][0] - first[0][0] >= budget):
                    last = now
                    break
                if time.perf_counter() > deadline:
                    raise workers[0].failure("the events were not applied in time")
                time.sleep(0.2)
            total = 0.0
            for i, ((t0, n0), (t1, n1)) in enumerate(zip(first, last, strict=True)):
                figures[f"{label}.worker_{i}_events_per_s"] = (n1 - n0) / (t1 - t0)
                total += n1 - n0
            figures[f"{label}.together_events_per_s"] = total / (last[-1][0] - first[0][0])
            figures[f"{label}.events_left_unapplied"] = len(corpus.events) - sum(n for _, n in last)
            figures[f"{label}.duplicates_skipped"] = sum(
                metric_sum(w.metrics(), "stepstream_duplicate_events_total") for w in workers
            )
        finally:
            for worker in workers:
                worker.stop()
            asyncio.run(_drop(db))
    return figures


def model(figures: dict[str, float], worker_cpu_us: float | None) -> list[str]:
    """The sizing arithmetic for one corpus (docs/operations.md)."""
    cpu = worker_cpu_us if worker_cpu_us is not None else figures["cpu_us_per_event"]
    per_core = CORE_SHARE * 1e6 / cpu
    lines = [f"  per worker core at {CORE_SHARE:.0%}: {per_core:,.0f} events/s (CPU {cpu:.1f} us/event)"]
    for rate in (10_000, 100_000, 1_000_000):
        cores = math.ceil(rate / per_core)
        partitions = max(cores, math.ceil(rate / PARTITION_EVENTS_PER_S))
        ops = rate * figures["store_operations_per_event"]
        commands = rate * figures["store_commands_per_event"]
        mb = rate * figures["store_bytes_per_event"] / 1e6
        lines.append(
            f"  {rate:>9,} ev/s: {cores:>4} worker cores, >= {partitions:>4} partitions, store "
            f"{ops:>11,.0f} write ops/s in {commands:>9,.0f} commands/s, {mb:>7.1f} MB/s"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mongo", default=os.environ.get("STEPSTREAM_TEST_MONGO_URL"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--broker", default=os.environ.get("STEPSTREAM_TEST_BROKER"),
                        help="bootstrap host:port: 2 real workers against 1 on the shared store")  # fmt: skip
    parser.add_argument("--worker-cpu-us", type=float, action="append", default=[],
                        help="the worker's CPU us/event per corpus, in corpus order (bench_worker)")  # fmt: skip
    args = parser.parse_args(argv)
    if not args.mongo:
        print("capacity: skipped (no --mongo / STEPSTREAM_TEST_MONGO_URL)", file=sys.stderr)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-capacity-") as tmp:
        for i, (name, events) in enumerate(_corpora(args.quick).items()):
            figures = asyncio.run(measure(args.mongo, events, Path(tmp)))
            for key, value in figures.items():
                print(f"capacity.{name}.{key} {value:.3f}")
            worker_cpu = args.worker_cpu_us[i] if i < len(args.worker_cpu_us) else None
            print("\n".join(model(figures, worker_cpu)))
        shared = shared_store(args.mongo, 150 if args.quick else 600, Path(tmp))
        for key, value in shared.items():
            print(f"capacity.shared_store.{key} {value:.0f}")
        print(f"capacity.shared_store.two_over_one "
              f"{shared['two.together_events_per_s'] / shared['one.together_events_per_s']:.2f} (2 processes, one store, "
              f"{os.cpu_count()} cores shared with the server: contention more than scale)")  # fmt: skip
        if args.broker:
            workers = shared_workers(args.broker, args.mongo, 1_500 if args.quick else 4_000,
                                     10.0 if args.quick else 20.0, Path(tmp))  # fmt: skip
            for key, value in workers.items():
                print(f"capacity.shared_workers.{key} {value:.0f}")
            print(f"capacity.shared_workers.two_over_one "
                  f"{workers['two.together_events_per_s'] / workers['one.together_events_per_s']:.2f} (2 stepstream "
                  f"worker processes in one group, one store, {os.cpu_count()} cores shared with the broker and the "
                  "server: contention more than scale)")  # fmt: skip
        else:
            print("capacity.shared_workers: skipped (no --broker / STEPSTREAM_TEST_BROKER)", file=sys.stderr)
    print(f"(model: a worker core planned at {CORE_SHARE:.0%}, at most {PARTITION_EVENTS_PER_S:,} events/s per "
          "partition; arithmetic on the figures above, not a measurement at those rates)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
