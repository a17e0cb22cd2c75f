"""Worker benchmark on a real broker: ``stepstream worker`` processes beside their
ceilings, over the same pre-loaded topics, in one run. On a shared machine the
ratios are the headline, not the absolute rates.

    PYTHONPATH=services python -m benchmarks.bench_worker --broker HOST:PORT [--mongo URL] [--quick]

Two corpora, each pre-loaded once on its own topic (keys ``{company}/{run}``):

* **thinking-heavy**: ``generate_events`` (200 runs per seed over 5 companies, most
  events short thinking deltas in bursts, tool results with list outputs).
* **many-runs**: ``generate_many_runs``: 16,000 distinct short runs over 8
  companies, 400 agents at once, each ending its run and starting the next.

Per corpus, over the same topic: the bare aiokafka ``getmany`` + msgspec decode loop,
faust's no-op agent (``faust_noop``), ``stepstream ingest-file`` of the same events
into SQLite (``ingest_file_timed``), and the worker into SQLite (the sink's default
durability), into SQLite with ``?synchronous=normal`` (durability off; ``n/a`` when
the worker refuses the URL) and into MongoDB (steps and deep). Each worker figure is
events/s from its first durable batch (startup and group join excluded), its ratios
to the three ceilings, CPU microseconds per event of the whole worker process and the
share of wall time it was off CPU (both from ``/proc``), and its peak RSS.

Per corpus too, the write path without Kafka (``worker_profile``: the worker's
pipeline over the corpus into SQLite): CPU microseconds per event of the worker
process and of each SQLite writer process, the rows each store upserts per event, the
bytes of the requests to the writers and the bytes the writers wrote (the WAL and its
checkpoints): what "fewer rows and bytes per event" is measured by.

Then, per corpus, p99 event-to-durable latency while producing at half the worker's
measured SQLite rate, split into thinking deltas and every other event
(``durability_probe``), beside the worker's own ``stepstream_ingest_lag_seconds``;
and once, the worker's peak RSS with 10,000 runs open, each mid-thinking.

Prints a table and one ``BENCH_JSON {...}`` line with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

import stepstream
from stepstream.config import load_settings
from stepstream.core.wire import (
    Event,
    RunEnd,
    RunEndPayload,
    RunStart,
    RunStartPayload,
    ThinkingDelta,
    ThinkingDeltaPayload,
    decode_event,
    encode_event,
    partition_key,
)
from stepstream.emitter.corpus import generate_events, generate_many_runs
from stepstream.kafka.topics import ensure_topics

from benchmarks.durability_probe import DurabilityProbe
from benchmarks.worker_process import (
    Throughput,
    Worker,
    WorkerFailed,
    histogram_quantile,
    metric_sum,
    peak_rss_mib,
    runqueue_seconds,
)
from benchmarks.worker_report import finite, report

PARTITIONS = 4
LAG = "stepstream_ingest_lag_seconds"


class Plan(msgspec.Struct, frozen=True):
    """Sizes and time budgets of one run (``--quick`` or full)."""

    thinking_events: int  # at least this many events in the thinking-heavy corpus
    many_runs: int  # distinct runs in the many-runs corpus
    noop_events: int  # faust's no-op agent reads at most this many (it is slow)
    worker_budget: float  # seconds of measurement per worker into SQLite, at most
    mongo_budget: float  # the same into MongoDB (FerretDB is slow)
    latency_seconds: float
    open_runs: int
    rounds: int  # the ceilings and the SQLite workers run this many times, interleaved; the best counts
    mongo_corpora: tuple[str, ...]  # the corpora the MongoDB worker runs on


FULL = Plan(200_000, 16_000, 100_000, 60.0, 30.0, 15.0, 10_000, rounds=2, mongo_corpora=("thinking-heavy", "many-runs"))
QUICK = Plan(40_000, 2_000, 10_000, 10.0, 4.0, 4.0, 2_000, rounds=1, mongo_corpora=("thinking-heavy", "many-runs"))


# -- corpora ------------------------------------------------------------------------


class Corpus(msgspec.Struct):
    name: str
    events: list[Any]
    topic: str = ""

    @property
    def runs(self) -> int:
        return len({(e.company_id, e.run_id) for e in self.events})

    def blobs(self) -> list[tuple[bytes, bytes]]:
        return [(partition_key(e.company_id, e.run_id), encode_event(e)) for e in self.events]

    def describe(self) -> dict[str, Any]:
        deltas = sum(1 for e in self.events if _is_delta(e))
        size = sum(len(encode_event(e)) for e in self.events)
        return {
            "events": len(self.events),
            "runs": self.runs,
            "delta_share": deltas / len(self.events),
            "mean_bytes": size / len(self.events),
        }


def _is_delta(event: Event) -> bool:
    return event.__struct_config__.tag == "thinking_delta"


def thinking_heavy(at_least: int) -> Corpus:
    events: list[Any] = []
    seed = 1
    while len(events) < at_least:
        events.extend(generate_events(seed, runs=200, companies=5))
        seed += 1
    return Corpus("thinking-heavy", events)


def many_runs(runs: int) -> Corpus:
    return Corpus("many-runs", generate_many_runs(1, runs=runs, companies=8))


def open_runs_corpus(count: int, deltas: int = 3) -> list[tuple[bytes, bytes]]:
    """``count`` runs, each a ``run_start`` and ``deltas`` thinking deltas (left open)."""
    start = datetime(2026, 11, 29, tzinfo=timezone.utc)
    out = []
    for i in range(count):
        company, run = f"mem{i % 10}", f"open-{i}"
        key = partition_key(company, run)
        common = dict(v=1, company_id=company, run_id=run)
        out.append((key, encode_event(RunStart(event_id=f"{run}-s", seq=0, ts=start, payload=RunStartPayload(agent_name="a"), **common))))  # fmt: skip
        for d in range(deltas):
            text = ThinkingDeltaPayload(text="hmm, let me think about that. ")
            ts = start + timedelta(milliseconds=d)
            out.append((key, encode_event(ThinkingDelta(event_id=f"{run}-{d}", seq=d + 1, ts=ts, payload=text, **common))))  # fmt: skip
    return out


# -- the broker side ------------------------------------------------------------------


async def new_topic(broker: str, prefix: str) -> str:
    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    await ensure_topics(load_settings({"broker": broker, "topic": topic, "partitions": PARTITIONS}, environ={}))
    return topic


async def preload(broker: str, topic: str, blobs: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=broker, linger_ms=20, max_batch_size=1_048_576, max_request_size=2_000_000)  # fmt: skip
    await producer.start()
    try:
        futures = [await producer.send(topic, value, key=key) for key, value in blobs]
        for fut in futures:
            await fut
    finally:
        await producer.stop()


async def bare_loop(broker: str, topic: str, total: int) -> Throughput:
    """aiokafka ``getmany`` + msgspec decode over the whole topic, in this process."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=broker, group_id=f"bare-{uuid.uuid4().hex[:6]}", auto_offset_reset="earliest",
        enable_auto_commit=False, max_partition_fetch_bytes=4_194_304,
    )  # fmt: skip
    await consumer.start()
    try:
        seen = 0
        started = cpu0 = queued0 = 0.0
        while seen < total:
            batch = await consumer.getmany(timeout_ms=1000, max_records=5000)
            if not seen and batch:
                started, cpu0, queued0 = time.perf_counter(), time.process_time(), runqueue_seconds(os.getpid())
            for records in batch.values():
                for record in records:
                    decode_event(record.value)
                seen += len(records)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu0
        return Throughput(seen, seconds, cpu, float("nan"), runqueue_seconds(os.getpid()) - queued0)
    finally:
        await consumer.stop()


def _child(module: str, *args: str, timeout: float) -> dict[str, Any]:
    """Run ``python -m module ARGS... RESULT`` and read the JSON it leaves in RESULT."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        result = Path(fh.name)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", module, *args, str(result)], timeout=timeout, capture_output=True, check=False
        )
        text = result.read_text()
        if not text:
            raise RuntimeError(f"{module} left no result (exit {proc.returncode}): {proc.stderr[-1500:].decode()}")
        return json.loads(text)
    finally:
        result.unlink(missing_ok=True)


def faust_noop(broker: str, topic: str, count: int) -> Throughput:
    data = _child("benchmarks.faust_noop", broker, topic, str(count), timeout=600)
    return Throughput(count, data["seconds"], data["cpu"], float("nan"), data["runqueue"])


def ingest_file(corpus: Corpus, tmp: Path) -> Throughput:
    path = tmp / f"{corpus.name}.jsonl"
    if not path.exists():
        with path.open("wb") as fh:
            for event in corpus.events:
                fh.write(encode_event(event) + b"\n")
    db = tmp / f"{corpus.name}-ingest-file-{uuid.uuid4().hex[:6]}.db"
    data = _child("benchmarks.ingest_file_timed", str(path), f"sqlite:///{db}", timeout=900)
    if data["exit"] != 0:
        raise RuntimeError(f"ingest-file exited {data['exit']}")
    return Throughput(len(corpus.events), data["seconds"], data["cpu"], float("nan"), data["runqueue"])


def write_path(corpus: Corpus, tmp: Path) -> dict[str, Any]:
    """The worker's pipeline over the corpus into SQLite without Kafka
    (``benchmarks.worker_profile``): CPU per process, rows and bytes per event."""
    path = tmp / f"{corpus.name}.msgpack"
    path.write_bytes(msgspec.msgpack.encode([encode_event(e) for e in corpus.events]))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.worker_profile", str(path)], capture_output=True,
                          timeout=900, check=False)  # fmt: skip
    if proc.returncode != 0:
        return {"error": proc.stderr.decode()[-800:]}
    return json.loads(proc.stdout)


# -- worker runs ----------------------------------------------------------------------


class Sink(msgspec.Struct, frozen=True):
    label: str
    key: str
    mongo: bool = False
    query: str = ""


SINKS = (
    Sink("worker -> SQLite (default durability)", "sqlite"),
    Sink("worker -> SQLite (synchronous=normal)", "sqlite_sync_off", query="?synchronous=normal"),
    Sink("worker -> MongoDB (steps + deep)", "mongodb", mongo=True),
)


def mongo_url(base: str, database: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, f"/{database}", parts.query, ""))


async def drop_mongo(url: str) -> None:
    from pymongo import AsyncMongoClient

    client: AsyncMongoClient = AsyncMongoClient(url)
    try:
        await client.drop_database(client.get_default_database().name)
    finally:
        await client.close()


async def worker_run(args: argparse.Namespace, plan: Plan, corpus: Corpus, sink: Sink, tmp: Path) -> Throughput | str:
    """The worker over the corpus' topic; a string says why there is no figure."""
    name = f"{corpus.name}-{sink.key}-{uuid.uuid4().hex[:6]}"  # a fresh store: a reused one makes every event a duplicate
    if sink.mongo:
        if not args.mongo:
            return "n/a: no --mongo / STEPSTREAM_TEST_MONGO_URL"
        if corpus.name not in plan.mongo_corpora:
            return "n/a: skipped in this mode (one batch takes seconds on FerretDB)"
        url = mongo_url(args.mongo, f"bench_{sink.key}_{uuid.uuid4().hex[:8]}")
    else:
        url = f"sqlite:///{tmp / (name + '.db')}{sink.query}"
    worker = Worker(args.broker, corpus.topic, tmp, name, steps_sink=url, partitions=PARTITIONS)
    try:
        worker.wait_up()
        budget = plan.mongo_budget if sink.mongo else plan.worker_budget
        return worker.measure(len(corpus.events), budget, timeout=budget + 300)
    except WorkerFailed as exc:
        return f"n/a: {exc}"
    finally:
        worker.stop()
        if sink.mongo:
            await drop_mongo(url)


# -- latency at half the maximum rate -------------------------------------------------


def whole_runs(events: list[Any], n: int) -> list[Any]:
    """The first ``n`` events, then the rest of every run they started (in corpus
    order), so no run is cut off mid-thinking by the end of the window: a cut-off
    tail would wait for the idle flush, which is what a dead agent does, not load."""
    head = events[:n]
    started = {(e.company_id, e.run_id) for e in head}
    return head + [e for e in events[n:] if (e.company_id, e.run_id) in started]


async def latency_run(args: argparse.Namespace, plan: Plan, corpus: Corpus, rate: float, tmp: Path) -> dict[str, Any]:
    """Produce the corpus (restamped at send time) at ``rate`` events/s to a fresh
    topic while one worker writes it to SQLite; per-event latency from the store."""
    settings = load_settings(environ=os.environ)
    topic = await new_topic(args.broker, f"bench-lat-{corpus.name}")
    db = tmp / f"{corpus.name}-latency.db"
    worker = Worker(args.broker, topic, tmp, f"{corpus.name}-latency", steps_sink=f"sqlite:///{db}", partitions=PARTITIONS)  # fmt: skip
    producer = AIOKafkaProducer(bootstrap_servers=args.broker, linger_ms=2)
    probe = DurabilityProbe(db)
    try:
        worker.wait_up()
        await producer.start()
        # Warm-up: one short run on every partition, so the group is joined and the
        # stores are open before the clock starts.
        now = datetime.now(timezone.utc)
        for p in range(PARTITIONS):
            common = dict(v=1, company_id="warm", run_id=f"warm-{p}", ts=now)
            key = partition_key("warm", f"warm-{p}")
            start = RunStart(event_id=f"w{p}s", seq=0, payload=RunStartPayload(agent_name="warm"), **common)
            end = RunEnd(event_id=f"w{p}e", seq=1, payload=RunEndPayload(status="completed"), **common)
            for event in (start, end):
                await producer.send(topic, encode_event(event), key=key, partition=p)
        await producer.flush()
        warm = worker.wait_events(2 * PARTITIONS, timeout=120)
        if warm < 2 * PARTITIONS:
            raise worker.failure(f"warm-up: {warm:.0f} of {2 * PARTITIONS} events applied")
        worker.wait_ready(timeout=30)

        events = whole_runs(corpus.events, max(1, int(rate * plan.latency_seconds)))
        stop = asyncio.Event()
        poller = asyncio.create_task(probe.run(stop))
        started = time.perf_counter()
        sent = 0
        while sent < len(events):
            # Every event due by now goes out with one timestamp; then sleep to the next.
            due = min(len(events), int((time.perf_counter() - started) * rate) + 1)
            stamp = datetime.now(timezone.utc)
            at = stamp.timestamp()
            for event in events[sent:due]:
                value = encode_event(msgspec.structs.replace(event, ts=stamp))
                await producer.send(topic, value, key=partition_key(event.company_id, event.run_id))
                probe.sent(event.company_id, event.run_id, event.seq, _is_delta(event), at)
            sent = due
            await asyncio.sleep(max(0.0, started + sent / rate - time.perf_counter()))
        await producer.flush()
        sent_rate = len(events) / (time.perf_counter() - started)
        stop.set()
        await poller
        await probe.settle(timeout=settings.idle_flush_seconds + 30)
        text = worker.metrics()
        deltas, others = probe.summary(True), probe.summary(False)
        return {
            "target_rate": rate,
            "sent_rate": sent_rate,
            "events": len(events),
            "poll_seconds": 0.05,
            "polls": probe.polls,
            "deltas": msgspec.to_builtins(deltas),
            "others": msgspec.to_builtins(others),
            "worker_histogram": {
                "p50": histogram_quantile(text, LAG, 0.5),
                "p99": histogram_quantile(text, LAG, 0.99),
                "p99_deltas": histogram_quantile(text, LAG, 0.99, kind="thinking_delta"),
                "p99_others": histogram_quantile(text, LAG, 0.99, kind="other"),
            },
            "targets": {"deltas": settings.idle_flush_seconds + 1.0, "others": 1.0},
            "pass": deltas.p99 <= settings.idle_flush_seconds + 1.0 and others.p99 <= 1.0,
        }
    except WorkerFailed as exc:
        return {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - one failed part must not lose the rest of the run
        return {"error": f"the benchmark failed: {exc!r}"}
    finally:
        probe.close()
        await producer.stop()
        worker.stop()


async def memory_run(args: argparse.Namespace, plan: Plan, tmp: Path) -> dict[str, Any]:
    topic = await new_topic(args.broker, "bench-mem")
    blobs = open_runs_corpus(plan.open_runs)
    await preload(args.broker, topic, blobs)
    worker = Worker(args.broker, topic, tmp, "memory", steps_sink=f"sqlite:///{tmp / 'memory.db'}", partitions=PARTITIONS)  # fmt: skip
    try:
        worker.wait_up()
        applied = worker.wait_events(len(blobs), timeout=300)
        gauge = metric_sum(worker.metrics(), "stepstream_open_runs")
        return {"open_runs": plan.open_runs, "applied": applied, "open_runs_gauge": gauge,
                "peak_rss_mib": peak_rss_mib(worker.pid), "target_mib": 400}  # fmt: skip
    except WorkerFailed as exc:
        return {"open_runs": plan.open_runs, "error": str(exc)}
    finally:
        worker.stop()


# -- the run --------------------------------------------------------------------------


def _note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _figures(t: Throughput) -> dict[str, float]:
    return {"events": t.events, "seconds": t.seconds, "rate": t.rate, "cpu_us_per_event": t.cpu_us_per_event,
            "off_cpu_share": t.off_cpu_share, "runqueue_share": t.runqueue_share,
            "peak_rss_mib": t.peak_rss_mib, "duplicates": t.duplicates}  # fmt: skip


async def corpus_run(args: argparse.Namespace, plan: Plan, corpus: Corpus, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = corpus.describe()
    corpus.topic = await new_topic(args.broker, f"bench-{corpus.name}")
    started = time.perf_counter()
    await preload(args.broker, corpus.topic, corpus.blobs())
    _note(f"{corpus.name}: {out['events']:,} events, {out['runs']:,} runs, {out['delta_share']:.0%} thinking deltas, "
          f"{out['mean_bytes']:.0f} B mean; preloaded in {time.perf_counter() - started:.1f}s")  # fmt: skip

    ceilings: dict[str, list[Throughput]] = {"bare": [], "faust_noop": [], "ingest_file": []}
    runs: dict[str, list[Throughput]] = {sink.key: [] for sink in SINKS}
    refused: dict[str, str] = {}
    for round_ in range(plan.rounds):
        # Interleaved rounds: a burst of load from the machine's other users hits one
        # round of every path rather than every round of one path.
        phase = time.perf_counter()
        ceilings["bare"].append(await bare_loop(args.broker, corpus.topic, len(corpus.events)))
        ceilings["faust_noop"].append(faust_noop(args.broker, corpus.topic, min(plan.noop_events, len(corpus.events))))
        ceilings["ingest_file"].append(ingest_file(corpus, tmp))
        _note(f"{corpus.name} round {round_ + 1}: ceilings " + ", ".join(f"{k} {v[-1].rate:,.0f}/s" for k, v in ceilings.items())
              + f" ({time.perf_counter() - phase:.0f}s)")  # fmt: skip
        for sink in SINKS:
            if sink.key in refused or (sink.mongo and round_ > 0):
                continue  # FerretDB is slow and far off the others: one round
            phase = time.perf_counter()
            result = await worker_run(args, plan, corpus, sink, tmp)
            if isinstance(result, str):
                refused[sink.key] = result
                _note(f"{corpus.name}: {sink.key}: {result}")
                continue
            runs[sink.key].append(result)
            if result.duplicates:
                _note(f"{corpus.name}: {sink.key}: WARNING: {result.duplicates:.0f} events skipped as duplicates")
            _note(f"{corpus.name} round {round_ + 1}: {sink.key}: {result.rate:,.0f} events/s over "
                  f"{result.events:,.0f} events ({time.perf_counter() - phase:.0f}s)")  # fmt: skip

    phase = time.perf_counter()
    out["write_path"] = write_path(corpus, tmp)
    _note(f"{corpus.name}: write path without Kafka ({time.perf_counter() - phase:.0f}s): {out['write_path']}")

    best = {key: max(values, key=lambda t: t.rate) for key, values in ceilings.items()}
    for key, t in best.items():
        out[key] = {**_figures(t), "rounds": [v.rate for v in ceilings[key]]}
    workers: dict[str, Any] = {}
    for sink in SINKS:
        if sink.key in refused:
            workers[sink.key] = {"na": refused[sink.key]}
            continue
        top = max(runs[sink.key], key=lambda t: t.rate)
        figures = {**_figures(top), "rounds": [v.rate for v in runs[sink.key]]}
        for key, t in best.items():
            figures[f"x_{key}"] = top.rate / t.rate
        workers[sink.key] = figures
    out["worker"] = workers

    base = workers["sqlite"].get("rate")
    if base:
        phase = time.perf_counter()
        out["latency"] = await latency_run(args, plan, corpus, base / 2, tmp)
        _note(f"{corpus.name}: latency run ({time.perf_counter() - phase:.0f}s): {out['latency']}")
    else:
        out["latency"] = {"error": "no SQLite rate to halve"}
    return out


def _measured_commit() -> dict[str, Any]:
    """Which stepstream this run measured: the git commit of its source tree."""
    root = Path(stepstream.__file__).resolve().parents[2]

    def git(*cmd: str) -> str:
        proc = subprocess.run(["git", "-C", str(root), *cmd], capture_output=True, text=True, check=False)
        return proc.stdout.strip()

    return {"path": str(root), "commit": git("rev-parse", "--short", "HEAD"),
            "dirty_worker_files": git("status", "--porcelain", "--", "services").splitlines()}  # fmt: skip


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    plan = QUICK if args.quick else FULL
    tmp = Path(tempfile.mkdtemp(prefix="stepstream-bench-"))
    result: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "measured": _measured_commit(),
        "partitions": PARTITIONS,
        "cpus": os.cpu_count(),
        "loadavg_at_start": os.getloadavg()[0],
        "plan": msgspec.to_builtins(plan),
        "corpora": {},
    }
    started = time.perf_counter()
    try:
        for corpus in (thinking_heavy(plan.thinking_events), many_runs(plan.many_runs)):
            result["corpora"][corpus.name] = await corpus_run(args, plan, corpus, tmp)
        result["memory"] = await memory_run(args, plan, tmp)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            _note(f"kept {tmp}")
    result["seconds"] = time.perf_counter() - started
    result["loadavg_at_end"] = os.getloadavg()[0]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker", default=os.environ.get("STEPSTREAM_TEST_BROKER"), help="bootstrap host:port")
    parser.add_argument("--mongo", default=os.environ.get("STEPSTREAM_TEST_MONGO_URL"), help="MongoDB URL")
    parser.add_argument("--quick", action="store_true", help="small corpora and short budgets, for a smoke run")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (worker logs, SQLite files)")
    args = parser.parse_args(argv)
    if not args.broker:
        parser.error("--broker (or STEPSTREAM_TEST_BROKER) is required; `make bench` starts one")
    result = asyncio.run(main_async(args))
    print(report(result, [(sink.key, sink.label) for sink in SINKS]), flush=True)
    print("BENCH_JSON " + json.dumps(finite(result), default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
