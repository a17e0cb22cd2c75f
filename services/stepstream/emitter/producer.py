"""The producer SDK agents use: publish wire events keyed ``{company_id}/{run_id}``.

``Emitter`` wraps an aiokafka producer with ``acks=all`` and idempotence, so a
retried send cannot reorder or duplicate a run's events on its partition.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka import AIOKafkaProducer

from stepstream.core.wire import Event, encode_event, partition_key
from stepstream.kafka.connection import KafkaConnection, as_connection, effective_protocol


class Emitter:
    """``async with Emitter(kafka, topic) as em: await em.emit(event)``; ``kafka`` is a
    :class:`KafkaConnection` (a bare broker string means plaintext)."""

    def __init__(self, kafka: KafkaConnection | str, topic: str = "stepstream.events", *, linger_ms: int = 5) -> None:
        self.topic = topic
        self.kafka = as_connection(kafka)
        self._producer = AIOKafkaProducer(
            **self.kafka.aiokafka_kwargs(),
            acks="all",
            enable_idempotence=True,
            linger_ms=linger_ms,
            max_batch_size=262144,
        )
        self.kafka.check_protocol(effective_protocol(self._producer), "the producer")

    async def __aenter__(self) -> Emitter:
        await self._producer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._producer.stop()

    async def emit(self, event: Event) -> None:
        """Send one event and wait until the broker has it."""
        await self._producer.send_and_wait(self.topic, encode_event(event), key=partition_key(event.company_id, event.run_id))

    async def emit_many(self, events: Iterable[Event]) -> int:
        """Send events in order (pipelined), then wait for all; returns how many."""
        futures = []
        for event in events:
            futures.append(
                await self._producer.send(self.topic, encode_event(event), key=partition_key(event.company_id, event.run_id))
            )
        for fut in futures:
            await fut
        return len(futures)

    async def emit_raw(self, key: bytes | None, value: bytes) -> None:
        """Send arbitrary bytes (tests of the dead-letter path)."""
        await self._producer.send_and_wait(self.topic, value, key=key)
