"""The ingest route's :class:`~stepstream.api.event_log.EventLog` on Kafka (the default;
with ``--ingest-transactions``, :class:`~stepstream.api.kafka_txn_log.TransactionalEventLog`).

One idempotent librdkafka producer (confluent-kafka) per API process
(``enable.idempotence``, so ``acks=all`` and per-partition order across retries),
built from the Kafka connection value
(:meth:`~stepstream.kafka.connection.KafkaConnection.librdkafka_config`), so TLS and
SASL apply as to every other client. Keys go to ``murmur2(key) mod partitions``
(``partitioner=murmur2_random``: Kafka's default rule, the one of
:func:`~stepstream.ingest.routing.default_partition`; librdkafka's own default hashes
with CRC32). Records are produced in body order; a run's records share a key
(``{company}/{run}``), hence a partition, so they land in order.

Why librdkafka and not aiokafka, as the other clients: a record costs the API about a
third of the CPU (``make bench``: ``ingest.bare`` beside ``ingest.bare.aiokafka``),
and the route produces every record of every request.

Bookkeeping is per request, not per record: the delivery reports (served by one
polling thread) count down one :class:`_Delivery`, which wakes the request once, on
the event loop, when the last report arrived.

Policy, by case:

=========================================  ==================================================
case                                       answer (:class:`LogUnavailable`, so 503)
=========================================  ==================================================
not connected (the raw topic's metadata    ``unavailable``, ``Retry-After: 2``; a background
cannot be read: broker away, no ACL, no    probe retries with backoff; librdkafka reporting
topic; or every broker went away)          every broker down starts it again
more than ``max_inflight_bytes`` of         ``full``, ``Retry-After: 1``, at once: the
records produced and not yet acknowledged  request is not produced at all (librdkafka's own
(or librdkafka's queue is full)            queue full mid-request: the same answer)
no acknowledgement of every record within  ``timeout``, ``Retry-After: 2``; librdkafka gives
``timeout_seconds`` (``message.timeout``)  up on them by then; what is still in flight stays
                                           counted against the bound until it is reported
the broker refused a record                ``unavailable``, ``Retry-After: 1``
a fatal error (the idempotent producer     ``unavailable`` until the background probe has
cannot go on: no IdempotentWrite ACL, a    replaced the producer (with its backoff) and read
sequence the broker rejects)               the topic again
=========================================  ==================================================

The API does not create topics (the worker does, or an admin):
``allow.auto.create.topics`` is off, and an unknown raw topic leaves the route
unconnected (503 ``unavailable``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from stepstream.api.event_log import LogUnavailable, Record
from stepstream.errors import ConfigError
from stepstream.kafka.connection import KafkaConnection
from stepstream.metrics import IngestMetrics

__all__ = ["KafkaEventLog", "producer_config"]

log = logging.getLogger("stepstream.api.ingest")
client_log = logging.getLogger("stepstream.api.ingest.librdkafka")

_STOP_SECONDS = 5.0
_POLL_SECONDS = 0.1
_PROBE_SECONDS = 5.0


def producer_config(
    connection: KafkaConnection, *, timeout_seconds: float, max_inflight_bytes: int, max_request_bytes: int
) -> dict[str, Any]:
    """The producer's librdkafka configuration (module docstring); holds the password."""
    timeout_ms = max(1000, int(timeout_seconds * 1000))
    config = connection.librdkafka_config()
    config.update({
        "client.id": "stepstream-api-ingest",
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": "murmur2_random",
        "allow.auto.create.topics": False,
        # A request waits for its acks: what other requests produce meanwhile shares the
        # next produce request; 2 ms adds little to a request's latency.
        "linger.ms": 2,
        "message.timeout.ms": timeout_ms,
        "request.timeout.ms": min(30_000, timeout_ms),
        "message.max.bytes": max_request_bytes,
        # The route's own bound (max_inflight_bytes) answers first; librdkafka's queue is
        # only the backstop (a BufferError is answered ``full`` all the same).
        "queue.buffering.max.kbytes": min(2_097_151, 2 * max_inflight_bytes // 1024 + 1024),
        "queue.buffering.max.messages": 1_000_000,
    })  # fmt: skip
    return config


class _Delivery:
    """One request's records in flight. :meth:`reported` runs on the polling thread
    (the only writer of ``reports`` and ``error``); everything else on the loop."""

    __slots__ = ("owner", "producer", "loop", "future", "size", "expected", "reports", "error", "finished")

    def __init__(self, owner: KafkaEventLog, producer: Any, loop: asyncio.AbstractEventLoop, size: int) -> None:
        self.owner = owner
        self.producer = producer
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.size = size
        self.expected: int | None = None  # set once every record was handed to librdkafka
        self.reports = 0
        self.error: Any = None  # the first KafkaError reported
        self.finished = False

    def reported(self, error: Any, _message: Any) -> None:
        if error is not None and self.error is None:
            self.error = error
        self.reports += 1
        expected = self.expected
        if expected is not None and self.reports >= expected:
            try:
                self.loop.call_soon_threadsafe(self.finish)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    def produced(self, count: int) -> None:
        """``count`` records were handed over; finish now if all were already reported."""
        self.expected = count
        if self.reports >= count:
            self.finish()

    def finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        self.owner._pending.discard(self)
        self.owner._release(self.size)
        if not self.future.done():
            self.future.set_result(None)


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
        self._config = producer_config(  # a TLS file that cannot be read raises here, at start
            connection,
            timeout_seconds=timeout_seconds,
            max_inflight_bytes=max_inflight_bytes,
            max_request_bytes=max_request_bytes,
        )
        self.topic = topic
        self._metrics = metrics
        self._timeout = timeout_seconds
        self._max_inflight = max_inflight_bytes
        self._describe = connection.describe()
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._producer: Any = None  # built by start(); replaced after a fatal error
        self._poller: threading.Thread | None = None
        self._polling = False
        self._connected = False
        self._fatal = False  # a fatal error was reported: _connect replaces the producer
        self._retired: set[asyncio.Task[None]] = set()  # replaced producers, flushing
        self._pending: set[_Delivery] = set()  # requests' records not all reported yet
        self._inflight = 0
        self._connector: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = asyncio.Event()  # set by close(): wakes the connector's backoff

    @property
    def connected(self) -> bool:
        return self._connected

    # -- the producer and its polling thread ---------------------------------------------

    def _new_producer(self) -> Any:
        from confluent_kafka import KafkaException, Producer

        built: list[Any] = []  # the error callback names its own producer (a replaced one's are ignored)
        config = dict(self._config, error_cb=lambda error: self._client_error(built[0], error), logger=client_log)
        self.connection.check_protocol(config["security.protocol"].upper(), "the API's ingest producer")
        try:
            built.append(Producer(config))
        except KafkaException as exc:  # e.g. a CA or key librdkafka cannot load
            raise ConfigError(f"the API's ingest producer cannot be built ({_reason(exc)})") from None
        return built[0]

    def _start_polling(self, producer: Any) -> None:
        from confluent_kafka import KafkaException

        self._polling = True

        def poll() -> None:  # serves the delivery reports and error_cb, off the loop
            while self._polling and self._producer is producer:
                try:
                    producer.poll(_POLL_SECONDS)
                except KafkaException as exc:  # poll raises a fatal error too: the loop replaces the producer
                    self._client_error(producer, exc.args[0])
                    time.sleep(_POLL_SECONDS)

        self._poller = threading.Thread(target=poll, name="stepstream-ingest-poll", daemon=True)
        self._poller.start()

    async def _stop_polling(self) -> None:
        self._polling = False
        poller, self._poller = self._poller, None
        if poller is not None:
            await asyncio.to_thread(poller.join, _POLL_SECONDS * 10)

    async def start(self) -> None:
        """Build the producer (a :class:`~stepstream.errors.ConfigError` here stops
        ``stepstream api`` at once, as every other client does), then probe the raw
        topic in the background."""
        self._closing = False
        self._closed = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        if self._producer is None:
            self._producer = self._new_producer()
            self._start_polling(self._producer)
        self._probe()

    def _probe(self) -> None:
        if self._connector is None or self._connector.done():
            self._connector = asyncio.create_task(self._connect(), name="stepstream-ingest-connect")

    async def _connect(self) -> None:
        """Read the raw topic's metadata until it is there (the broker answers, the
        principal may see the topic, the topic exists); then the route is connected. A
        producer that had a fatal error is replaced first, at this loop's pace."""
        backoff = 0.25
        while not self._closing:
            if self._fatal:
                self._replace()
            producer = self._producer
            why = await asyncio.to_thread(_topic_problem, producer, self.topic)
            if self._closing or producer is not self._producer:
                return
            if why is None and not self._fatal:
                self._connected = True
                self._metrics.connected.set(1)
                log.warning("ingest: producing to %s on %s", self.topic, self._describe)
                return
            log.warning("ingest: the producer to Kafka %s cannot reach %s (%s): the route answers 503; "
                        "retrying in %.1fs", self._describe, self.topic, why or "fatal error", backoff)  # fmt: skip
            try:
                await asyncio.wait_for(self._closed.wait(), backoff)
            except TimeoutError:
                pass
            backoff = min(backoff * 2, 5.0)

    def _client_error(self, producer: Any, error: Any) -> None:
        client_error(self._loop, error, self._lost, producer)

    def _lost(self, producer: Any, code: int, fatal: bool) -> None:
        from confluent_kafka import KafkaError

        if self._closing or producer is not self._producer:
            return
        if fatal:  # the idempotent producer cannot go on: refuse at once, replace it in _connect
            self._fatal = True
            self._connected = False
            self._metrics.connected.set(0)
            self._probe()
        elif code == KafkaError._ALL_BROKERS_DOWN and self._connected:
            self._connected = False
            self._metrics.connected.set(0)
            self._probe()

    def _replace(self) -> None:
        """Drop a producer that cannot go on; its records are reported failed (purged)."""
        old = self._producer
        self._fatal = False
        self._producer = self._new_producer()  # the old poller ends: it polls only the current one
        self._start_polling(self._producer)
        if old is not None:  # so the bytes of its records are released
            task = asyncio.get_running_loop().create_task(self._retire(old, purge=True))
            self._retired.add(task)
            task.add_done_callback(self._retired.discard)

    async def close(self) -> None:
        """Wait (at most 5 s) for what is in flight, then stop polling."""
        self._closing = True
        self._closed.set()
        connector = self._connector
        if connector is not None and not connector.done():
            await asyncio.wait({connector}, timeout=_STOP_SECONDS + _PROBE_SECONDS)
        self._connected = False
        self._metrics.connected.set(0)
        producer = self._producer
        await self._stop_polling()
        self._producer = None
        if producer is not None:
            await self._retire(producer)
        if self._retired:  # replaced producers still flushing (each for at most 5 s)
            await asyncio.wait(set(self._retired), timeout=_STOP_SECONDS + 1)

    async def _retire(self, producer: Any, *, purge: bool = False) -> None:
        """Flush a producer that is done with (for at most 5 s); what it never reported
        (a fatal producer may report nothing) is settled as failed, so its bytes are
        released and a request still waiting is answered."""
        from confluent_kafka import KafkaError

        await asyncio.to_thread(_flush, producer, _STOP_SECONDS, purge=purge)
        for delivery in [d for d in self._pending if d.producer is producer]:
            if delivery.error is None:
                delivery.error = KafkaError(KafkaError._PURGE_INFLIGHT)
            delivery.finish()

    # -- appending -----------------------------------------------------------------------

    def _release(self, size: int) -> None:
        self._inflight -= size
        self._metrics.inflight_bytes.set(self._inflight)

    async def append(
        self, records: Sequence[Record], *, topic: str | None = None, headers: Sequence[tuple[str, bytes]] = ()
    ) -> None:
        """Produce ``records`` in order, to ``topic`` (default: the raw topic) with
        ``headers`` on each, and return once each is acknowledged (module docstring).
        A ``None`` key: librdkafka's random partition."""
        from confluent_kafka import KafkaException

        producer = self._producer
        if producer is None or not self._connected:
            raise LogUnavailable("Kafka is not connected", cause="unavailable", retry_after=2)
        target = topic or self.topic
        header_list = list(headers) or None
        extra = sum(len(name) + len(value) for name, value in headers)
        total = sum(len(key or b"") + len(value) for key, value in records) + extra * len(records)
        if self._inflight + total > self._max_inflight and self._inflight > 0:
            raise LogUnavailable("the producer is full", cause="full", retry_after=1)
        self._inflight += total
        self._metrics.inflight_bytes.set(self._inflight)
        started = self._clock()
        delivery = _Delivery(self, producer, asyncio.get_running_loop(), total)
        self._pending.add(delivery)
        produced = 0
        refusal: BaseException | None = None
        report = delivery.reported
        produce = producer.produce
        try:
            for key, value in records:
                produce(target, value, key, on_delivery=report, headers=header_list)
                produced += 1
        except BufferError:
            refusal = LogUnavailable("the producer is full", cause="full", retry_after=1)
        except KafkaException as exc:
            refusal = exc
        delivery.produced(produced)
        if refusal is not None:
            self._refused("refused" if isinstance(refusal, KafkaException) else "full", refusal)
        try:
            async with asyncio.timeout(self._timeout):
                await asyncio.shield(delivery.future)  # the deadline cancels the wait, not the delivery
        except TimeoutError:
            self._metrics.produce_failures.labels("timeout").inc()
            raise LogUnavailable(
                f"Kafka did not acknowledge every event within {self._timeout:g}s", cause="timeout", retry_after=2
            ) from None
        if delivery.error is not None:
            self._refused("timeout" if _timed_out(delivery.error) else "refused", delivery.error)
        self._metrics.produce_latency.observe(self._clock() - started)

    def _refused(self, cause: str, error: BaseException | Any) -> None:
        """Raise the 503 for a record librdkafka would not take or the broker refused."""
        if isinstance(error, LogUnavailable):  # librdkafka's queue is full: not a refusal
            raise error
        self._metrics.produce_failures.labels(cause).inc()
        if cause == "timeout":
            raise LogUnavailable(
                f"Kafka did not acknowledge every event within {self._timeout:g}s", cause="timeout", retry_after=2
            )
        name = _reason(error)
        log.warning("ingest: Kafka refused a record (%s)", name)
        raise LogUnavailable(f"Kafka refused the events ({name})", cause="unavailable", retry_after=1)


def client_error(loop: asyncio.AbstractEventLoop | None, error: Any, lost: Callable[..., None], *args: Any) -> None:
    """librdkafka's error callback (polling thread): logs the name only, never a text
    that might quote the configuration, and calls ``lost(*args, code, fatal)`` on the
    loop (not once the loop is closed)."""
    log.warning("ingest: Kafka client error %s%s", error.name(), " (fatal)" if error.fatal() else "")
    if loop is not None:
        try:
            loop.call_soon_threadsafe(lost, *args, error.code(), error.fatal())
        except RuntimeError:  # the loop is closed
            pass


def _topic_problem(producer: Any, topic: str) -> str | None:
    """Why the producer cannot produce to ``topic`` now (a short name), or ``None``."""
    from confluent_kafka import KafkaException

    try:
        metadata = producer.list_topics(topic, timeout=_PROBE_SECONDS)
    except KafkaException as exc:
        return _reason(exc)
    described = metadata.topics.get(topic)
    if described is None:
        return "no metadata"
    if described.error is not None:
        return str(described.error.name())
    if not described.partitions:
        return "no partitions"
    return None


def _timed_out(error: Any) -> bool:
    from confluent_kafka import KafkaError

    return error.code() in (KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT)


def _reason(error: Any) -> str:
    """A KafkaError's or KafkaException's name, never its text."""
    inner = error.args[0] if getattr(error, "args", None) else error
    name = getattr(inner, "name", None)
    return str(name()) if callable(name) else type(error).__name__


def _flush(producer: Any, seconds: float, *, purge: bool = False) -> None:
    """Serve the last delivery reports (after dropping what is queued, with ``purge``).
    A producer that had a fatal error raises it from ``flush``: said, not raised (the
    caller settles what it did not report)."""
    from confluent_kafka import KafkaException

    try:
        if purge:
            producer.purge()
        left = producer.flush(seconds)
    except KafkaException as exc:
        log.warning("ingest: the producer stopped with %s", _reason(exc))
        return
    if left:
        log.warning("ingest: %d record(s) still unacknowledged when the producer stopped", left)
