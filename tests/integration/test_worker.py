"""The ingest worker on the real broker: golden equality with `ingest-file`, SIGKILL
convergence, a second worker joining and leaving, and bad input (issue 5)."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from harness import KILLED_SESSION, Scenario, dump, first_difference, wait_caught_up, wait_for
from stepstream.core.wire import encode_event
from stepstream.emitter.corpus import generate_events
from stepstream.emitter.producer import Emitter
from stepstream.ingest.offline import ingest_file

pytestmark = pytest.mark.integration

PARTITIONS = 4
RUNS = 200
COMPANIES = 5


@pytest.fixture(scope="module")
def corpus():
    events = generate_events(20261129, runs=RUNS, companies=COMPANIES)
    companies = sorted({e.company_id for e in events})
    assert len(companies) >= COMPANIES and len({(e.company_id, e.run_id) for e in events}) >= RUNS
    return events, companies


@pytest.fixture(scope="module")
def golden(corpus, tmp_path_factory):
    events, companies = corpus
    base = tmp_path_factory.mktemp("golden")
    path = base / "events.jsonl"
    path.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    url = f"sqlite:///{base / 'golden.db'}"
    report = asyncio.run(ingest_file(path, url, url, progress=False))
    assert report.rejected == 0 and report.events == len(events)
    data = asyncio.run(dump(url, url, companies))
    assert len(data) >= RUNS
    return data


@pytest.fixture
def scenario(kafka_bootstrap, tmp_path):
    s = Scenario(kafka_bootstrap, tmp_path, PARTITIONS)
    yield s
    s.stop_all()


async def test_worker_equals_ingest_file(scenario, corpus, golden):
    events, companies = corpus
    await scenario.create_topics()
    worker = scenario.start_worker()
    await scenario.produce(events)
    await asyncio.to_thread(worker.wait_web)
    await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [worker])
    assert worker.metric_sum("stepstream_events_total") == len(events)
    # The worker's own lag poller sees the group caught up too.
    for _ in range(40):
        lag = worker.metric_sum("stepstream_consumer_lag_records")
        if lag == 0:
            break
        await asyncio.sleep(0.25)
    assert lag == 0
    ready = worker.ready()
    # SIGTERM is a clean, prompt shutdown (the stores' driver threads are closed).
    assert worker.stop(timeout=20) == 0, worker.tail()
    assert ready["ready"] is True and ready["processed"] == len(events)
    got = await dump(scenario.steps_url, scenario.deep_url, companies)
    assert got == golden, first_difference(golden, got)


async def test_sigkill_at_random_instants_converges(scenario, corpus, golden):
    events, companies = corpus
    await scenario.create_topics()
    rng = random.Random(5)
    # Produce in slices while killing, so kills land mid-batch, mid-thinking and mid-rebalance:
    # every other worker is killed once it has its partitions (at work), the others
    # blindly (often while still starting or joining).
    chunk = len(events) // 12 + 1
    kills = 0
    at_work = 0  # kills of a worker that had folded events
    worker = scenario.start_worker(name="k0", **KILLED_SESSION)
    for n, i in enumerate(range(0, len(events), chunk)):
        await scenario.produce(events[i : i + chunk])
        if n % 2 == 0:
            await wait_for(lambda: worker.ready_status()[0] == 200, 60, "the worker to get its partitions")
        await asyncio.sleep(rng.uniform(0.3, 2.5))
        at_work += worker.metric_sum("stepstream_events_total") > 0
        worker.kill()
        kills += 1
        worker = scenario.start_worker(name=f"k{kills}", **KILLED_SESSION)
    await asyncio.sleep(rng.uniform(0.5, 2.0))
    worker.kill()
    kills += 1
    worker = scenario.start_worker(name="final", **KILLED_SESSION)
    await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [worker], timeout=240)
    worker.stop()
    assert kills >= 10
    assert at_work >= 4, f"only {at_work} of {kills} kills hit a worker that had folded events"
    got = await dump(scenario.steps_url, scenario.deep_url, companies)
    assert got == golden, first_difference(golden, got)


async def test_second_worker_joins_and_leaves(scenario, corpus, golden):
    events, companies = corpus
    await scenario.create_topics()
    first = scenario.start_worker(name="a")
    third = len(events) // 3
    await scenario.produce(events[:third])
    second = scenario.start_worker(name="b")
    await asyncio.to_thread(second.wait_web)
    # The second third only once the group has rebalanced onto both (a fast first
    # worker could otherwise finish it before the second has partitions).
    for _ in range(240):
        if second.ready_status()[0] == 200 and first.ready_status()[0] == 200:
            break
        await asyncio.sleep(0.25)
    else:
        raise AssertionError(f"the group never settled on both workers: {second.ready()} {first.ready()}")
    await scenario.produce(events[third : 2 * third])
    # Let the group rebalance onto both workers and both process.
    for _ in range(120):
        if first.metric_sum("stepstream_events_total") > 0 and second.metric_sum("stepstream_events_total") > 0:
            break
        await asyncio.sleep(0.5)
    b_events = second.metric_sum("stepstream_events_total")
    second.stop()
    await scenario.produce(events[2 * third :])
    await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [first], timeout=240)
    a_events = first.metric_sum("stepstream_events_total")
    first.stop()
    assert a_events > 0 and b_events > 0, (a_events, b_events)
    got = await dump(scenario.steps_url, scenario.deep_url, companies)
    assert got == golden, first_difference(golden, got)


def _bad_messages(rng: random.Random, good: list[bytes], n: int) -> list[tuple[str, bytes]]:
    out = []
    kinds = ["random", "truncated", "utf8", "wrong_type", "unknown_type", "oversize"]
    for i in range(n):
        kind = kinds[i % len(kinds)]
        src = rng.choice(good)
        if kind == "random":
            data = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 60)))
            if data.lstrip()[:1] in (b"{", b"[", b'"') or data.strip() in (b"",):
                data = b"\x00" + data
        elif kind == "truncated":
            data = src[: rng.randint(1, len(src) - 2)]
        elif kind == "utf8":
            obj = json.loads(src)
            obj["event_id"] = "bad-\udcff"
            data = json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogateescape")
        elif kind == "wrong_type":
            obj = json.loads(src)
            obj["seq"] = str(obj["seq"])
            data = json.dumps(obj).encode()
        elif kind == "unknown_type":
            obj = json.loads(src)
            obj["type"] = "telepathy"
            data = json.dumps(obj).encode()
        else:
            obj = json.loads(src)
            obj["padding"] = "x" * 400_000
            data = json.dumps(obj).encode()
        out.append((kind, data))
    return out


async def test_bad_input_is_dead_lettered_and_good_runs_complete(scenario, corpus, golden):
    events, companies = corpus
    await scenario.create_topics()
    rng = random.Random(11)
    good = [encode_event(e) for e in events]
    bad = _bad_messages(rng, good, 3000)
    mixed: list[tuple[bytes | None, bytes]] = [(f"{e.company_id}/{e.run_id}".encode(), b) for e, b in zip(events, good)]
    # Insert bad messages at random places without reordering the good ones.
    for _, data in bad:
        mixed.insert(rng.randint(0, len(mixed)), (rng.choice([None, b"junk/key"]), data))
    worker = scenario.start_worker(STEPSTREAM_MAX_EVENT_BYTES="300000")
    async with Emitter(scenario.broker, scenario.topic) as emitter:
        for key, value in mixed:
            await emitter._producer.send(scenario.topic, value, key=key)
        await emitter._producer.flush()
    await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [worker], timeout=240)
    assert worker.alive()
    dead = worker.metric_sum("stepstream_dead_letters_total")
    worker.stop()
    assert dead == len(bad)
    # Every dead letter is on the DLQ topic with its reason and source.
    consumer = AIOKafkaConsumer(
        scenario.topic + ".dlq", bootstrap_servers=scenario.broker, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    reasons: dict[str, int] = {}
    seen = 0
    try:
        while seen < len(bad):
            batch = await consumer.getmany(timeout_ms=5000)
            if not batch:
                break
            for records in batch.values():
                for record in records:
                    headers = dict(record.headers)
                    assert headers["stepstream-source"].startswith(scenario.topic.encode() + b"/")
                    reasons[headers["stepstream-reason"].decode()] = reasons.get(headers["stepstream-reason"].decode(), 0) + 1
                    seen += 1
    finally:
        await consumer.stop()
    assert seen == len(bad)
    assert reasons.get("oversize") == 500 and reasons.get("unknown_type") == 500, reasons
    got = await dump(scenario.steps_url, scenario.deep_url, companies)
    assert got == golden, first_difference(golden, got)


async def test_broker_restart_mid_stream_converges(corpus, golden, tmp_path):
    """A broker of our own (same data dir, same port) stopped and started while the
    worker is busy: the worker reconnects and the sinks still equal the golden."""
    import subprocess

    from harness import free_port

    events, companies = corpus
    kafka = Path(__file__).resolve().parents[2] / "deploy" / "kafka" / "kafka.sh"
    data = tmp_path / "kafka"
    port = free_port()

    def broker(*args: str) -> str:
        done = subprocess.run([str(kafka), *args, "--data", str(data)], capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip()

    address = broker("up", "--port", str(port))
    try:
        scenario = Scenario(address, tmp_path, PARTITIONS)
        await scenario.create_topics()
        worker = scenario.start_worker(name="restart")
        half = len(events) // 2
        await scenario.produce(events[:half])
        await asyncio.sleep(3)
        broker("down")
        await asyncio.sleep(2)
        assert broker("up", "--port", str(port)) == address
        await scenario.produce(events[half:])
        await wait_caught_up(address, scenario.group, scenario.topic, [worker], timeout=240)
        worker.stop()
        got = await dump(scenario.steps_url, scenario.deep_url, companies)
        assert got == golden, first_difference(golden, got)
    finally:
        subprocess.run([str(kafka), "down", "--data", str(data)], capture_output=True, timeout=60)
