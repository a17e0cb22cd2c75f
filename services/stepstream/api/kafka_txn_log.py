"""The ingest route's transactional :class:`~stepstream.api.event_log.EventLog` on
Kafka, with ``--ingest-transactions`` (``STEPSTREAM_INGEST_TRANSACTIONS``; off by
default: the idempotent :class:`~stepstream.api.kafka_log.KafkaEventLog` serves then).

A request lands whole or not at all: its records are produced inside a Kafka
**transaction**, and 202 is answered only once that transaction is committed (the
worker reads ``read_committed``, so what an aborted transaction wrote is never folded).
Transactions are shared (group commit): the requests that arrive while one transaction
commits are produced into the next one, and are answered together when it commits.

Each API process keeps ``producers`` (3) transactional librdkafka producers
(confluent-kafka), each a *slot*. One commits at a time while another collects the
requests that arrive meanwhile, so requests never wait for a commit they are not in;
the third lets each producer rest one round between its transactions: a transaction
begun before the coordinator has written the previous one's markers is refused its
partitions (``CONCURRENT_TRANSACTIONS``) and librdkafka retries some 20 ms later,
which would add that to every request. The slot idle the longest is opened next. A slot's ``transactional.id`` is
``{prefix}-{hostname}-{pid}-{log}-{slot}`` (``STEPSTREAM_INGEST_TRANSACTIONAL_ID``,
default ``stepstream-api``; ``log`` counts the event logs of one process, 0 for the
API's only one): distinct for two processes (two hosts, or two pids on one host), and
the same for a container that restarts in its pod (hostname kept, pid 1), whose first
``init_transactions`` then aborts what its predecessor left open. A transaction left
open by a process that died otherwise blocks the records after it on its partitions
(``read_committed`` readers wait at the last stable offset) until the transaction
coordinator aborts it, ``transaction.timeout.ms`` (``2 x timeout + 5 s``, 25 s) later.

Producers are built from the Kafka connection value
(:meth:`~stepstream.kafka.connection.KafkaConnection.librdkafka_config`), so TLS and
SASL apply as to every other client: idempotent (transactions imply it), ``acks=all``,
keys to ``murmur2(key) mod partitions`` (``partitioner=murmur2_random``: Kafka's default
rule, the one of :func:`~stepstream.ingest.routing.default_partition`; librdkafka's own
default hashes with CRC32). Records are produced in body order; a run's records share a
key (``{company}/{run}``), hence a partition, so they land in order.

Policy, by case:

=========================================  ==================================================
case                                       answer (:class:`LogUnavailable`, so 503)
=========================================  ==================================================
not connected (a slot's ``init_transactions``  ``unavailable``, ``Retry-After: 2``; a background
or the raw topic's metadata fails: broker  probe retries with backoff; librdkafka reporting
away, no ACL, no topic; every broker gone) every broker down starts it again
more than ``max_inflight_bytes`` of         ``full``, ``Retry-After: 1``, at once: the
records produced and not yet committed     request is not produced at all (librdkafka's
                                           queue full mid-request: the transaction it was
                                           in is aborted, and all of its requests too)
the transaction does not commit within     ``timeout``, ``Retry-After: 2``; it is aborted
``timeout_seconds``                        (what it wrote is never read), and the slot's
                                           producer replaced
the broker refused a record, or the        ``unavailable``, ``Retry-After: 1``; aborted,
commit failed                              and the slot's producer replaced
a fatal error (fenced by another producer  ``unavailable`` for the requests of that slot;
with the same id, no ACL)                  the slot is rebuilt by the background probe
=========================================  ==================================================

A producer whose transaction was aborted after a broker error is replaced, not reused
(its idempotence sequence numbers may disagree with the broker's after the abort:
``OUT_OF_ORDER_SEQUENCE_NUMBER``); the new producer's ``init_transactions`` with the
same id fences the old one and aborts whatever it left open. Only a transaction aborted
because librdkafka's own queue was full keeps its producer.

A 503 after a commit that timed out says nothing certain: the coordinator may still
have committed it. Then the request landed whole, and the client's retry lands once
downstream (the worker skips a run's ``seq`` it already applied). What is never
possible is half a request.

**Markers a restarted broker drops.** A commit is acknowledged once the coordinator
has logged it (``PREPARE_COMMIT``); it writes the commit markers into the data
partitions just after. A broker killed in between sends them again when it restarts,
but the broker (seen on Kafka 4.3.1, the pinned one: its metadata cache answers for a
partition whose leader is offline as for a deleted one) drops the markers of a
partition that has no leader at that moment, which a single-replica partition has
while its restarted broker waits to be unfenced, and logs the transaction complete.
The partition then holds a transaction that nothing ends: its last stable offset stays
at the transaction's first record, and ``read_committed`` readers (the worker) read
that partition no further. Only a later marker of the same producer on that partition
ends it (an abort marker would abort records answered 202). So each slot remembers the
last record of each key of its last commit, and once a broker connection was lost or
a commit timed out, the slot that committed last (and any that committed within a
transaction timeout before it) *reseals*: once connected again, before it takes
requests, it commits a transaction of its own holding one of those records per
partition (the last of its keys there). Its commit marker ends the hanging
transaction, committed, as the coordinator had decided. The resealed records are
duplicates, which the worker skips (a run's ``seq`` it already applied); records
without a key (OTLP) are not resealed. A reseal that fails is never aborted: its
producer is replaced and the reseal tried again (``stepstream_ingest_transactions_total
{outcome="resealed"}`` counts them). An API process that dies in the same outage
cannot reseal: ``kafka-transactions.sh find-hanging`` shows such a transaction
(docs/operations.md).

The API does not create topics (the worker does, or an admin):
``allow.auto.create.topics`` is off, and an unknown raw topic leaves the route
unconnected (503 ``unavailable``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from stepstream.api.event_log import LogUnavailable, Record
from stepstream.api.kafka_log import _reason, _topic_problem, client_error, producer_config
from stepstream.errors import ConfigError
from stepstream.ingest.routing import default_partition
from stepstream.kafka.connection import KafkaConnection
from stepstream.metrics import IngestMetrics

__all__ = ["DEFAULT_TRANSACTIONAL_ID", "TransactionalEventLog", "transactional_config", "transactional_ids"]

log = logging.getLogger("stepstream.api.ingest")
client_log = logging.getLogger("stepstream.api.ingest.librdkafka")

DEFAULT_TRANSACTIONAL_ID = "stepstream-api"
_STOP_SECONDS = 5.0
_POLL_SECONDS = 0.05
_PROBE_SECONDS = 5.0


def transactional_config(
    connection: KafkaConnection, *, timeout_seconds: float, max_inflight_bytes: int, max_request_bytes: int
) -> dict[str, Any]:
    """A slot producer's librdkafka configuration: the idempotent producer's
    (:func:`~stepstream.api.kafka_log.producer_config`), and a transaction open while
    its slot collects (while one other slot commits) and while it commits: two
    timeouts; the coordinator aborts it past ``transaction.timeout.ms``. Holds the
    password."""
    config = producer_config(connection, timeout_seconds=timeout_seconds, max_inflight_bytes=max_inflight_bytes,
                             max_request_bytes=max_request_bytes)  # fmt: skip
    config["transaction.timeout.ms"] = 2 * config["message.timeout.ms"] + 5000
    return config


_instances = itertools.count()  # the event logs built in this process


def transactional_ids(
    prefix: str, count: int, *, host: str | None = None, pid: int | None = None, instance: int = 0
) -> list[str]:
    """The slots' ``transactional.id`` values: ``{prefix}-{host}-{pid}-{instance}-{slot}``."""
    host = (host or socket.gethostname() or "host").replace(" ", "_")
    pid = os.getpid() if pid is None else pid
    return [f"{prefix}-{host}-{pid}-{instance}-{slot}" for slot in range(count)]


class _Group:
    """The requests produced into one transaction, answered together: a future each,
    resolved with ``None`` (committed) or the :class:`LogUnavailable` to raise."""

    __slots__ = ("waiters", "size", "doomed", "last")

    def __init__(self) -> None:
        self.waiters: list[asyncio.Future[LogUnavailable | None]] = []
        self.size = 0
        self.doomed: LogUnavailable | None = None  # a record of it was not taken: abort
        self.last: _LastRecords = {}  # what a reseal re-produces, should this commit lose its markers


# The last record of each key of a transaction: ``(topic, key) -> (value, headers)``.
_LastRecords = dict[tuple[str, bytes], tuple[bytes, list[tuple[str, bytes]] | None]]


class _Slot:
    """One transactional producer. ``ready``: its transactions are initialized; ``group``:
    the transaction it has open (collecting, or committing while ``committing``);
    ``broken``: the producer must be replaced before it is used again; ``committed``:
    the last record of each key of its last committed transaction (``committed_at``),
    resealed while ``seal_due``."""

    __slots__ = ("transactional_id", "producer", "generation", "ready", "broken", "committing", "group", "idle_since",
                 "committed", "committed_at", "seal_due")  # fmt: skip

    def __init__(self, transactional_id: str) -> None:
        self.transactional_id = transactional_id
        self.producer: Any = None
        self.generation = 0  # bumped with each producer: a replaced one's callbacks are ignored
        self.ready = False
        self.broken = False
        self.committing = False
        self.group: _Group | None = None
        self.idle_since = 0.0  # when its last transaction ended
        self.committed: _LastRecords = {}
        self.committed_at = 0.0
        self.seal_due = False


class TransactionalEventLog:
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
        transactional_id: str = DEFAULT_TRANSACTIONAL_ID,
        producers: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if producers < 1:
            raise ValueError("producers must be at least 1")
        self.connection = connection
        self._config = transactional_config(  # a TLS file that cannot be read raises here, at start
            connection,
            timeout_seconds=timeout_seconds,
            max_inflight_bytes=max_inflight_bytes,
            max_request_bytes=max_request_bytes,
        )
        self.topic = topic
        self._metrics = metrics
        self._timeout = timeout_seconds
        self._transaction_seconds = self._config["transaction.timeout.ms"] / 1000
        self._max_inflight = max_inflight_bytes
        self._describe = connection.describe()
        self._clock = clock
        ids = transactional_ids(transactional_id, producers, instance=next(_instances))
        self._slots = [_Slot(tid) for tid in ids]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poller: threading.Thread | None = None
        self._polling = False
        self._connected = False
        self._open: _Slot | None = None  # the slot whose transaction takes new requests
        self._committing = 0
        self._freed = asyncio.Event()  # set whenever a slot finished committing
        self._tasks: set[asyncio.Task[Any]] = set()  # commits, and replaced producers being dropped
        self._inflight = 0
        self._connector: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = asyncio.Event()  # set by close(): wakes the connector's backoff

    @property
    def connected(self) -> bool:
        return self._connected

    # -- the producers and their polling thread ------------------------------------------

    def _new_producer(self, slot: _Slot) -> Any:
        from confluent_kafka import KafkaException, Producer

        slot.generation += 1
        generation = slot.generation
        config = dict(
            self._config,
            **{"transactional.id": slot.transactional_id},
            error_cb=lambda error: self._client_error(slot, generation, error),
            logger=client_log,
        )
        self.connection.check_protocol(config["security.protocol"].upper(), "the API's ingest producer")
        try:
            return Producer(config)
        except KafkaException as exc:  # e.g. a CA or key librdkafka cannot load
            raise ConfigError(f"the API's ingest producer cannot be built ({_reason(exc)})") from None

    def _start_polling(self) -> None:
        from confluent_kafka import KafkaException

        self._polling = True
        slots = self._slots

        def poll() -> None:  # serves error_cb and the logs, off the loop
            while self._polling:
                for slot in slots:
                    producer = slot.producer
                    if producer is None:
                        continue
                    try:
                        producer.poll(0)
                    except KafkaException as exc:  # a fatal error: the slot is replaced
                        self._client_error(slot, slot.generation, exc.args[0])
                time.sleep(_POLL_SECONDS)

        self._poller = threading.Thread(target=poll, name="stepstream-ingest-poll", daemon=True)
        self._poller.start()

    async def _stop_polling(self) -> None:
        self._polling = False
        poller, self._poller = self._poller, None
        if poller is not None:
            await asyncio.to_thread(poller.join, _POLL_SECONDS * 20)

    async def start(self) -> None:
        """Build the producers (a :class:`~stepstream.errors.ConfigError` here stops
        ``stepstream api`` at once, as every other client does), then initialize their
        transactions and probe the raw topic in the background."""
        self._closing = False
        self._closed = asyncio.Event()
        self._freed = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        for slot in self._slots:
            if slot.producer is None:
                slot.producer = self._new_producer(slot)
        if self._poller is None:
            self._start_polling()
        self._probe()

    def _probe(self) -> None:
        if self._closing:
            return
        if self._connector is None or self._connector.done():
            self._connector = asyncio.create_task(self._connect(), name="stepstream-ingest-connect")

    async def _connect(self) -> None:
        """Until every slot is ready: replace the broken producers of idle slots,
        initialize the transactions of the others, and read the raw topic's metadata
        (the broker answers, the principal may see the topic, the topic exists). The
        route is connected once one slot is ready and the topic was read."""
        backoff = 0.25
        topic_ok = False
        while not self._closing:
            problem: str | None = None
            for slot in self._slots:
                idle = not slot.committing and slot is not self._open
                if slot.broken and idle:
                    self._replace(slot)
                if slot.ready or slot.broken or not idle:
                    continue
                producer, generation = slot.producer, slot.generation
                why, fatal = await asyncio.to_thread(_init_transactions, producer, _PROBE_SECONDS)
                if self._closing:
                    return
                if generation != slot.generation:
                    continue  # replaced meanwhile
                if why is None:
                    slot.ready = True
                else:
                    problem = f"init_transactions: {why}"
                    slot.broken = fatal
            ready = [slot for slot in self._slots if slot.ready]
            if ready and not topic_ok:
                why = await asyncio.to_thread(_topic_problem, ready[0].producer, self.topic)
                if self._closing:
                    return
                topic_ok = why is None
                problem = problem or why
            if topic_ok and ready and not self._connected:
                self._connected = True
                self._metrics.connected.set(1)
                self._freed.set()
                log.warning("ingest: producing to %s on %s (%d transactional producers)", self.topic,
                            self._describe, len(ready))  # fmt: skip
            if self._connected:
                for slot in self._slots:
                    if slot.seal_due and slot.ready and not slot.committing and slot is not self._open:
                        await self._reseal(slot)
                        if self._closing:
                            return
            settled = topic_ok and len(ready) == len(self._slots)
            if settled and not any(slot.seal_due for slot in self._slots):
                return
            if not settled:  # else a reseal waits for its slot's transaction to end, or is tried again
                log.warning("ingest: a producer to Kafka %s cannot reach %s (%s): %s; retrying in %.1fs",
                            self._describe, self.topic, problem or "not ready",
                            "the route answers 503" if not self._connected else "the other producers serve",
                            backoff)  # fmt: skip
            try:
                await asyncio.wait_for(self._closed.wait(), backoff)
            except TimeoutError:
                pass
            backoff = min(backoff * 2, 5.0)

    async def _reseal(self, slot: _Slot) -> None:
        """Re-produce, in a transaction of its own, one record of each partition that
        ``slot``'s suspect commit wrote (module docstring), and commit it: its commit
        marker closes a transaction the broker left without one. The slot takes no
        requests meanwhile. A reseal that produced and did not commit replaces the
        producer (and is tried again with the new one)."""
        producer, generation = slot.producer, slot.generation
        slot.committing = True
        try:
            why, produced = await asyncio.to_thread(_reseal, producer, slot.committed, self._timeout,
                                                    self._transaction_seconds)  # fmt: skip
        finally:
            slot.committing = False
            slot.idle_since = time.monotonic()
            self._freed.set()
        if generation != slot.generation or self._closing:
            return
        if why is None:
            slot.committed, slot.seal_due = {}, False
            self._metrics.transactions.labels("resealed").inc()
            log.warning("ingest: resealed the last commit of %s (%d partition(s)) after a broker failure",
                        slot.transactional_id, produced)  # fmt: skip
            return
        log.warning("ingest: resealing the last commit of %s failed (%s)%s", slot.transactional_id, why,
                    "; replacing its producer" if produced else "; retrying")  # fmt: skip
        if produced:
            slot.broken, slot.ready = True, False

    def _client_error(self, slot: _Slot, generation: int, error: Any) -> None:
        client_error(self._loop, error, self._lost, slot, generation)

    def _lost(self, slot: _Slot, generation: int, code: int, fatal: bool) -> None:
        from confluent_kafka import KafkaError

        if self._closing or generation != slot.generation:
            return
        if fatal:  # this producer cannot go on: not used again; replaced by _connect when idle
            slot.broken, slot.ready = True, False
            if slot is self._open:  # its requests are answered now (the commit fails), not joined by more
                self._schedule(force=True)
            if not any(s.ready for s in self._slots):
                self._disconnected()
            self._probe()
        elif code in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            self._suspect_last_commits()
            if code == KafkaError._ALL_BROKERS_DOWN and self._connected:
                self._disconnected()
            self._probe()

    def _suspect_last_commits(self) -> None:
        """A broker connection was lost, or a commit timed out: the last commits may
        have been acknowledged without their markers written (module docstring,
        "Markers a restarted broker drops"). The slot that committed last, and those
        that committed within a transaction timeout before it, reseal theirs."""
        committed = [slot for slot in self._slots if slot.committed]
        if not committed:
            return
        latest = max(slot.committed_at for slot in committed)
        for slot in committed:
            if slot.committed_at >= latest - self._transaction_seconds:
                slot.seal_due = True

    def _disconnected(self) -> None:
        self._connected = False
        self._metrics.connected.set(0)
        self._freed.set()  # requests waiting for a slot answer 503 now

    def _replace(self, slot: _Slot) -> None:
        """A new producer for an idle ``slot``, with the same ``transactional.id``: its
        ``init_transactions`` fences the old one and aborts what that left open. The old
        one is dropped off the loop (what it still queues is purged, never sent)."""
        old = slot.producer
        slot.producer = self._new_producer(slot)
        slot.broken, slot.ready = False, False
        if old is not None:
            self._track(asyncio.get_running_loop().create_task(asyncio.to_thread(_drop, [old])))

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Commit what is open and wait for every commit (each within the timeout), then
        stop polling and drop the producers."""
        self._closing = True
        self._closed.set()
        connector = self._connector
        if connector is not None and not connector.done():
            await asyncio.wait({connector}, timeout=_STOP_SECONDS + _PROBE_SECONDS)
        self._schedule(force=True)  # the requests of the open transaction are waiting for it
        commits = set(self._tasks)
        if commits:
            await asyncio.wait(commits, timeout=self._timeout * 2 + _STOP_SECONDS)
        self._disconnected()
        await self._stop_polling()
        producers = [slot.producer for slot in self._slots if slot.producer is not None]
        for slot in self._slots:
            slot.producer, slot.ready = None, False
        await asyncio.to_thread(_drop, producers)

    # -- appending -----------------------------------------------------------------------

    def _release(self, size: int) -> None:
        self._inflight -= size
        self._metrics.inflight_bytes.set(self._inflight)

    async def append(
        self, records: Sequence[Record], *, topic: str | None = None, headers: Sequence[tuple[str, bytes]] = ()
    ) -> None:
        """Produce ``records`` in order, to ``topic`` (default: the raw topic) with
        ``headers`` on each, inside the open transaction, and return once it is committed
        (module docstring). A ``None`` key: librdkafka's random partition."""
        from confluent_kafka import KafkaException

        if not self._connected:
            raise LogUnavailable("Kafka is not connected", cause="unavailable", retry_after=2)
        loop = asyncio.get_running_loop()
        started = self._clock()
        slot = self._open or await self._open_slot(loop.time() + self._timeout)
        target = topic or self.topic
        header_list = list(headers) or None
        extra = sum(len(name) + len(value) for name, value in headers)
        total = sum(len(key or b"") + len(value) for key, value in records) + extra * len(records)
        if self._inflight + total > self._max_inflight and self._inflight > 0:
            raise LogUnavailable("the producer is full", cause="full", retry_after=1)
        group = slot.group
        assert group is not None
        produced = 0
        produce = slot.producer.produce
        last = group.last
        try:
            for key, value in records:
                produce(target, value, key, headers=header_list)
                produced += 1
                if key is not None:
                    last[target, key] = value, header_list
        except BufferError:
            refusal = LogUnavailable("the producer is full", cause="full", retry_after=1)
            if not produced:
                raise refusal from None
            group.doomed = refusal  # half of this request is in the transaction: abort it all
        except KafkaException as exc:
            refusal = self._refusal("refused", exc)
            if not produced:
                raise refusal from None
            group.doomed = refusal
        self._inflight += total
        self._metrics.inflight_bytes.set(self._inflight)
        group.size += total
        answer: asyncio.Future[LogUnavailable | None] = loop.create_future()
        group.waiters.append(answer)
        self._schedule()
        try:
            # The commit itself is bounded by the timeout; one second more lets its own
            # answer (committed, or the reason it was not) come first.
            async with asyncio.timeout(self._timeout + 1):
                error = await asyncio.shield(answer)  # the deadline cancels the wait, not the transaction
        except TimeoutError:
            self._metrics.produce_failures.labels("timeout").inc()
            raise LogUnavailable(
                f"Kafka did not commit the events within {self._timeout:g}s", cause="timeout", retry_after=2
            ) from None
        if error is not None:
            raise error
        self._metrics.produce_latency.observe(self._clock() - started)

    async def _open_slot(self, deadline: float) -> _Slot:
        """The slot that takes new records: the open one, else a ready idle slot, whose
        transaction begins now; else wait (until ``deadline``) for a commit to end."""
        from confluent_kafka import KafkaException

        loop = asyncio.get_running_loop()
        while True:
            if self._open is not None:
                return self._open
            if not self._connected:
                raise LogUnavailable("Kafka is not connected", cause="unavailable", retry_after=2)
            # The slot idle the longest: its last commit's markers are most likely written
            # (a transaction begun before they are waits for the coordinator: about 20 ms).
            for slot in sorted(self._slots, key=lambda s: s.idle_since):
                if slot.ready and not slot.committing and slot.group is None and not slot.seal_due:
                    try:
                        slot.producer.begin_transaction()  # local: no broker round trip
                    except KafkaException as exc:
                        log.warning("ingest: begin_transaction failed (%s): replacing the producer", _reason(exc))
                        slot.broken, slot.ready = True, False
                        self._probe()
                        continue
                    slot.group = _Group()
                    self._open = slot
                    return slot
            remaining = deadline - loop.time()
            if remaining <= 0:
                self._metrics.produce_failures.labels("timeout").inc()
                raise LogUnavailable(
                    f"no transaction could begin within {self._timeout:g}s", cause="timeout", retry_after=2
                )
            self._freed.clear()
            try:
                await asyncio.wait_for(self._freed.wait(), remaining)
            except TimeoutError:
                pass

    def _schedule(self, *, force: bool = False) -> None:
        """Commit the open transaction now if no other commit is running (or with
        ``force``); else it keeps collecting until that commit ends. One commit at a
        time makes the transactions as large as the commit's round trips allow, which
        is what costs the broker least (on a broker sharing two cores with the API, its
        CPU per transaction is what bounds the rate)."""
        slot = self._open
        if slot is None or slot.group is None or not slot.group.waiters:
            return
        if not force and self._committing:
            return
        self._open = None
        slot.committing = True
        self._committing += 1
        assert self._loop is not None
        self._track(self._loop.create_task(self._commit(slot, slot.group), name="stepstream-ingest-commit"))

    async def _commit(self, slot: _Slot, group: _Group) -> None:
        """Commit (or, for a doomed group, abort) ``slot``'s transaction and answer its
        requests; a transaction aborted after a broker error replaces the producer."""
        producer = slot.producer
        error: LogUnavailable | None = group.doomed
        replace = False
        broker_lost = False  # the commit timed out: the broker may have died after earlier commits
        try:
            if error is None:
                failure = await asyncio.to_thread(_commit_transaction, producer, self._timeout)
                if failure is not None:
                    name, fatal, timed_out = failure
                    broker_lost = timed_out
                    error = self._refusal("timeout" if timed_out else "refused", name, len(group.waiters))
                    replace = True
            if error is not None:
                why = await asyncio.to_thread(_abort_transaction, producer, self._timeout)
                replace = replace or why is not None or error.cause != "full"
                self._metrics.transactions.labels("aborted").inc()
                log.warning("ingest: a transaction of %d request(s) was aborted (%s)%s", len(group.waiters),
                            error.cause, "; replacing its producer" if replace else "")  # fmt: skip
            else:
                self._metrics.transactions.labels("committed").inc()
                # While a reseal is due, what it must re-produce stays: this commit may not cover its partitions.
                slot.committed = {**slot.committed, **group.last} if slot.seal_due else group.last
                slot.committed_at = time.monotonic()
        finally:
            slot.committing = False
            slot.group = None
            slot.idle_since = time.monotonic()
            self._committing -= 1
            self._release(group.size)
            for answer in group.waiters:
                if not answer.done():
                    answer.set_result(error)
            if replace:
                slot.broken, slot.ready = True, False
                if not any(s.ready for s in self._slots):
                    self._disconnected()
                self._probe()
            if broker_lost:
                self._suspect_last_commits()
                self._probe()
            self._freed.set()
            if not self._closing:
                self._schedule()

    def _refusal(self, cause: str, error: Any, requests: int = 1) -> LogUnavailable:
        """The 503 for ``requests`` whose transaction did not commit (``cause``: timeout,
        refused), counted; ``error`` is a librdkafka error or its name."""
        self._metrics.produce_failures.labels(cause).inc(requests)
        if cause == "timeout":
            return LogUnavailable(
                f"Kafka did not commit the events within {self._timeout:g}s", cause="timeout", retry_after=2
            )
        name = error if isinstance(error, str) else _reason(error)
        log.warning("ingest: Kafka refused the transaction (%s)", name)
        return LogUnavailable(f"Kafka refused the events ({name})", cause="unavailable", retry_after=1)


def _init_transactions(producer: Any, seconds: float) -> tuple[str | None, bool]:
    """``(None, False)`` once the producer's transactions are initialized, else
    ``(reason, fatal)``."""
    from confluent_kafka import KafkaException

    try:
        producer.init_transactions(seconds)
    except KafkaException as exc:
        error = exc.args[0]
        return _reason(exc), bool(getattr(error, "fatal", lambda: False)())
    return None, False


def _commit_transaction(producer: Any, seconds: float) -> tuple[str, bool, bool] | None:
    """``None`` once committed, else ``(reason, fatal, timed_out)``."""
    from confluent_kafka import KafkaError, KafkaException

    try:
        producer.commit_transaction(seconds)
    except KafkaException as exc:
        error = exc.args[0]
        code = error.code() if hasattr(error, "code") else None
        timed_out = code in (KafkaError._TIMED_OUT, KafkaError._MSG_TIMED_OUT, KafkaError.REQUEST_TIMED_OUT)
        return _reason(exc), bool(getattr(error, "fatal", lambda: False)()), timed_out
    return None


def _reseal(producer: Any, records: _LastRecords, seconds: float, budget: float) -> tuple[str | None, int]:
    """One transaction of one record per partition of ``records`` (the last of its keys
    there), committed: ``(None, partitions)``, else ``(reason, partitions produced)``.
    A commit refused with a retriable error is tried again within ``budget`` seconds
    (never aborted here: an abort marker would abort the records it is resealing)."""
    from confluent_kafka import KafkaException

    partitions: dict[str, int] = {}
    chosen: dict[tuple[str, int], tuple[bytes, bytes, list[tuple[str, bytes]] | None]] = {}
    try:
        for (topic, key), (value, headers) in records.items():
            if topic not in partitions:
                metadata = producer.list_topics(topic, timeout=seconds).topics.get(topic)
                if metadata is None or metadata.error is not None or not metadata.partitions:
                    return f"no metadata for {topic}", 0
                partitions[topic] = len(metadata.partitions)
            chosen[topic, default_partition(key, partitions[topic])] = key, value, headers
        producer.begin_transaction()
    except KafkaException as exc:
        return _reason(exc), 0
    try:
        for (topic, partition), (key, value, headers) in chosen.items():
            producer.produce(topic, value, key, partition=partition, headers=headers)
    except (KafkaException, BufferError) as exc:
        return _reason(exc), len(chosen)
    deadline = time.monotonic() + budget
    while True:
        try:
            producer.commit_transaction(seconds)
            return None, len(chosen)
        except KafkaException as exc:
            error = exc.args[0]
            if not getattr(error, "retriable", lambda: False)() or time.monotonic() > deadline:
                return _reason(exc), len(chosen)


def _abort_transaction(producer: Any, seconds: float) -> str | None:
    """``None`` once aborted (what it wrote is never read committed), else why not."""
    from confluent_kafka import KafkaException

    try:
        producer.abort_transaction(seconds)
    except KafkaException as exc:
        return _reason(exc)
    return None


def _drop(producers: list[Any]) -> None:
    """Purge what each producer still queues (never sent) and destroy it, here, off
    the loop (librdkafka's destroy joins its threads). Takes the list's references."""
    from confluent_kafka import KafkaException

    while producers:
        producer = producers.pop()
        try:
            producer.purge()
            producer.flush(0)
        except KafkaException as exc:
            log.warning("ingest: the producer stopped with %s", _reason(exc))
        del producer
