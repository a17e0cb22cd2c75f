"""The wire contract's ordering promise on a real broker: keyed ``{company_id}/{run_id}``,
every event of a run lands on one partition and a consumer group reads it in ``seq``
order (CONTRACT.md section 1). Uses plain JSON dicts, not the package's own types, so
it checks the broker and the keying rule rather than our encoder."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

pytestmark = pytest.mark.integration

PARTITIONS = 4
COMPANIES = [f"acme-{i}" for i in range(5)]
RUNS_PER_COMPANY = 10
CONSUME_TIMEOUT_S = 60.0


def run_events(company_id: str, run_id: str, rng: random.Random) -> list[dict]:
    """One agent run as wire-format v1 events: start, a few LLM/tool/thinking steps, end."""
    t0 = datetime(2025, 1, 1, tzinfo=UTC) + timedelta(minutes=rng.randrange(10_000))
    bodies: list[tuple[str, dict]] = [("run_start", {"agent_name": "roundtrip-agent", "environment": "test"})]
    for step in range(rng.randint(1, 4)):
        call = f"c{step}"
        bodies += [("thinking_delta", {"text": f"thought {i} of step {step}"}) for i in range(rng.randint(0, 3))]
        bodies += [
            ("llm_request", {"call_id": call, "provider": "openai", "model": "gpt-x", "input": [{"role": "user", "content": "hi"}]}),
            ("llm_response", {"call_id": call, "output": {"text": "ok"}, "usage": {"input_tokens": 3, "output_tokens": 1}, "stop_reason": "end_turn"}),
            ("tool_call", {"call_id": f"t{step}", "tool": "search", "arguments": {"q": f"step {step}"}}),
            ("tool_result", {"call_id": f"t{step}", "output": ["a", "b"], "is_error": False}),
        ]
    bodies.append(("run_end", {"status": "completed"}))
    return [
        {
            "v": 1,
            "event_id": str(uuid.uuid4()),
            "company_id": company_id,
            "run_id": run_id,
            "seq": seq,
            "ts": (t0 + timedelta(milliseconds=250 * seq)).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "type": kind,
            "parent_id": None,
            "payload": payload,
        }
        for seq, (kind, payload) in enumerate(bodies)
    ]


def interleave(runs: list[list[dict]], rng: random.Random) -> list[dict]:
    """Merge runs into one send order that keeps each run's own order, as concurrent agents would."""
    queues = [list(r) for r in runs]
    out: list[dict] = []
    while queues:
        q = rng.choice(queues)
        out.append(q.pop(0))
        if not q:
            queues.remove(q)
    return out


async def test_runs_stay_on_one_partition_in_seq_order(kafka_bootstrap: str, kafka_topic_factory) -> None:
    rng = random.Random(20250101)
    topic = await kafka_topic_factory(PARTITIONS, prefix="roundtrip")
    runs = [run_events(c, f"run-{c}-{i:02d}", rng) for c in COMPANIES for i in range(RUNS_PER_COMPANY)]
    # Run ids repeat across companies in real traffic; one shared id proves the key includes the company.
    runs.append(run_events(COMPANIES[0], "shared-run", rng))
    runs.append(run_events(COMPANIES[1], "shared-run", rng))
    sent = interleave(runs, rng)
    expected = {(r[0]["company_id"], r[0]["run_id"]): [e["event_id"] for e in r] for r in runs}

    encoder = msgspec.json.Encoder()
    produced_partition: dict[str, int] = {}
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic, key=f"{e['company_id']}/{e['run_id']}".encode(), value=encoder.encode(e)
            )
            for e in sent
        ]
        for e, metadata in zip(sent, await asyncio.gather(*futures), strict=True):
            produced_partition[e["event_id"]] = metadata.partition
    finally:
        await producer.stop()

    received: dict[tuple[str, str], list[tuple[int, int, dict]]] = defaultdict(list)  # run -> (partition, offset, event)
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=f"{topic}.readers",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CONSUME_TIMEOUT_S
        count = 0
        while count < len(sent):
            assert loop.time() < deadline, f"only {count} of {len(sent)} events arrived in {CONSUME_TIMEOUT_S}s"
            for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                for rec in records:
                    event = msgspec.json.decode(rec.value)
                    assert rec.key == f"{event['company_id']}/{event['run_id']}".encode()
                    received[(event["company_id"], event["run_id"])].append((tp.partition, rec.offset, event))
                    count += 1
        assert {tp.partition for tp in consumer.assignment()} == set(range(PARTITIONS))
        await consumer.commit()
    finally:
        await consumer.stop()

    assert received.keys() == expected.keys()
    partitions_used = set()
    for run, events in received.items():
        parts = {p for p, _, _ in events}
        assert len(parts) == 1, f"run {run} was split over partitions {sorted(parts)}"
        partitions_used |= parts
        # Arrival order within the partition is the consumer's order; it must be seq order.
        assert [o for _, o, _ in events] == sorted(o for _, o, _ in events)
        assert [e["seq"] for _, _, e in events] == list(range(len(expected[run]))), f"run {run} out of order or incomplete"
        assert [e["event_id"] for _, _, e in events] == expected[run]
        assert all(produced_partition[e["event_id"]] == p for p, _, e in events)
    # The keying is only tested if the runs actually spread out.
    assert partitions_used == set(range(PARTITIONS))
