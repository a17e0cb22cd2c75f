"""The OTLP topic's stage in ``stepstream worker``: spans in, wire events out to the raw topic.

When ``STEPSTREAM_OTLP_TOPIC`` is set, the worker subscribes to it beside the raw topic
(same consumer group, same process). For each record, in offset order per partition:

1. decode the ``ExportTraceServiceRequest`` (``otlp_proto`` or ``otlp_json``, detected:
   :mod:`stepstream.otlp.decode`);
2. resolve each span's company and run (:mod:`stepstream.otlp.identity`: the
   ``stepstream-company`` header, the trusted resource attribute, the topic default) and
   map it to wire events (:mod:`stepstream.otlp.mapping`), numbered per run within the
   message;
3. produce the events to the raw topic keyed ``{company_id}/{run_id}``; the fold
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
replay of it gives identical rows. A produce that is not acknowledged within
``store_retry_seconds`` raises :class:`BridgeFailed` (a ``StoreFailed``): the worker
exits non-zero and Kafka rewinds.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from stepstream.core.wire import partition_key
from stepstream.errors import WireError
from stepstream.otlp.decode import decode_request
from stepstream.otlp.identity import IdentityPolicy, header_company
from stepstream.otlp.trace import encoded_runs, map_spans
from stepstream.pipeline import StoreFailed

__all__ = ["BridgeFailed", "OtlpBridge"]

Produce = Callable[[bytes, bytes], Awaitable[Awaitable[Any]]]


class BridgeFailed(StoreFailed):
    """Events made from a span were not acknowledged by the broker: stop, let Kafka rewind."""


class OtlpBridge:
    """The OTLP stage (module docstring). ``produce(key, value)`` hands one record for the
    raw topic to the producer and returns its acknowledgement; ``dead_letter(record,
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
        fills whole batches instead of one round trip per partition). Raises
        :class:`BridgeFailed` when the producer does not take an event within the budget
        (at least 63/64 of it: :meth:`_send`)."""
        acknowledgements: list[Awaitable[Any]] = []
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
            await self._send(runs, acknowledgements)
            self._counted("events", sum(map(len, runs.values())))
        return acknowledgements

    async def _send(self, runs: dict[tuple[str, str], list[bytes]], acknowledgements: list[Awaitable[Any]]) -> None:
        # One deadline for a record's events, not one per event (a timeout entered and
        # left costs more than the producer's own work for a small event), nor
        # asyncio.wait_for (a task for every one): the producer takes most events without
        # suspending. The deadline is moved on at most every 1/64 of the budget, so an
        # event the producer does not take fails after 63/64 of the budget at the least.
        loop = asyncio.get_running_loop()
        budget, produce = self._budget, self._produce
        step = budget / 64
        try:
            async with asyncio.timeout(budget) as deadline:
                moved = loop.time()
                for (company, run), events in runs.items():
                    key = partition_key(company, run)
                    for value in events:
                        now = loop.time()
                        if now - moved >= step:
                            deadline.reschedule(now + budget)
                            moved = now
                        acknowledgements.append(await produce(key, value))
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
    """The worker's bridge: produces through the app's producer, dead-letters through the
    worker's :class:`~stepstream.ingest.dead_letters.DeadLetters`."""
    policy = IdentityPolicy(
        trust_resource_company=settings.otlp_trust_resource_company,
        default_company=settings.otlp_company or None,
    )
    raw = settings.topic

    def produce(key: bytes, value: bytes) -> Awaitable[Awaitable[Any]]:
        return app.producer.send(raw, key, value, None, None, None)

    return OtlpBridge(
        settings.otlp_topic,
        policy,
        produce,
        dead_letters.send,
        budget_seconds=settings.store_retry_seconds,
        max_message_bytes=settings.otlp_max_message_bytes,
        max_event_bytes=settings.max_event_bytes,
        counted=lambda what, n: metrics.otlp.labels(what).inc(n),
    )
