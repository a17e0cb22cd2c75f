"""Consumer lag from the poller: log-end minus committed offset per partition,
measured from outside the consumer (works while the consumer is stuck)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError

from stepstream.config import load_settings
from stepstream.kafka.topics import ensure_topics
from stepstream.ingest.lag import LagPoller
from stepstream.kafka.connection import KafkaConnection
from stepstream.metrics import Metrics

pytestmark = pytest.mark.integration


async def first_poll(poller: LagPoller, seconds: float = 30.0) -> dict[int, int]:
    """The first poll on a fresh broker: the group coordinator (``__consumer_offsets``)
    may not exist yet, a retriable error the poller's own loop retries too."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return await poller.poll()
        except KafkaError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def test_lag_gauge_reads_produced_then_returns_to_zero(kafka_bootstrap):
    tag = uuid.uuid4().hex[:8]
    topic, group = f"lag-{tag}", f"lag-group-{tag}"
    await ensure_topics(load_settings({"broker": kafka_bootstrap, "topic": topic, "partitions": 3}, environ={}))
    metrics = Metrics()
    poller = LagPoller(KafkaConnection.plaintext(kafka_bootstrap), group, topic, metrics)
    await poller.start()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        assert sum((await first_poll(poller)).values()) == 0
        n = 137
        for i in range(n):
            await producer.send(topic, b"x", key=f"k{i}".encode())
        await producer.flush()
        # The group is "paused": nobody consumes. The gauge reads exactly N.
        lags = await poller.poll()
        assert sum(lags.values()) == n
        gauge = sum(
            metrics.registry.get_sample_value("stepstream_consumer_lag_records", {"topic": topic, "partition": str(p)})
            for p in lags
        )
        assert gauge == n
        # Resume: consume and commit everything; the gauge returns to 0.
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=kafka_bootstrap, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False
        )
        await consumer.start()
        try:
            got = 0
            while got < n:
                batch = await consumer.getmany(timeout_ms=5000)
                assert batch, f"only {got} of {n} consumed"
                got += sum(len(r) for r in batch.values())
                await consumer.commit()
                partial = sum((await poller.poll()).values())
                assert partial == n - got
        finally:
            await consumer.stop()
        assert sum((await poller.poll()).values()) == 0
    finally:
        await producer.stop()
        await poller.stop()
