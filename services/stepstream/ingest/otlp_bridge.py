"""The OTLP topic's stage in ``stepstream worker``: spans in, wire events out to the raw topic.

When ``STEPSTREAM_OTLP_TOPIC`` is set, the worker subscribes to it beside the raw topic
(same consumer group, same process). For each record, in offset order per partition:

1. decode the ``ExportTraceServiceRequest`` (``otlp_proto`` or ``otlp_json``, detected:
   :mod:`stepstream.otlp.decode`);
2. resolve each span's company and run (:mod:`stepstream.otlp.identity`: the
   ``stepstream-company`` header, the trusted resource attribute, the topic default) and
   map it to wire events (:mod:`stepstream.otlp.mapping`), numbered per run within the
   message;
3. produce the events to the raw topic keyed ``{company_id}/{run_id}``, in one record
   batch per partition (:class:`RawBatches`); the fold
   consumes them there like any other event (unchanged but for one rule: their ids
   start with ``otlp:``, so it numbers them on arrival and skips a redelivery by id,
   ``core.fold.RunFold.push``).

Dead letters: a record that does not decode is copied to the dead-letter topic with
reason ``bad_otlp``; spans of a record that cannot be placed (``no_trace_id``,
``no_company``, ``bad_company``, ``bad_run_id``, a wire bound) give one copy of the
record per reason (the detail counts the spans), and the record's other spans go on.

**Exactness.** Stateless: nothing is kept between records. A record's offset becomes
committable only after the broker acknowledged every event produced from it (and its
dead-letter copies, confirmed before the batch it rides on is written, as every dead
letter is); then it rides on the worker's open batch like a dead-lettered record. A crash
before that re-reads the record and produces its events again: duplicates on the raw
topic, which the fold skips by id, never a loss. The raw topic is the log of record: a
replay of it gives identical rows. A record's events that the producer does not take
within ``store_retry_seconds``, or that the broker does not acknowledge within it, raise
:class:`BridgeFailed` (a ``StoreFailed``): the worker exits non-zero and Kafka rewinds.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from stepstream.core.wire import partition_key
from stepstream.errors import WireError
from stepstream.ingest.routing import default_partition
from stepstream.otlp.decode import decode_request
from stepstream.otlp.identity import IdentityPolicy, header_company
from stepstream.otlp.trace import encoded_runs, map_spans
from stepstream.pipeline import StoreFailed

__all__ = ["BridgeFailed", "OtlpBridge", "RawBatches"]

#: ``produce([(key, [value, ...]), ...])``: hands the events of a partition's records (one
#: fetch's), each run's in order, to the producer and returns their acknowledgements.
Produce = Callable[[list[tuple[bytes, list[bytes]]]], Awaitable[list[Awaitable[Any]]]]


class BridgeFailed(StoreFailed):
    """Events made from a span were not acknowledged by the broker: stop, let Kafka rewind."""


class RawBatches:
    """The bridge's :data:`Produce` on aiokafka's batch API: the events of one call go in one
    record batch per partition of the raw topic (more when one fills), each key on the
    partition Kafka's default partitioner gives it (:func:`~stepstream.ingest.routing.default_partition`,
    what the route check expects), instead of one ``send`` per event (a future, an
    accumulator entry and a hash each). A run's events stay in order: they are appended in
    order, and the batches of a partition are queued in order. ``producer()`` returns the
    started ``AIOKafkaProducer``."""

    def __init__(self, producer: Callable[[], Any], topic: str) -> None:
        self._producer = producer
        self.topic = topic

    async def __call__(self, runs: list[tuple[bytes, list[bytes]]]) -> list[Awaitable[Any]]:
        producer, topic = self._producer(), self.topic
        count = len(await producer.partitions_for(topic))
        batches: dict[int, Any] = {}
        acknowledgements: list[Awaitable[Any]] = []
        for key, values in runs:
            partition = default_partition(key, count)
            batch = batches.get(partition)
            for value in values:
                if batch is None or batch.append(key=key, value=value, timestamp=None) is None:
                    if batch is not None:  # full: it goes, and this event opens the next one
                        acknowledgements.append(await producer.send_batch(batch, topic, partition=partition))
                    batch = batches[partition] = producer.create_batch()
                    if batch.append(key=key, value=value, timestamp=None) is None:
                        # An empty batch takes any first record; only a closed producer refuses.
                        raise BridgeFailed(f"the producer refused an event of {len(value)} bytes")
        for partition, batch in batches.items():
            batch.close()  # nothing else joins it (an open batch takes later send() calls)
            acknowledgements.append(await producer.send_batch(batch, topic, partition=partition))
        return acknowledgements


class OtlpBridge:
    """The OTLP stage (module docstring). ``produce`` (:data:`Produce`) hands a record's
    events for the raw topic to the producer and returns their acknowledgements; ``dead_letter(record,
    reason, detail)`` and ``settle(count)`` are the worker's; ``counted(kind, n)`` feeds
    the metrics (``spans``, ``events``, ``rejected:<reason>``)."""

    def __init__(
        self,
        topic: str,
        policy: IdentityPolicy,
        produce: Produce,
        dead_letter: Callable[[Any, str, str], Awaitable[None]],
        *,
        budget_seconds: float,
        max_message_bytes: int,
        max_event_bytes: int,
        counted: Callable[[str, int], None] = lambda kind, n: None,
    ) -> None:
        self.topic = topic
        self.policy = policy
        self._produce = produce
        self._dead_letter = dead_letter
        self._budget = budget_seconds
        self._max_bytes = max_message_bytes
        self._max_event_bytes = max_event_bytes
        self._counted = counted

    async def handle(self, records: list[Any]) -> None:
        """Bridge ``records`` (one partition's, in order). Returns once the broker holds
        every event made from them; raises :class:`BridgeFailed` otherwise."""
        await self.acknowledged(await self.send(records))

    async def send(self, records: list[Any]) -> list[Awaitable[Any]]:
        """Decode, map and hand to the producer the events of ``records`` (one
        partition's, in order); returns their acknowledgements, for :meth:`acknowledged`
        (the worker sends every partition of a fetch before it waits, so the producer
        fills whole batches instead of one round trip per partition). The events of all
        of ``records`` go to the producer at once, after the last is mapped: a batch
        handed over waits for the one before it on its partition to leave, so one handover
        per record would cost a round trip per record (a Collector may send one trace, or
        one span, per message). Raises :class:`BridgeFailed` when the producer does not
        take them within the budget (:meth:`_send`)."""
        acknowledgements: list[Awaitable[Any]] = []
        pairs: list[tuple[bytes, list[bytes]]] = []
        for record in records:
            value = record.value if record.value is not None else b""
            if len(value) > self._max_bytes:
                await self._dead_letter(record, "oversize", f"message is {len(value)} bytes, limit {self._max_bytes}")
                continue
            try:
                decoded = decode_request(value)
            except WireError as exc:
                await self._dead_letter(record, exc.reason, exc.detail)
                continue
            mapped = map_spans(decoded.spans, header_company(record.headers), self.policy, self._max_event_bytes)
            rejected = Counter(r.reason for r in [*decoded.rejected, *mapped.rejected])
            for reason, count in sorted(rejected.items()):
                self._counted(f"rejected:{reason}", count)
                await self._dead_letter(record, reason, f"{count} span(s) or event(s) of the request: {reason}")
            self._counted("spans", len(decoded.spans))
            runs = encoded_runs(mapped)
            pairs.extend((partition_key(company, run), events) for (company, run), events in runs.items())
            self._counted("events", sum(map(len, runs.values())))
        await self._send(pairs, acknowledgements)
        return acknowledgements

    async def _send(self, pairs: list[tuple[bytes, list[bytes]]], acknowledgements: list[Awaitable[Any]]) -> None:
        # One deadline for the records' events: the producer takes most of them without
        # suspending, and waits only for room in its queue (one batch per partition queued).
        if not pairs:
            return
        try:
            async with asyncio.timeout(self._budget):
                acknowledgements.extend(await self._produce(pairs))
        except Exception as exc:  # noqa: BLE001 - every send failure stops the worker, by policy
            raise BridgeFailed(f"an event made from a span was not sent: {exc!r}") from exc

    async def acknowledged(self, acknowledgements: list[Awaitable[Any]]) -> None:
        """Wait, at most the budget, until the broker acknowledged every one; raises
        :class:`BridgeFailed` otherwise."""
        if not acknowledgements:
            return
        try:
            async with asyncio.timeout(self._budget):
                # In order, not asyncio.gather (a callback on each of thousands): once the
                # first is acknowledged, most of the rest are already.
                for acknowledgement in acknowledgements:
                    await acknowledgement
        except Exception as exc:  # noqa: BLE001 - unacknowledged: Kafka rewinds to before these records
            raise BridgeFailed(f"the broker did not acknowledge events made from spans: {exc!r}") from exc


def bridge_for(settings: Any, app: Any, dead_letters: Any, metrics: Any) -> OtlpBridge:
    """The worker's bridge: produces through the aiokafka producer of the app's (faust's
    ``_ensure_producer``, in ``ingest.consumer.FAUST_INTERNALS``), dead-letters through the
    worker's :class:`~stepstream.ingest.dead_letters.DeadLetters`."""
    policy = IdentityPolicy(
        trust_resource_company=settings.otlp_trust_resource_company,
        default_company=settings.otlp_company or None,
    )
    return OtlpBridge(
        settings.otlp_topic,
        policy,
        RawBatches(app.producer._ensure_producer, settings.topic),
        dead_letters.send,
        budget_seconds=settings.store_retry_seconds,
        max_message_bytes=settings.otlp_max_message_bytes,
        max_event_bytes=settings.max_event_bytes,
        counted=lambda what, n: metrics.otlp.labels(what).inc(n),
    )
