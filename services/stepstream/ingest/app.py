"""The faust app: a thin shell around :class:`stepstream.pipeline.Pipeline`.

Design (docs/worker.md has the long form):

* The raw topic is read as bytes on a no-ack stream; each message is decoded once
  with msgspec. A message that is not a valid v1 event goes to the dead-letter
  topic with its original key, value and headers naming the reason and the
  source partition/offset; it is acked only after the broker took the copy.
* Good events go through the pipeline, which calls back when their effect is
  durable in the sinks. Acks are given to faust strictly in offset order per
  partition (:mod:`stepstream.ingest.acks`), so a committed offset never passes a
  message whose rows (or whose thinking tail) are not yet durable.
* Nothing lives in faust tables. On a rebalance the current batch is written,
  then the folds and unacked messages of revoked partitions are forgotten; the
  next owner reloads each run's durable state from the step store and replays
  from the committed offset, which converges because the engine is deterministic
  and every write is idempotent.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import faust
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from stepstream.config import Settings
from stepstream.core.fold import Limits
from stepstream.core.wire import decode_event
from stepstream.errors import WireError
from stepstream.ingest.acks import AckTracker
from stepstream.ingest.lag import LagPoller
from stepstream.metrics import Metrics
from stepstream.pipeline import Pipeline
from stepstream.sinks import open_deep_store, open_step_store

log = logging.getLogger(__name__)


class IngestWorker:
    """State of one worker process: stores, pipeline, ack tracker and readiness."""

    def __init__(self, settings: Settings, metrics: Metrics, dlq_topic: Any) -> None:
        self.settings = settings
        self.metrics = metrics
        self._dlq = dlq_topic
        self.lock = asyncio.Lock()
        self.tracker = AckTracker(lambda event: event.ack())
        self.pipeline: Pipeline | None = None
        self._stores: list[Any] = []
        self._run_tp: dict[tuple[str, str], Any] = {}
        self.assigned = False
        self.processed = 0
        self._last_idle_check = 0.0

    async def start(self) -> None:
        if self.pipeline is not None:
            return
        steps = await open_step_store(self.settings.steps_sink)
        deep = await open_deep_store(self.settings.deep)
        self._stores = [steps, deep]
        self.pipeline = Pipeline(
            steps,
            deep,
            limits=Limits(idle_seconds=self.settings.idle_flush_seconds),
            metrics=self.metrics,
            on_durable=self.tracker.done,
            batch_records=self.settings.batch_records,
            batch_seconds=self.settings.batch_seconds,
        )

    async def shutdown(self) -> None:
        """Write the current batch and close the stores (their driver threads would
        otherwise keep the process alive). Unflushed thinking tails are not written:
        their messages were never acked, so the next start replays them."""
        async with self.lock:
            if self.pipeline is not None:
                await self.pipeline.flush()
            for store in self._stores:
                await store.close()
            self._stores = []
            self.pipeline = None

    async def handle(self, event: Any) -> None:
        """One delivered message: dead-letter it or push it through the pipeline."""
        message = event.message
        async with self.lock:
            if self.pipeline is None:
                await self.start()
            entry = self.tracker.track(message.tp, message.offset, event)
            try:
                decoded = decode_event(event.value, max_bytes=self.settings.max_event_bytes)
            except WireError as exc:
                await self._dead_letter(message, exc)
                self.tracker.done([entry])
                return
            self._run_tp[(decoded.company_id, decoded.run_id)] = message.tp
            self.processed += 1
            await self.pipeline.push(decoded, entry)

    async def _dead_letter(self, message: Any, exc: WireError) -> None:
        headers = [
            ("stepstream-reason", exc.reason.encode()),
            ("stepstream-detail", exc.detail[:500].encode("utf-8", "replace")),
            ("stepstream-source", f"{message.topic}/{message.partition}/{message.offset}".encode()),
        ]
        headers.extend((k, v) for k, v in (message.headers or ()) if not k.startswith("stepstream-"))
        fut = await self._dlq.send(key=message.key, value=message.value, headers=headers)
        await fut  # acked only once the broker holds the copy
        self.metrics.dead_letters.labels(exc.reason).inc()
        log.warning(
            "dead letter %s/%s@%s: %s", message.topic, message.partition, message.offset, exc
        )

    async def tick(self) -> None:
        async with self.lock:
            if self.pipeline is not None:
                await self.pipeline.tick()

    async def revoked(self, tps: set[Any]) -> None:
        """Write what is batched, then forget the revoked partitions' runs."""
        self.assigned = False
        async with self.lock:
            if self.pipeline is None:
                self.tracker.drop(set(tps))
                return
            await self.pipeline.flush()
            gone = set(tps)
            self.pipeline.forget(lambda key: self._run_tp.get(key) not in gone)
            self._run_tp = {k: tp for k, tp in self._run_tp.items() if tp not in gone}
            self.tracker.drop(gone)


def create_app(settings: Settings, metrics: Metrics | None = None) -> faust.App:
    """Build the faust app from settings. Nothing happens at import time."""
    metrics = metrics or Metrics()
    app = faust.App(
        settings.app_id,
        broker=f"kafka://{settings.broker}",
        key_serializer="raw",
        value_serializer="raw",
        store="memory://",
        topic_partitions=settings.partitions,
        topic_allow_declare=False,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        stream_wait_empty=False,
        broker_commit_interval=1.0,
        web_enabled=True,
        web_bind=settings.web_host,
        web_host=settings.web_host,
        web_port=settings.web_port,
        web_in_thread=False,
        # faust's default data folder is "<app id>-data" in the working directory; we keep
        # nothing in it (no tables), so it goes under the temp dir instead.
        datadir=str(Path(tempfile.gettempdir()) / f"stepstream-faust-{settings.app_id}"),
    )
    raw = app.topic(settings.topic, key_type=bytes, value_type=bytes, partitions=settings.partitions)
    dlq = app.topic(settings.dlq, key_type=bytes, value_type=bytes, partitions=settings.partitions)
    worker = IngestWorker(settings, metrics, dlq)
    poller = LagPoller(settings.broker, settings.app_id, settings.topic, metrics, settings.lag_poll_seconds)
    app.stepstream = worker  # type: ignore[attr-defined]

    @app.agent(raw, name="stepstream-ingest")
    async def ingest(stream: faust.StreamT) -> None:
        async for event in stream.noack().events():
            await worker.handle(event)

    @app.task
    async def flush_batches() -> None:
        # A plain loop, not app.timer: a slow batch write is normal, not "overlapping".
        while True:
            await asyncio.sleep(max(0.01, settings.batch_seconds))
            await worker.tick()

    @app.task
    async def lag_loop() -> None:
        await poller.start()
        try:
            await poller.run()
        finally:
            await poller.stop()

    @app.on_partitions_revoked.connect
    async def on_revoked(app: faust.App, revoked: set, **kwargs: Any) -> None:
        await worker.revoked(revoked)

    @app.on_before_shutdown.connect
    async def on_shutdown(app: faust.App, **kwargs: Any) -> None:
        await worker.shutdown()

    @app.on_partitions_assigned.connect
    async def on_assigned(app: faust.App, assigned: set, **kwargs: Any) -> None:
        worker.assigned = True

    @app.page("/metrics")
    async def metrics_page(web: Any, request: Any) -> Any:
        # aiohttp refuses a charset inside content_type; the exposition format is UTF-8 anyway.
        return web.bytes(generate_latest(metrics.registry), content_type=CONTENT_TYPE_LATEST.split(";")[0] + "; version=0.0.4")

    @app.page("/ready")
    async def ready_page(web: Any, request: Any) -> Any:
        ok = worker.assigned and not app.rebalancing and worker.pipeline is not None
        body = {"ready": ok, "rebalancing": app.rebalancing, "processed": worker.processed}
        return web.json(body, status=200 if ok else 503)

    @app.page("/healthz")
    async def health_page(web: Any, request: Any) -> Any:
        return web.json({"ok": True, "time": time.time()})

    return app


async def ensure_topics(settings: Settings) -> None:
    """Create the raw and dead-letter topics with the configured partition count
    (faust does not create source topics); an existing topic is left as it is."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    admin = AIOKafkaAdminClient(bootstrap_servers=settings.broker)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = [
            NewTopic(name, num_partitions=settings.partitions, replication_factor=1)
            for name in (settings.topic, settings.dlq)
            if name not in existing
        ]
        if wanted:
            try:
                await admin.create_topics(wanted)
            except TopicAlreadyExistsError:
                pass
    finally:
        await admin.close()


def run_worker(settings: Settings) -> int:
    """Blocking: create topics, then run the faust worker until SIGTERM/SIGINT."""
    asyncio.run(ensure_topics(settings))
    app = create_app(settings)
    worker = faust.Worker(app, loglevel=settings.log_level.upper(), quiet=True)
    worker.execute_from_commandline()
    return 0
