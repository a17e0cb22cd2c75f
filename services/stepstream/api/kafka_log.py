"""The ingest route's :class:`~stepstream.api.event_log.EventLog` on Kafka.

One idempotent aiokafka producer per API process (``acks="all"``,
``enable_idempotence=True``), built from the Kafka connection value
(:class:`~stepstream.kafka.connection.KafkaConnection`), so TLS and SASL apply as to
every other client, and its effective protocol is checked like theirs. Records are sent in body order; a run's records
share a key (``{company}/{run}``), hence a partition, so they land in order.

Policy, by case:

=========================================  ==================================================
case                                       answer (:class:`LogUnavailable`, so 503)
=========================================  ==================================================
not connected yet (broker away at start;   ``unavailable``, ``Retry-After: 2``; the producer
the producer is (re)started in the         is started in the background with backoff
background)
more than ``max_inflight_bytes`` of         ``full``, ``Retry-After: 1``, at once: the
records sent and not yet acknowledged      request is not sent at all
no acknowledgement of every record within  ``timeout``, ``Retry-After: 2``; what is still in
``timeout_seconds``                        flight stays counted against the bound until the
                                           producer settles it
the producer or the broker refused a       ``unavailable``, ``Retry-After: 1``; after a
record (``KafkaError``)                    refusal that is not retriable the producer is
                                           replaced
=========================================  ==================================================

The API does not create topics (the worker does, or an admin): an unknown topic is
the ``timeout`` case.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka.partitioner import DefaultPartitioner, murmur2

from stepstream.api.event_log import LogUnavailable, Record
from stepstream.ingest.routing import CACHED_KEYS
from stepstream.kafka.connection import KafkaConnection, effective_protocol
from stepstream.metrics import IngestMetrics

__all__ = ["KafkaEventLog"]

log = logging.getLogger("stepstream.api.ingest")

_STOP_SECONDS = 5.0


class KafkaEventLog:
    """``await log.start()`` (returns at once; connects in the background), then
    :meth:`append`; ``await log.close()``."""

    def __init__(
        self,
        connection: KafkaConnection,
        topic: str,
        metrics: IngestMetrics,
        *,
        timeout_seconds: float = 10.0,
        max_inflight_bytes: int = 67_108_864,
        max_request_bytes: int = 1_048_576 + 65_536,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.connection = connection
        self._kwargs = connection.aiokafka_kwargs()  # a TLS file that cannot be read raises here, at start
        self.topic = topic
        self._metrics = metrics
        self._timeout = timeout_seconds
        self._max_inflight = max_inflight_bytes
        self._max_request = max_request_bytes
        self._describe = connection.describe()
        self._clock = clock
        self._producer: Any = None
        self._inflight = 0
        self._connector: asyncio.Task[None] | None = None
        self._candidate: Any = None  # a producer being started by the connector
        self._closing = False
        self._closed = asyncio.Event()  # set by close(): wakes the connector's backoff

    @property
    def connected(self) -> bool:
        return self._producer is not None

    def _new_producer(self) -> Any:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(
            **self._kwargs,
            acks="all",
            enable_idempotence=True,
            linger_ms=0,  # a request waits for its acks: batching comes from what queues meanwhile
            max_batch_size=1_048_576,
            max_request_size=self._max_request,
            request_timeout_ms=max(1000, int(self._timeout * 1000)),
            client_id="stepstream-api-ingest",
            partitioner=CachedPartitioner(),
        )
        return producer

    async def start(self) -> None:
        """Check the producer's effective protocol against the connection's (a
        :class:`~stepstream.errors.ConfigError` here stops ``stepstream api`` at once,
        as every other client does), then connect in the background."""
        self._closing = False
        self._closed = asyncio.Event()
        if self._connector is not None and not self._connector.done():
            return
        producer = self._new_producer()
        try:
            self.connection.check_protocol(effective_protocol(producer), "the API's ingest producer")
        except BaseException:
            await _stop(producer)
            raise
        self._candidate = producer
        self._connector = asyncio.create_task(self._connect(), name="stepstream-ingest-connect")

    async def _connect(self) -> None:
        """Start :attr:`_candidate` until it connects; :meth:`close` stops one left behind."""
        from aiokafka.errors import KafkaError

        backoff = 0.25
        while True:
            producer = self._candidate
            try:
                await producer.start()
            except (KafkaError, OSError) as exc:
                self._candidate = None
                await _stop(producer)
                log.warning("ingest: the producer to Kafka %s did not start (%s): the route answers 503; "
                            "retrying in %.1fs", self._describe, type(exc).__name__, backoff)  # fmt: skip
                try:
                    await asyncio.wait_for(self._closed.wait(), backoff)
                except TimeoutError:
                    pass
                backoff = min(backoff * 2, 5.0)
                if self._closing:
                    return
                self._candidate = self._new_producer()
                continue
            self._candidate = None
            if self._closing:
                await _stop(producer)
                return
            self._producer = producer
            self._metrics.connected.set(1)
            log.warning("ingest: producing to %s on %s", self.topic, self._describe)
            return

    async def close(self) -> None:
        """Stop the producer. A connection attempt in progress is let finish (for at
        most 5 s) rather than cancelled: a start cancelled inside its TLS handshake can
        leave aiokafka's socket open."""
        self._closing = True
        self._closed.set()
        connector = self._connector
        if connector is not None and not connector.done():
            await asyncio.wait({connector}, timeout=_STOP_SECONDS)
            if not connector.done():
                connector.cancel()
                try:
                    await connector
                except asyncio.CancelledError:
                    pass
        candidate, self._candidate = self._candidate, None
        if candidate is not None:  # cancelled while connecting (or before it began)
            await _stop(candidate)
        producer, self._producer = self._producer, None
        self._metrics.connected.set(0)
        if producer is not None:
            await _stop(producer)

    def _replace(self, producer: Any) -> None:
        """Drop a producer that refused for good; a new one is started in the background."""
        if self._producer is producer:
            self._producer = None
            self._metrics.connected.set(0)
            asyncio.get_running_loop().create_task(_stop(producer))
            if not self._closing:
                self._candidate = self._new_producer()
                self._connector = asyncio.create_task(self._connect(), name="stepstream-ingest-connect")

    def _release(self, size: int) -> None:
        self._inflight -= size
        self._metrics.inflight_bytes.set(self._inflight)

    async def append(
        self, records: Sequence[Record], *, topic: str | None = None, headers: Sequence[tuple[str, bytes]] = ()
    ) -> None:
        """Send ``records`` in order, to ``topic`` (default: the raw topic) with
        ``headers`` on each, and return once each is acknowledged (module docstring).
        Each key's partition is Kafka's default partitioner's (:class:`CachedPartitioner`;
        a ``None`` key: aiokafka's random partition)."""
        from aiokafka.errors import KafkaError, KafkaTimeoutError

        producer = self._producer
        if producer is None:
            raise LogUnavailable("Kafka is not connected", cause="unavailable", retry_after=2)
        target = topic or self.topic
        extra = sum(len(name) + len(value) for name, value in headers)
        sizes = [len(key or b"") + len(value) + extra for key, value in records]
        total = sum(sizes)
        if self._inflight + total > self._max_inflight and self._inflight > 0:
            raise LogUnavailable("the producer is full", cause="full", retry_after=1)
        self._inflight += total
        self._metrics.inflight_bytes.set(self._inflight)
        started = self._clock()
        deliveries: list[asyncio.Future[Any]] = []
        unsent = total
        try:
            async with asyncio.timeout(self._timeout):
                for (key, value), size in zip(records, sizes, strict=True):
                    delivery = await producer.send(target, value, key=key, headers=list(headers) or None)
                    unsent -= size
                    delivery.add_done_callback(_settled(self, size))
                    deliveries.append(delivery)
                await asyncio.wait(deliveries)  # cancelled at the deadline; the deliveries are not
            for delivery in deliveries:
                exc = delivery.exception()
                if exc is not None:
                    raise exc
        except (TimeoutError, KafkaTimeoutError):
            self._metrics.produce_failures.labels("timeout").inc()
            raise LogUnavailable(
                f"Kafka did not acknowledge every event within {self._timeout:g}s", cause="timeout", retry_after=2
            ) from None
        except KafkaError as exc:
            self._metrics.produce_failures.labels("refused").inc()
            log.warning("ingest: Kafka refused a record (%s)", type(exc).__name__)
            if not getattr(exc, "retriable", False):
                self._replace(producer)
            raise LogUnavailable(f"Kafka refused the events ({type(exc).__name__})", cause="unavailable",
                                 retry_after=1) from None  # fmt: skip
        finally:
            if unsent:
                self._release(unsent)
        self._metrics.produce_latency.observe(self._clock() - started)


class CachedPartitioner:
    """Kafka's default partitioner (:func:`~stepstream.ingest.routing.default_partition`,
    ``murmur2(key)`` over the sorted partitions, as aiokafka's and the Java client's),
    with each run key's hash remembered: a request's records share a few run keys, and
    the pure-Python hash per record was a tenth of the route's CPU."""

    def __init__(self) -> None:
        self._hash: dict[bytes, int] = {}

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        if key is None:  # never from the route (every record has its run key); aiokafka's rule
            return DefaultPartitioner()(key, all_partitions, available)
        hashed = self._hash.get(key)
        if hashed is None:
            if len(self._hash) >= CACHED_KEYS:
                self._hash.clear()
            hashed = self._hash[key] = murmur2(key) & 0x7FFFFFFF
        return all_partitions[hashed % len(all_partitions)]


def _settled(owner: KafkaEventLog, size: int) -> Callable[[asyncio.Future[Any]], None]:
    def settled(delivery: asyncio.Future[Any]) -> None:
        if not delivery.cancelled():
            delivery.exception()  # retrieved: a failure is answered (or was, as a timeout)
        owner._release(size)

    return settled


async def _stop(producer: Any) -> None:
    try:
        await asyncio.wait_for(producer.stop(), _STOP_SECONDS)
    except Exception as exc:  # noqa: BLE001 - stopping is best effort; say why
        log.warning("ingest: the producer did not stop cleanly (%s)", type(exc).__name__)
