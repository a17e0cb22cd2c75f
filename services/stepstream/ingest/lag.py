"""Consumer lag in records per partition, from outside the consumer.

faust's sensor has end and committed offsets but no lag gauge, and it resets on
rebalance. This poller asks the broker directly: committed offsets of the group
(admin client) and log-end offsets (a group-less consumer), so it keeps reporting
when the agent is stuck.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from stepstream.kafka.connection import KafkaConnection, effective_protocol
from stepstream.metrics import Metrics

log = logging.getLogger(__name__)


class LagPoller:
    """``poll()`` once returns ``{partition: lag}`` and sets the gauge; ``run()`` loops.
    ``partition_count`` is the topic's partition count as of the last poll (``None``
    before): the misrouted-record check reads it (``ingest.routing``), since faust's
    ``topic_partitions`` knows the count only on the group's leader."""

    def __init__(self, kafka: KafkaConnection, group_id: str, topic: str, metrics: Metrics, interval: float = 2.0) -> None:
        self._kafka = kafka
        self._group = group_id
        self._topic = topic
        self._metrics = metrics
        self._interval = interval
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self.partition_count: int | None = None

    async def start(self) -> None:
        """Connect; a call after a successful one does nothing, one after a failure tries again."""
        if self._consumer is not None:
            return
        if self._admin is None:
            admin = AIOKafkaAdminClient(**self._kafka.aiokafka_kwargs(), client_id="stepstream-lag")
            self._kafka.check_protocol(effective_protocol(admin), "the lag poller's admin client")
            await admin.start()
            self._admin = admin
        # read_committed: the ends are the last stable offsets, as far as the worker reads.
        consumer = AIOKafkaConsumer(**self._kafka.aiokafka_kwargs(), enable_auto_commit=False, client_id="stepstream-lag",
                                    isolation_level="read_committed")  # fmt: skip
        self._kafka.check_protocol(effective_protocol(consumer), "the lag poller's consumer")
        await consumer.start()
        self._consumer = consumer

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
        if self._admin is not None:
            await self._admin.close()

    async def poll(self) -> dict[int, int]:
        assert self._admin is not None and self._consumer is not None, "start() first"
        parts = self._consumer.partitions_for_topic(self._topic)
        if not parts:
            await self._consumer._client.force_metadata_update()  # new topic: refresh once
            parts = self._consumer.partitions_for_topic(self._topic) or set()
        tps = [TopicPartition(self._topic, p) for p in sorted(parts)]
        if not tps:
            return {}
        self.partition_count = len(tps)
        ends = await self._consumer.end_offsets(tps)
        committed = await self._admin.list_consumer_group_offsets(self._group, partitions=tps)
        lags: dict[int, int] = {}
        for tp in tps:
            meta = committed.get(tp)
            done = meta.offset if meta is not None and meta.offset >= 0 else 0
            lags[tp.partition] = max(0, ends[tp] - done)
            self._metrics.consumer_lag.labels(self._topic, str(tp.partition)).set(lags[tp.partition])
        return lags

    def partitions_of(self, topic: str) -> int | None:
        """The partition count of ``topic`` if it is the polled one and a poll saw it."""
        return self.partition_count if topic == self._topic else None

    async def run(self) -> None:
        while True:
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the broker may be restarting; keep polling
                log.warning("lag poll failed: %r", exc)
            await asyncio.sleep(self._interval)
