"""The ingest producer (librdkafka, ``api/kafka_log.py``) puts each key on Kafka's
default partition, ``murmur2(key) mod partitions``, the rule of
``ingest/routing.py`` that the worker checks (librdkafka's own default, CRC32,
would split a run from the agents' records): keys drawn by hypothesis, produced
through :class:`~stepstream.api.kafka_log.KafkaEventLog` to a 7-partition topic, and
read back with the partition each landed on."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest_support import HostLoop, TopicTail, create_topic
from stepstream.api.kafka_log import KafkaEventLog
from stepstream.ingest.routing import default_partition
from stepstream.kafka.connection import KafkaConnection
from stepstream.metrics import ApiMetrics, IngestMetrics

pytestmark = pytest.mark.integration

PARTITIONS = 7


@pytest.fixture(scope="module")
def producing(kafka_bootstrap: str):
    loop = HostLoop()
    topic = loop.run(create_topic(kafka_bootstrap, partitions=PARTITIONS))
    metrics = IngestMetrics(ApiMetrics().registry)
    event_log = KafkaEventLog(KafkaConnection.plaintext(kafka_bootstrap), topic, metrics, timeout_seconds=10)

    async def start() -> TopicTail:
        await event_log.start()
        while not event_log.connected:
            await asyncio.sleep(0.05)
        return await TopicTail(kafka_bootstrap, topic).start()

    tail = loop.run(start(), timeout=60)
    try:
        yield loop, event_log, tail
    finally:
        loop.run(tail.stop())
        loop.run(event_log.close())
        loop.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(min_size=1, max_size=60) | st.text(min_size=1, max_size=30).map(str.encode),
                min_size=1, max_size=40))  # fmt: skip
def test_every_key_lands_on_kafkas_default_partition(producing, keys: list[bytes]) -> None:
    loop, event_log, tail = producing
    records = [(key, b"%d" % index) for index, key in enumerate(keys)]
    loop.run(event_log.append(records))
    landed = loop.run(tail.read())
    assert sorted((key, value) for _, key, value in landed) == sorted(records)
    for partition, key, _ in landed:
        assert partition == default_partition(key, PARTITIONS), key
    # in body order per key (one key, one partition, one idempotent producer)
    for key in set(keys):
        assert [v for _, k, v in landed if k == key] == [v for k, v in records if k == key]
