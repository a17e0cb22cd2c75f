"""Worker benchmark on a real broker: one `stepstream worker` process over a
pre-loaded topic into SQLite, beside a bare aiokafka ``getmany`` + msgspec decode
loop over the same topic, in the same run.

    PYTHONPATH=services python -m benchmarks.bench_worker --broker HOST:PORT [--events 200000]

Reports both rates, their ratio, the worker's CPU microseconds per event (from
/proc), p50/p99 event-to-sink latency while producing at half the measured
maximum rate (from the worker's ``stepstream_ingest_lag_seconds`` histogram), and
the worker's peak resident memory with 10,000 runs open at once, each mid-thinking.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from stepstream.config import load_settings
from stepstream.core.wire import (
    RunStart,
    RunStartPayload,
    ThinkingDelta,
    ThinkingDeltaPayload,
    decode_event,
    encode_event,
    partition_key,
)
from stepstream.emitter.corpus import generate_events
from stepstream.ingest.app import ensure_topics

PARTITIONS = 4
TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def _sample(text: str, name: str) -> float:
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name)


def _quantile(text: str, name: str, q: float) -> float:
    """histogram_quantile over the cumulative buckets of one histogram."""
    buckets = []
    for line in text.splitlines():
        if line.startswith(name + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rpartition(" ")[2])))
    buckets.sort()
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    rank = q * buckets[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_count) / max(count - prev_count, 1e-9)
        prev_le, prev_count = le, count
    return buckets[-1][0]


async def _preload(broker: str, topic: str, blobs: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=broker, linger_ms=20, max_batch_size=1_048_576, max_request_size=2_000_000)
    await producer.start()
    try:
        futures = [await producer.send(topic, value, key=key) for key, value in blobs]
        for fut in futures:
            await fut
    finally:
        await producer.stop()


async def bare_loop(broker: str, topic: str, total: int) -> tuple[float, float]:
    """Seconds and CPU seconds for getmany + decode over the whole topic."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=broker, group_id=f"bare-{uuid.uuid4().hex[:6]}", auto_offset_reset="earliest",
        enable_auto_commit=False, max_partition_fetch_bytes=4_194_304,
    )
    await consumer.start()
    try:
        seen = 0
        started = cpu0 = None
        while seen < total:
            batch = await consumer.getmany(timeout_ms=1000, max_records=5000)
            if started is None and batch:
                started, cpu0 = time.perf_counter(), time.process_time()
            for records in batch.values():
                for record in records:
                    decode_event(record.value)
                seen += len(records)
        return time.perf_counter() - started, time.process_time() - cpu0
    finally:
        await consumer.stop()


def faust_noop(broker: str, topic: str, total: int, tmp: Path) -> tuple[float, float]:
    """Seconds and CPU seconds of a faust agent that only acks, over the same topic."""
    result = tmp / "noop.json"
    subprocess.run(
        [sys.executable, "-m", "benchmarks.faust_noop", broker, topic, str(total), str(result)],
        check=False, timeout=900, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    import json

    data = json.loads(result.read_text())
    return data["seconds"], data["cpu"]


class Worker:
    def __init__(self, broker: str, topic: str, tmp: Path, name: str) -> None:
        self.port = _free_port()
        env = dict(os.environ)
        env.update(
            STEPSTREAM_BROKER=broker, STEPSTREAM_TOPIC=topic, STEPSTREAM_APP_ID=f"bench-{name}-{uuid.uuid4().hex[:6]}",
            STEPSTREAM_STEPS_SINK=f"sqlite:///{tmp / (name + '.db')}", STEPSTREAM_PARTITIONS=str(PARTITIONS),
            STEPSTREAM_WEB_PORT=str(self.port), STEPSTREAM_LOG_LEVEL="error",
        )
        self.log = (tmp / f"{name}.log").open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "stepstream.cli", "worker"], env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def metrics(self) -> str:
        return _metrics(self.port)

    def wait_up(self) -> None:
        for _ in range(300):
            try:
                self.metrics()
                return
            except OSError:
                time.sleep(0.1)
        raise SystemExit("worker did not come up")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_events(worker: Worker, total: int, timeout: float = 900) -> tuple[float, float]:
    """Poll until the worker applied ``total`` events; returns (first seen, done) perf times."""
    first = None
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        try:
            n = _sample(worker.metrics(), "stepstream_events_total")
        except OSError:
            n = 0
        now = time.perf_counter()
        if n > 0 and first is None:
            first = now
        if n >= total:
            return first or now, now
        time.sleep(0.05)
    raise SystemExit(f"worker did not finish {total} events in {timeout}s")


def _open_runs(count: int, deltas: int) -> list[tuple[bytes, bytes]]:
    start = datetime(2026, 11, 29, tzinfo=timezone.utc)
    out = []
    for i in range(count):
        company, run = f"mem{i % 10}", f"open-{i}"
        key = partition_key(company, run)
        common = dict(v=1, company_id=company, run_id=run)
        out.append((key, encode_event(RunStart(event_id=f"{run}-s", seq=0, ts=start, payload=RunStartPayload(agent_name="a"), **common))))
        for d in range(deltas):
            out.append((key, encode_event(ThinkingDelta(event_id=f"{run}-{d}", seq=d + 1, ts=start + timedelta(milliseconds=d), payload=ThinkingDeltaPayload(text="hmm, let me think about that. "), **common))))
    return out


async def main_async(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="stepstream-bench-"))
    broker = args.broker
    try:
        # Corpus: thinking-heavy, at least --events events.
        events = []
        seed = 1
        while len(events) < args.events:
            events.extend(generate_events(seed, runs=200, companies=5))
            seed += 1
        blobs = [(partition_key(e.company_id, e.run_id), encode_event(e)) for e in events]
        deltas = sum(1 for e in events if e.__struct_config__.tag == "thinking_delta")
        topic = f"bench-{uuid.uuid4().hex[:6]}"
        await ensure_topics(load_settings({"broker": broker, "topic": topic, "partitions": PARTITIONS}, environ={}))
        t0 = time.perf_counter()
        await _preload(broker, topic, blobs)
        print(f"corpus: {len(events)} events ({deltas / len(events):.0%} thinking deltas, "
              f"{sum(len(b) for _, b in blobs) / len(blobs):.0f} B mean) preloaded in {time.perf_counter() - t0:.1f}s", file=sys.stderr)

        bare_s, bare_cpu = await bare_loop(broker, topic, len(events))
        noop_s, noop_cpu = faust_noop(broker, topic, len(events), tmp)
        worker = Worker(broker, topic, tmp, "throughput")
        worker.wait_up()
        first, done = _wait_events(worker, len(events))
        cpu = _cpu_seconds(worker.proc.pid)
        worker.stop()
        bare_rate = len(events) / bare_s
        # Startup (imports, group join) happens before the first event; the rate counts from it.
        rate = len(events) / max(done - first, 1e-9)
        print(f"bare aiokafka getmany+decode: {bare_rate:,.0f} events/s ({bare_cpu / len(events) * 1e6:.1f} us CPU/event)")
        print(f"worker end-to-end into SQLite: {rate:,.0f} events/s ({cpu / len(events) * 1e6:.1f} us CPU/event, whole process)")
        noop_rate = len(events) / noop_s
        print(f"faust no-op agent (ack only): {noop_rate:,.0f} events/s ({noop_cpu / len(events) * 1e6:.1f} us CPU/event)")
        print(f"ratio worker/bare: {rate / bare_rate:.2f}   worker/faust-no-op: {rate / noop_rate:.2f}   "
              f"faust-no-op/bare: {noop_rate / bare_rate:.2f}")

        # Latency at half the measured maximum: produce paced, events stamped at send time.
        target = rate / 2
        lat_topic = f"bench-lat-{uuid.uuid4().hex[:6]}"
        await ensure_topics(load_settings({"broker": broker, "topic": lat_topic, "partitions": PARTITIONS}, environ={}))
        lat_worker = Worker(broker, lat_topic, tmp, "latency")
        lat_worker.wait_up()
        n = min(len(events), int(target * args.latency_seconds))
        producer = AIOKafkaProducer(bootstrap_servers=broker, linger_ms=2)
        await producer.start()
        started = time.perf_counter()
        try:
            import msgspec

            for i, event in enumerate(events[:n]):
                due = started + i / target
                delay = due - time.perf_counter()
                if delay > 0.002:
                    await asyncio.sleep(delay)
                stamped = msgspec.structs.replace(event, ts=datetime.now(timezone.utc))
                await producer.send(lat_topic, encode_event(stamped), key=partition_key(event.company_id, event.run_id))
            await producer.flush()
        finally:
            await producer.stop()
        _wait_events(lat_worker, n)
        text = lat_worker.metrics()
        lat_worker.stop()
        p50 = _quantile(text, "stepstream_ingest_lag_seconds", 0.50)
        p99 = _quantile(text, "stepstream_ingest_lag_seconds", 0.99)
        print(f"latency at {target:,.0f} events/s ({n} events): p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms "
              "(event ts to sink commit; a thinking delta waits for its 2 KiB flush, close or idle flush)")

        # Memory: 10,000 runs open at once, each mid-thinking.
        mem_topic = f"bench-mem-{uuid.uuid4().hex[:6]}"
        await ensure_topics(load_settings({"broker": broker, "topic": mem_topic, "partitions": PARTITIONS}, environ={}))
        opens = _open_runs(args.open_runs, 3)
        await _preload(broker, mem_topic, opens)
        mem_worker = Worker(broker, mem_topic, tmp, "memory")
        mem_worker.wait_up()
        _wait_events(mem_worker, len(opens))
        open_now = _sample(mem_worker.metrics(), "stepstream_open_runs")
        peak = _peak_rss_mib(mem_worker.proc.pid)
        mem_worker.stop()
        print(f"peak RSS with {args.open_runs} runs open mid-thinking: {peak:.0f} MiB (open_runs gauge {open_now:.0f})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker", default=os.environ.get("STEPSTREAM_TEST_BROKER"), help="bootstrap host:port")
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--open-runs", type=int, default=10_000)
    args = parser.parse_args(argv)
    if not args.broker:
        parser.error("--broker (or STEPSTREAM_TEST_BROKER) is required; `make bench` starts one")
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
