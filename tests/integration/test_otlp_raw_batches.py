"""ingest.otlp_bridge.RawBatches on the real broker: a record's events in record batches
per partition land on the partition Kafka's default partitioner gives their key, each
run's in order, every one acknowledged; batches that fill roll over, and an event larger
than a batch goes alone."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer

from harness import read_topic
from stepstream.ingest.otlp_bridge import RawBatches
from stepstream.ingest.routing import default_partition

PARTITIONS = 4


async def test_events_land_on_their_keys_partitions_in_order(kafka_bootstrap, kafka_topic_factory):
    topic = await kafka_topic_factory(PARTITIONS, prefix="rawbatches")
    # Small batches, so most partitions fill several; one event is larger than a batch.
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, max_batch_size=16_384, linger_ms=5,
                                max_request_size=2_000_000)  # fmt: skip
    await producer.start()
    try:
        runs = [(f"acme/run-{n}".encode(), [f"run-{n} event {i} ".encode() * (1 + i % 7) for i in range(40)])
                for n in range(25)]  # fmt: skip
        runs[3][1][10] = b"x" * 100_000  # bigger than a batch: it goes in one of its own
        produce = RawBatches(lambda: producer, topic)
        acknowledgements = await produce(runs)
        assert 0 < len(acknowledgements) < sum(len(values) for _, values in runs)  # batches, not one per event
        metadata = await asyncio.wait_for(asyncio.gather(*acknowledgements), 30)
        assert all(m.topic == topic for m in metadata)
        second = await produce(runs[:2])  # the same producer again: the next record's events
        await asyncio.wait_for(asyncio.gather(*second), 30)
    finally:
        await producer.stop()
    records = await read_topic(kafka_bootstrap, topic)
    seen: dict[bytes, list[bytes]] = {}
    for record in records:
        assert record.partition == default_partition(record.key, PARTITIONS), record.key
        seen.setdefault(record.key, []).append(record.value)
    expected = {key: list(values) for key, values in runs}
    for key, values in runs[:2]:
        expected[key] = expected[key] + list(values)
    assert seen == expected  # every event once per produce, each run's in order
