"""The faust app: a thin shell around :class:`stepstream.pipeline.Pipeline`.

Design (docs/worker.md has the long form):

* Records reach the worker as per-partition batches (:mod:`stepstream.ingest.consumer`);
  each value is decoded once with msgspec. No per-message faust Event, task or ack.
* A record that is not a valid v1 event, whose Kafka key is not
  ``{company_id}/{run_id}`` of the event (``bad_key``), or that the fold refuses
  (``seq_jump``, ``unfoldable``) goes to the dead-letter topic with its original key,
  value and headers plus headers naming the reason and the source, as a bounded copy
  when it could be too large (:mod:`stepstream.ingest.dead_letters`); the broker's
  acknowledgement of the copy is awaited before the batch carrying it is written.
* Commits come from the :class:`~stepstream.pipeline.ledger.Ledger`: per partition, the
  offset after the longest prefix whose effects are durable.
* Store faults follow :mod:`stepstream.pipeline.writer`: retried in place (``/ready``
  503 meanwhile), or the process exits non-zero (:data:`EXIT_STORE_FAILED`) so Kafka
  rewinds; so does a dead-letter copy that is not acknowledged, and any exception on
  the fetch, timer or stop path (never a crash that lets a graceful stop commit past
  records not handled). Failing to open a store exits before anything is consumed.
* Nothing lives in faust tables. On a rebalance the current batch is written, its
  offsets committed, and the folds and holds of revoked partitions are dropped; the
  next owner reloads each run's durable state from the step store and replays from
  the committed offset, which converges because the engine is deterministic and
  every write is idempotent and never moves a run backwards.
* On SIGTERM the batch in hand is written and its offsets committed; the rest of
  faust's stop gets ``stop_grace_seconds``, then the process exits 0 anyway
  (:mod:`stepstream.ingest.stopping` says why). A rebalance during the stop is left to
  the consumer thread, which leaves the group (:class:`StepstreamApp`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faust
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from stepstream import collector
from stepstream.config import Settings
from stepstream.core.fold import Limits
from stepstream.core.wire import decode_event
from stepstream.errors import WireError
from stepstream.ingest.consumer import BatchConsumer, BatchTransport, Records
from stepstream.ingest.dead_letters import DeadLetters
from stepstream.ingest.lag import LagPoller
from stepstream.ingest.routing import RouteCheck
from stepstream.ingest.startup import StartTimes, TablelessManager
from stepstream.pipeline.ledger import Ledger
from stepstream.ingest.stopping import StopDeadline, flush_logs, stopping_services, waiting_threads
from stepstream.kafka.preflight import preflight
from stepstream.kafka.topics import ensure_topics, max_request_bytes, worker_topics
from stepstream.metrics import Metrics
from stepstream.pipeline import NotLoaded, Pipeline, StoreFailed
from stepstream.sinks import open_stores

log = logging.getLogger(__name__)

EXIT_STORE_FAILED = 70  # EX_SOFTWARE: the stores failed under the fault policy; Kafka rewinds
COMMIT_TIMEOUT_SECONDS = 5.0  # a commit on revocation or shutdown; past it the next owner re-reads
# A fetch asks each partition for at most this much (a larger first record batch still
# comes whole), so a fetch of large messages holds about this much per partition
# assigned, not gigabytes (aiokafka's fetch_max_bytes, 50 MiB, caps one broker's answer).
FETCH_PARTITION_BYTES = 1_048_576
PRODUCE_BATCH_BYTES = 524_288


def die(reason: str, exc: BaseException | None = None) -> None:
    """Stop the process now, non-zero. Nothing past the durable watermark was
    committed, so a restart re-reads from there; exiting is the rewind."""
    log.critical("stopping: %s%s", reason, f" ({exc})" if exc is not None else "")
    flush_logs()
    os._exit(EXIT_STORE_FAILED)


async def commit_now(consumer: Any, tps: set[Any] | None = None) -> None:
    """Commit the ledger's watermarks of ``tps`` (default: all) now. faust's ``commit``
    returns without committing when it only waited for a commit already in flight
    (which may carry older watermarks): then it is called once more."""
    if not await consumer.commit(tps):
        await consumer.commit(tps)


class IngestWorker:
    """One worker process: stores, pipeline, ledger and readiness."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        dlq_topic: Any,
        partitions_of: Callable[[str], int | None] = lambda topic: None,
        start_times: StartTimes | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.start_times = start_times if start_times is not None else StartTimes()
        self.start_times.bind(metrics.worker_start)
        self.lock = asyncio.Lock()
        self.ledger = Ledger()
        self.pipeline: Pipeline | None = None
        self._stores: list[Any] = []
        self.dead_letters = DeadLetters(
            dlq_topic,
            max_event_bytes=settings.max_event_bytes,
            budget_seconds=settings.store_retry_seconds,
            confirmed=lambda reason: metrics.dead_letters.labels(reason).inc(),
        )
        self.assigned = False
        self.closed = False
        self.processed = 0
        self.routes = RouteCheck(metrics.misrouted, partitions_of)
        self.otlp: Any = None  # the OTLP topic's stage (ingest/otlp_bridge.py), when one is set

    async def start(self) -> None:
        """Open the stores; any failure here stops the process before anything is consumed."""
        if self.pipeline is not None:
            return
        try:
            steps, deep = await open_stores(self.settings.steps_sink, self.settings.deep, on_clip=self._port_clipped)
        except Exception as exc:  # noqa: BLE001 - every failure to open is fatal, by policy
            die("cannot open the stores", exc)
            raise
        if self.settings.fault_plan:
            from stepstream.sinks.faults import wrap_stores

            steps, deep = wrap_stores(steps, deep, self.settings.fault_plan)
        self._stores = [steps, deep]
        self.pipeline = Pipeline(
            steps,
            deep,
            limits=Limits(idle_seconds=self.settings.idle_flush_seconds),
            metrics=self.metrics,
            ledger=self.ledger,
            batch_records=self.settings.batch_records,
            batch_seconds=self.settings.batch_seconds,
            batch_bytes=self.settings.batch_bytes,
            max_open_runs=self.settings.max_open_runs,
            max_hold_seconds=self.settings.max_hold_seconds,
            retry_seconds=self.settings.store_retry_seconds,
            before_durable=self.dead_letters.confirm,
        )
        self.metrics.store_available.set(1)
        self.start_times.mark("stores")

    def _port_clipped(self, field: str) -> None:
        self.metrics.clipped.labels(field).inc()

    def ready(self, rebalancing: bool) -> bool:
        pipeline = self.pipeline
        return (
            self.assigned
            and not rebalancing
            and not self.closed
            and pipeline is not None
            and pipeline.writer.healthy()
        )

    # -- records ----------------------------------------------------------------

    async def on_records(self, records: Records, current: Any) -> bool:
        """One fetch: every partition's records, in offset order per partition. Returns
        whether some were left undelivered (a rebalance began meanwhile)."""
        skipped = False
        async with self.lock:
            pipeline = self.pipeline
            if self.closed or pipeline is None:
                return False
            try:
                if self.otlp is not None:
                    records = await self._bridge(records, current)
                fetched = {tp: self._decode(tp, batch) for tp, batch in records.items() if batch and current(tp)}
                # The durable states of every run of the fetch, in one wait (not one per partition).
                await pipeline.load(
                    (item[0].company_id, item[0].run_id)
                    for items in fetched.values()
                    for item in items
                    if item[0] is not None
                )
                for tp, batch in records.items():
                    if not batch:
                        continue
                    if tp in fetched and current(tp):
                        await self._deliver(tp, fetched[tp])
                    else:
                        skipped = True
            except StoreFailed as exc:
                die("the stores failed", exc)
            except Exception as exc:  # noqa: BLE001 - a graceful stop would commit past what was not handled
                log.exception("handling a fetch failed")
                die("handling a fetch failed", exc)
            finally:
                pipeline.unstage()  # states loaded for partitions not delivered are not kept
        return skipped

    async def _bridge(self, records: Records, current: Any) -> Records:
        """Bridge the OTLP topic's records (ingest/otlp_bridge.py); the rest are returned.
        A bridged record rides on the open batch, like a dead-lettered one, once the
        broker holds what was produced from it."""
        rest: Records = {}
        bridged: list[tuple[Any, list[Any]]] = []
        acknowledgements: list[Any] = []
        for tp, batch in records.items():
            if tp.topic != self.otlp.topic or not batch or not current(tp):
                rest[tp] = batch
                continue
            expected = self.ledger.next_offset(tp)
            if expected is not None:
                batch = [r for r in batch if r.offset >= expected]  # re-fetched after a seek
            if batch:
                acknowledgements.extend(await self.otlp.send(batch))
                bridged.append((tp, batch))
        # One wait for every partition's events: the producer sends them in a few
        # requests, not one round trip per partition.
        await self.otlp.acknowledged(acknowledgements)
        assert self.pipeline is not None
        for tp, batch in bridged:
            self.ledger.delivered(tp, batch[0].offset, batch[-1].offset)
            self.pipeline.settle(len(batch))
            self.processed += len(batch)
        return rest

    def _decode(self, tp: Any, records: list[Any]) -> list[tuple[Any, Any, str, str]]:
        """The partition's records not delivered yet, in order, each decoded: ``(event,
        record, "", "")`` or, for a record to dead-letter, ``(None, record, reason,
        detail)``. No side effects."""
        expected = self.ledger.next_offset(tp)
        if expected is not None and records[0].offset < expected:
            records = [r for r in records if r.offset >= expected]  # re-fetched after a seek
        max_bytes = self.settings.max_event_bytes
        items: list[tuple[Any, Any, str, str]] = []
        for record in records:
            try:
                event = decode_event(record.value if record.value is not None else b"", max_bytes=max_bytes)
            except WireError as exc:
                items.append((None, record, exc.reason, exc.detail))
                continue
            if record.key != f"{event.company_id}/{event.run_id}".encode():
                items.append((None, record, "bad_key", "the Kafka key is not {company_id}/{run_id} of the event"))
                continue
            items.append((event, record, "", ""))
        return items

    async def _deliver(self, tp: Any, items: list[tuple[Any, Any, str, str]]) -> None:
        if not items:
            return
        pipeline = self.pipeline
        assert pipeline is not None
        ledger = self.ledger
        end = items[-1][1].offset
        ledger.delivered(tp, items[0][1].offset, end)
        self.routes.check(tp.topic, tp.partition, [item[1].key for item in items])
        good: list[tuple[Any, Any]] = []
        for event, record, reason, detail in items:
            if event is None:
                await self._dead_letter(record, reason, detail)
            else:
                good.append((event, record))
        self.processed += len(items)
        if not good:
            return
        last = len(good) - 1
        for i, (event, record) in enumerate(good):
            try:
                try:
                    full = pipeline.apply(event, tp, record.offset, len(record.value))
                except NotLoaded as missing:
                    # The run left memory since this fetch was loaded (it ended or was
                    # evicted, and its batches were written): read its state again.
                    await pipeline.load((missing.key,))
                    full = pipeline.apply(event, tp, record.offset, len(record.value))
            except WireError as exc:
                await self._dead_letter(record, exc.reason, exc.detail)
                continue
            except StoreFailed:
                raise  # from the reload: the store, not the event (on_records exits)
            except Exception as exc:  # noqa: BLE001 - a poison event must not stop the partition
                log.exception("the fold refused %s/%s@%s", record.topic, record.partition, record.offset)
                await self._dead_letter(record, "unfoldable", f"the fold raised {type(exc).__name__}")
                continue
            if full:
                await pipeline.flush(wait=False)
                if i < last:
                    # What follows in this fetch is not in any batch yet: open the next one at it.
                    ledger.delivered(tp, good[i + 1][1].offset, end)

    async def _dead_letter(self, record: Any, reason: str, detail: str) -> None:
        # Raises DeadLetterFailed (a StoreFailed) when the copy cannot be sent: on_records exits.
        await self.dead_letters.send(record, reason, detail)
        assert self.pipeline is not None
        self.pipeline.settle()

    # -- timers, rebalances, shutdown ---------------------------------------------

    async def tick(self) -> None:
        async with self.lock:
            if self.pipeline is not None and not self.closed:
                try:
                    await self.pipeline.tick()
                except StoreFailed as exc:
                    die("the stores failed", exc)
                except Exception as exc:  # noqa: BLE001 - never a crash that a graceful stop follows
                    log.exception("the batch timer failed")
                    die("the batch timer failed", exc)
                if self.pipeline.written_batches and "first_batch" not in self.start_times.phases:
                    self.start_times.mark("first_batch")

    async def revoked(self, consumer: Any, tps: set[Any]) -> None:
        """Write what is batched, commit it, then drop the revoked partitions' runs."""
        self.assigned = False
        async with self.lock:
            if self.pipeline is None or self.closed:
                self.ledger.drop(tps)
                return
            try:
                await self.pipeline.flush()
            except Exception as exc:  # noqa: BLE001 - StoreFailed or not, the batch did not land
                die("the stores failed", exc)
            log.info("revoked %s at watermarks %s", tps, {str(tp): self.ledger.watermark(tp) for tp in tps})
            try:
                await asyncio.wait_for(commit_now(consumer, set(tps)), timeout=COMMIT_TIMEOUT_SECONDS)
            except Exception as exc:  # noqa: BLE001 - the next owner re-reads from the last commit
                log.info("commit on revocation did not complete: %r", exc)
            self.pipeline.drop_partitions(tps)

    async def shutdown(self, consumer: Any) -> None:
        """Write the current batch, commit its offsets and close the stores; nothing is
        delivered or reopened afterwards. The commit waits at most
        :data:`COMMIT_TIMEOUT_SECONDS` (faust's final commit tries again later).
        Unflushed thinking tails stay held: their messages are not committed, so the
        next start replays them."""
        async with self.lock:
            self.closed = True
            if self.pipeline is not None:
                try:
                    await self.pipeline.flush()
                except Exception as exc:  # noqa: BLE001 - StoreFailed or not, the batch did not land
                    die("the stores failed during shutdown", exc)
            for store in self._stores:
                await store.close()
            self._stores = []
            # Committed here, under the lock, so that a rebalance during the stop cannot
            # drop these partitions from the ledger before their watermark is committed.
            marks = {str(tp): self.ledger.watermark(tp) for tp in self.ledger.partitions()}
            try:
                await asyncio.wait_for(commit_now(consumer), timeout=COMMIT_TIMEOUT_SECONDS)
            except Exception as exc:  # noqa: BLE001 - the next owner re-reads from the last commit
                log.warning("commit on shutdown did not complete (%r); watermarks were %s", exc, marks)
            else:
                log.info("shutdown: batch written, watermarks %s committed", marks)


class StepstreamApp(faust.App):
    """faust's App, opening the stores before anything starts (so failing to open
    them stops the worker before it consumes)."""

    stepstream: IngestWorker
    lag_poller: LagPoller

    async def on_first_start(self) -> None:
        await super().on_first_start()
        # Both before anything is consumed, at once (one wait, not two): the stores
        # (a failure exits), and the first lag poll, which gives the misrouted-record
        # check the topic's partition count (ingest.routing) for the very first fetch.
        await asyncio.gather(self.stepstream.start(), self._first_poll())

    async def _first_poll(self) -> None:
        try:
            await self.lag_poller.start()
            await self.lag_poller.poll()
        except Exception as exc:  # noqa: BLE001 - the poll loop tries again
            log.warning("first lag poll failed: %r", exc)

    def _on_rebalance_when_stopped(self) -> None:
        # faust closes the aiokafka consumer here when a rebalance reaches a stopping app,
        # by running the consumer's coroutines on the main loop although they belong to
        # the consumer thread's loop; a worker SIGTERMed while it was joining the group
        # then hung for good once its join completed (partitions assigned, no LeaveGroup,
        # no exit). The consumer thread's own stop closes the consumer on its own loop
        # and leaves the group: nothing is needed here.
        log.info("a rebalance reached the stopping worker; the consumer thread's stop leaves the group")


def create_app(settings: Settings, metrics: Metrics | None = None, start_times: StartTimes | None = None) -> faust.App:
    """Build the faust app from settings. Nothing happens at import time."""
    metrics = metrics or Metrics()
    app = StepstreamApp(
        settings.app_id,
        broker=settings.kafka.faust_broker,
        broker_credentials=settings.kafka.faust_credentials(),
        key_serializer="raw",
        value_serializer="raw",
        store="memory://",
        topic_partitions=settings.partitions,
        topic_allow_declare=False,
        topic_disable_leader=True,
        # No tables: faust's table manager would sleep 1 s before the consumer subscribes.
        TableManager=TablelessManager,
        consumer_auto_offset_reset="earliest",
        consumer_max_fetch_size=FETCH_PARTITION_BYTES,
        # Above the largest dead-letter copy (ingest/dead_letters.py); faust's default
        # (1,000,000) is below max_event_bytes.
        producer_max_request_size=max_request_bytes(settings.max_event_bytes),
        # The OTLP stage produces thousands of events per fetch to the raw topic; faust's
        # default batch (16 KiB, about 35 events) made that one broker round trip per 35
        # events. Below the raw topic's default max.message.bytes (1 MiB).
        producer_max_batch_size=PRODUCE_BATCH_BYTES,
        stream_wait_empty=False,
        broker_commit_interval=1.0,
        broker_session_timeout=settings.session_timeout_seconds,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_seconds / 3),
        web_enabled=True,
        web_bind=settings.web_host,
        web_host=settings.web_host,
        web_port=settings.web_port,
        web_in_thread=False,
        # faust's default data folder is "<app id>-data" in the working directory; we keep
        # nothing in it (no tables), so it goes under the temp dir instead.
        datadir=str(Path(tempfile.gettempdir()) / f"stepstream-faust-{settings.app_id}"),
    )
    # faust's SASLCredentials without an SSL context silently means SASL_PLAINTEXT: check
    # what faust will hand aiokafka (its consumer and producer both use this) now.
    settings.kafka.check_protocol(
        credentials_to_aiokafka_auth(app.conf.broker_credentials, app.conf.ssl_context)["security_protocol"],
        "the worker's faust consumer and producer",
    )
    app.transport = BatchTransport(app.conf.broker_consumer, app)
    raw = app.topic(settings.topic, key_type=bytes, value_type=bytes, partitions=settings.partitions)
    dlq = app.topic(settings.dlq, key_type=bytes, value_type=bytes, partitions=settings.partitions)
    app.topics.add(raw)  # subscribed without an agent: records arrive through BatchConsumer
    if settings.otlp_topic:
        app.topics.add(app.topic(settings.otlp_topic, key_type=bytes, value_type=bytes, partitions=settings.partitions))
    poller = LagPoller(settings.kafka, settings.app_id, settings.topic, metrics, settings.lag_poll_seconds)
    worker = IngestWorker(settings, metrics, dlq, partitions_of=poller.partitions_of, start_times=start_times)
    app.stepstream = worker
    if settings.otlp_topic:
        from stepstream.ingest.otlp_bridge import bridge_for

        worker.otlp = bridge_for(settings, app, worker.dead_letters, metrics)
    app.lag_poller = poller
    consumer = app.consumer
    assert isinstance(consumer, BatchConsumer)
    consumer.handler = worker.on_records
    consumer.ledger = worker.ledger

    @app.task
    async def flush_batches() -> None:
        # A plain loop, not app.timer: a slow batch write is normal, not "overlapping".
        while True:
            await asyncio.sleep(max(0.01, settings.batch_seconds))
            await worker.tick()

    @app.task
    async def lag_loop() -> None:
        await poller.start()  # already started before the first fetch (on_first_start)
        try:
            await poller.run()
        finally:
            await poller.stop()

    @app.on_partitions_revoked.connect
    async def on_revoked(app: faust.App, revoked: set, **kwargs: Any) -> None:
        await worker.revoked(app.consumer, revoked)

    deadline = StopDeadline(settings.stop_grace_seconds, lambda: _still_stopping(app))

    @app.on_before_shutdown.connect
    async def on_shutdown(app: faust.App, **kwargs: Any) -> None:
        await worker.shutdown(app.consumer)
        # What faust does from here (leave the group, stop the web server) is bounded.
        deadline.arm()

    @app.on_partitions_assigned.connect
    async def on_assigned(app: faust.App, assigned: set, **kwargs: Any) -> None:
        worker.assigned = True
        worker.start_times.mark("assigned")

    @app.page("/metrics")
    async def metrics_page(web: Any, request: Any) -> Any:
        # aiohttp refuses a charset inside content_type; the exposition format is UTF-8 anyway.
        return web.bytes(generate_latest(metrics.registry), content_type=CONTENT_TYPE_LATEST.split(";")[0] + "; version=0.0.4")

    @app.page("/ready")
    async def ready_page(web: Any, request: Any) -> Any:
        ok = worker.ready(app.rebalancing)
        pipeline = worker.pipeline
        body = {
            "ready": ok,
            "rebalancing": app.rebalancing,
            "stores_writable": pipeline is not None and pipeline.writer.healthy(),
            "processed": worker.processed,
        }
        return web.json(body, status=200 if ok else 503)

    @app.page("/healthz")
    async def health_page(web: Any, request: Any) -> Any:
        return web.json({"ok": True, "time": time.time()})

    return app


def _still_stopping(app: faust.App) -> str:
    what = stopping_services(app)
    if app.rebalancing:
        what.append("a rebalance of the group is in progress (the consumer waits for it before leaving)")
    threads = waiting_threads()
    if threads:
        what.append(f"threads {', '.join(threads)}")
    return ", ".join(what) or "nothing faust reports"


def run_worker(settings: Settings) -> int:
    """Blocking: create (or check) the topics, then run the faust worker until SIGTERM/SIGINT."""
    times = StartTimes()
    times.mark("imported")
    # A refused connection or ACL is one line and a non-zero exit now (KafkaRefused), not a retry loop.
    asyncio.run(preflight(settings.kafka, topics=worker_topics(settings), group=settings.app_id))
    times.mark("preflight")
    asyncio.run(ensure_topics(settings, create=settings.create_topics))
    times.mark("topics")
    app = create_app(settings, start_times=times)
    collector.tune()  # a quarter to a third of the CPU otherwise (stepstream.collector)
    worker = faust.Worker(app, loglevel=settings.log_level.upper(), quiet=True)
    # faust's startup spinner, at a level of WARN or above, sets the root logger to DEBUG
    # (and adds a handler that takes every record) for the life of the process: every
    # driver's debug call (aiokafka's per-message "Sending", aiosqlite's per call) then
    # builds a LogRecord. Without the spinner the root logger keeps the level we set.
    worker.spinner = None
    worker.execute_from_commandline()
    return 0
