"""HTTP ingest: events/s per API process, p99 at half that rate, the SDK over HTTP,
beside a bare producer on the same broker.

    PYTHONPATH=services python -m benchmarks.bench_ingest --broker HOST:PORT [--seconds 8] [--quick]

One ``stepstream api --ingest`` process (rate limit off) produces to a fresh 4-partition
topic on the broker. Events are 1 KiB wire events (``thinking_delta``) in NDJSON
batches of 100, spread over 200 runs of one company.

1. **bare**: the API's own producer (``KafkaEventLog``: librdkafka, idempotent,
   ``acks=all``) in this process appends the same batches, ``--clients`` at once, no
   HTTP: the ceiling of the broker and the producer here. **bare.aiokafka**: the same
   with an idempotent aiokafka producer (send 100, await their acknowledgements), the
   library the route used before.
2. **max**: ``--clients`` HTTP clients (httpx, keep-alive) post batches back to back for
   ``--seconds``: accepted events/s, and the API process's CPU per event.
3. **p99 at half**: requests paced at half the max rate (open loop: one every
   ``100 / (max / 2)`` s, each on its own task), for ``--seconds``: latency
   p50/p99/max, client side (request sent to answer read).
4. **SDK**: a ``Tracer("http://...", token=...)`` fed as fast as the calls go (a queue
   large enough to never drop), until it has flushed: events/s from the first call to
   the flush.

Every request must be answered 202; any other answer or transport error is counted and
printed. The goal of the ingest issue: at least 20,000 events/s per API process.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import httpx
import msgspec

from benchmarks.worker_process import cpu_seconds
from stepstream.api.tokens import add_token

COMPANY = "bench"
BATCH = 100
RUNS = 200
GOAL = 20_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Events:
    """1 KiB events, a ``seq`` counter per run, batches of ``BATCH`` over the runs."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.seq = [0] * RUNS
        self.next_run = 0
        self.text = "x" * 849  # with the envelope: 1,024 bytes per line

    def line(self, run: int) -> bytes:
        seq = self.seq[run]
        self.seq[run] += 1
        return msgspec.json.encode({
            "v": 1, "event_id": f"{self.tag}-{run}-{seq:09d}", "company_id": COMPANY, "run_id": f"{self.tag}-run-{run:04d}",
            "seq": seq, "ts": "2026-12-01T12:00:00.000000Z", "type": "thinking_delta",
            "payload": {"text": self.text[: 849 - len(str(seq))]},
        })  # fmt: skip

    def batch(self) -> list[tuple[bytes, bytes]]:
        out = []
        for _ in range(BATCH):
            run = self.next_run
            self.next_run = (run + 1) % RUNS
            out.append((f"{COMPANY}/{self.tag}-run-{run:04d}".encode(), self.line(run)))
        return out


async def create_topic(broker: str, partitions: int = 4) -> str:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    name = f"stepstream.bench.ingest.{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
        await asyncio.sleep(1.0)
    finally:
        await admin.close()
    return name


async def bare(broker: str, topic: str, seconds: float, clients: int) -> tuple[float, float]:
    """The API's own producer (:class:`~stepstream.api.kafka_log.KafkaEventLog`,
    librdkafka) in this process, no HTTP: events/s and this process's CPU per event."""
    from stepstream.api.kafka_log import KafkaEventLog
    from stepstream.kafka.connection import KafkaConnection
    from stepstream.metrics import ApiMetrics, IngestMetrics

    event_log = KafkaEventLog(KafkaConnection.plaintext(broker), topic, IngestMetrics(ApiMetrics().registry))
    await event_log.start()
    while not event_log.connected:
        await asyncio.sleep(0.05)
    try:
        return await _closed_loop(lambda batch: event_log.append(batch), seconds, clients, "bare")
    finally:
        await event_log.close()


async def bare_aiokafka(broker: str, topic: str, seconds: float, clients: int) -> tuple[float, float]:
    """An idempotent ``acks=all`` aiokafka producer (send 100, await their
    acknowledgements), the library the API used before: events/s and CPU per event."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all", enable_idempotence=True, linger_ms=0,
                                max_batch_size=1_048_576)  # fmt: skip
    await producer.start()

    async def append(batch: list[tuple[bytes, bytes]]) -> None:
        await asyncio.gather(*[await producer.send(topic, value, key=key) for key, value in batch])

    try:
        return await _closed_loop(append, seconds, clients, "aio")
    finally:
        await producer.stop()


async def _closed_loop(append, seconds: float, clients: int, tag: str) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    events = Events(tag)
    sent = 0
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal sent
        while time.perf_counter() < deadline:
            await append(events.batch())
            sent += BATCH

    cpu0, started = _own_cpu(), time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed, cpu = time.perf_counter() - started, _own_cpu() - cpu0
    return sent / elapsed, cpu / max(sent, 1)


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


class Api:
    def __init__(self, broker: str, topic: str, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        tokens = tmp / "tokens.json"
        self.token, _ = add_token(tokens, COMPANY, ["ingest"], created="2026-12-01T12:00:00Z")
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSTREAM_")}
        env.update(
            STEPSTREAM_BROKER=broker, STEPSTREAM_TOPIC=topic, STEPSTREAM_TOKENS_FILE=str(tokens),
            STEPSTREAM_STEPS_SINK=f"sqlite:///{tmp / 'api.db'}", STEPSTREAM_API_PORT=str(self.port),
            STEPSTREAM_API_INGEST="true", STEPSTREAM_INGEST_RATE_EVENTS="0", STEPSTREAM_INGEST_MAX_REQUESTS="256",
        )  # fmt: skip
        self.log = (tmp / "api.log").open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "stepstream.cli", "api"], env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT)  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/metrics", timeout=2) as resp:
                    if "stepstream_ingest_connected 1.0" in resp.read().decode():
                        return
            except OSError:
                time.sleep(0.1)
        raise SystemExit(f"the API never connected its producer; see {tmp / 'api.log'}")

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class Tally:
    def __init__(self) -> None:
        self.events = 0
        self.errors = 0
        self.samples: list[str] = []
        self.latencies: list[float] = []

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.samples) < 5:
            self.samples.append(what)


async def post(client: httpx.AsyncClient, token: str, body: bytes, tally: Tally) -> None:
    started = time.perf_counter()
    try:
        response = await client.post(f"/v1/companies/{COMPANY}/events", content=body,
                                     headers={"authorization": f"Bearer {token}", "content-type": "application/x-ndjson"})  # fmt: skip
    except httpx.HTTPError as exc:
        tally.error(type(exc).__name__)
        return
    tally.latencies.append(time.perf_counter() - started)
    if response.status_code == 202:
        tally.events += BATCH
    else:
        tally.error(f"{response.status_code} {response.text[:120]}")


def body(events: Events) -> bytes:
    return b"\n".join(value for _, value in events.batch())


async def max_rate(api: Api, seconds: float, clients: int) -> tuple[float, float, Tally]:
    events, tally = Events(uuid.uuid4().hex[:6]), Tally()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=api.url, limits=limits, timeout=30) as client:
        await post(client, api.token, body(events), Tally())  # warm up the connection and the route
        cpu0, started = api.cpu(), time.perf_counter()
        deadline = started + seconds

        async def loop() -> None:
            while time.perf_counter() < deadline:
                await post(client, api.token, body(events), tally)

        await asyncio.gather(*(loop() for _ in range(clients)))
        elapsed, cpu = time.perf_counter() - started, api.cpu() - cpu0
    return tally.events / elapsed, cpu / max(tally.events, 1), tally


async def paced(api: Api, rate: float, seconds: float) -> Tally:
    events, tally = Events(uuid.uuid4().hex[:6]), Tally()
    interval = BATCH / rate
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=api.url, limits=limits, timeout=30) as client:
        tasks = []
        started = time.perf_counter()
        n = 0
        while (now := time.perf_counter()) < started + seconds:
            due = started + n * interval
            if due > now:
                await asyncio.sleep(due - now)
            tasks.append(asyncio.ensure_future(post(client, api.token, body(events), tally)))
            n += 1
        await asyncio.gather(*tasks)
    return tally


def through_sdk(api: Api, total: int) -> tuple[float, object]:
    from stepstream.emitter import Tracer

    tracer = Tracer(api.url, token=api.token, max_queue=total + 10, flush_timeout=120)
    text = "x" * 849
    runs = [tracer.run(COMPANY, f"sdk-{uuid.uuid4().hex[:6]}-{r}", agent_name="bench") for r in range(RUNS)]
    started = time.perf_counter()
    for run in runs:
        run.start()
    for i in range(total - 2 * RUNS):
        runs[i % RUNS].thinking(text)
    for run in runs:
        run.end()
    flushed = tracer.flush(120)
    elapsed = time.perf_counter() - started
    stats = tracer.stats()
    tracer.close()
    if not flushed:
        print(f"  sdk: not flushed in 120 s: {stats}", file=sys.stderr)
    return stats.sent / elapsed, stats


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_ingest")
    parser.add_argument("--broker", default=os.environ.get("STEPSTREAM_TEST_BROKER"), required="STEPSTREAM_TEST_BROKER" not in os.environ)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--sdk-events", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.sdk_events = 2.0, 10_000
    topic = asyncio.run(create_topic(args.broker))
    with tempfile.TemporaryDirectory(prefix="stepstream-bench-ingest-") as tmp:
        ceiling, bare_cpu = asyncio.run(bare(args.broker, topic, args.seconds, args.clients))
        ceiling_aiokafka, aiokafka_cpu = asyncio.run(bare_aiokafka(args.broker, topic, args.seconds, args.clients))
        api = Api(args.broker, topic, Path(tmp))
        spy = None
        if os.environ.get("BENCH_INGEST_PYSPY"):  # a flame profile of the API process, for development
            spy = subprocess.Popen(["py-spy", "record", "-p", str(api.proc.pid), "-o", os.environ["BENCH_INGEST_PYSPY"],
                                    "-f", "speedscope", "-d", str(int(args.seconds) + 2)])  # fmt: skip
        try:
            rate, cpu_per_event, tally = asyncio.run(max_rate(api, args.seconds, args.clients))
            if spy is not None:
                spy.wait()
            half = asyncio.run(paced(api, rate / 2, args.seconds))
            sdk_rate, sdk_stats = through_sdk(api, args.sdk_events)
        finally:
            api.stop()
    print(f"ingest.bare        {ceiling:10,.0f} events/s  the API's producer (librdkafka, idempotent acks=all) in "
          f"this process, no HTTP, {args.clients} batches of {BATCH} at once; {bare_cpu * 1e6:6.1f} us CPU per event")  # fmt: skip
    print(f"ingest.bare.aiokafka {ceiling_aiokafka:8,.0f} events/s  {ceiling_aiokafka / ceiling:5.2f} of bare; aiokafka "
          f"idempotent acks=all, the same batches; {aiokafka_cpu * 1e6:6.1f} us CPU per event")  # fmt: skip
    print(f"ingest.http.max    {rate:10,.0f} events/s  {rate / ceiling:5.2f} of bare; {cpu_per_event * 1e6:6.1f} us "
          f"API CPU per event; {args.clients} clients; errors {tally.errors}")  # fmt: skip
    print(f"ingest.http.half   {half.events / args.seconds:10,.0f} events/s  paced at {rate / 2:,.0f}: latency p50 "
          f"{pct(half.latencies, 0.5) * 1000:.1f} ms, p99 {pct(half.latencies, 0.99) * 1000:.1f} ms, max "
          f"{max(half.latencies, default=0) * 1000:.1f} ms; errors {half.errors}")  # fmt: skip
    print(f"ingest.sdk         {sdk_rate:10,.0f} events/s  {sdk_rate / rate:5.2f} of http.max; Tracer over HTTP, "
          f"batches of 500: sent {sdk_stats.sent}, failed {sdk_stats.failed}, dropped {sdk_stats.dropped}")  # fmt: skip
    verdict = "met" if rate >= GOAL else "NOT met"
    print(f"ingest.goal        {GOAL:,} events/s per API process: {verdict}")
    for sample in tally.samples + half.samples:
        print(f"  error: {sample}", file=sys.stderr)
    return 0 if tally.errors == 0 and half.errors == 0 else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "services"))
    raise SystemExit(main())
