"""faust's Kafka consumer, delivering records to the worker in per-partition batches.

faust keeps everything it is good at: the consumer group, heartbeats on its consumer
thread, the rebalance listener and its signals, ``perform_seek``, the periodic commit
loop and the final commit on stop, the web server and the worker lifecycle. What goes
is the per-message path (a ``ConsumerMessage``, an ``Event``, a task and an ack per
message, about 100 us of CPU each): :meth:`BatchConsumer._drain_messages` takes the
``{TP: [records]}`` that ``_wait_next_records`` fetched and hands them to a batch
handler, and faust's commit loop asks the worker's :class:`~stepstream.pipeline.ledger.Ledger`
what to commit (``_new_offset`` returns the partition's durable watermark).

The consumer reads ``read_committed``: what the API's ingest route produced inside a
transaction that was aborted is never delivered, and nothing of an open transaction
either (the partition is read up to its last stable offset). Transactions leave
offsets without a record to deliver (each commit's marker, aborted records): after
each fetch, the position aiokafka reached in a partition whose records were delivered
is handed to the ledger (:meth:`~stepstream.pipeline.ledger.Ledger.skipped`), so the
commit moves past them and the next fetch's first record is not taken for a lost fetch.

This leans on private names of faust-streaming 0.15.3 and aiokafka (the exact pins);
every one of them is listed in :data:`FAUST_INTERNALS` and
``tests/unit/test_faust_internals.py`` fails by name when one changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Optional

from faust.transport.drivers import aiokafka as faust_aiokafka

from stepstream.pipeline.ledger import Ledger

#: ``(qualified name, what we use it for)``: the faust internals this module relies on.
FAUST_INTERNALS: tuple[tuple[str, str], ...] = (
    ("faust.transport.consumer.Consumer._drain_messages", "replaced: the fetch loop"),
    ("faust.transport.consumer.Consumer._wait_next_records", "called: flow-aware fetch of {TP: [records]}"),
    ("faust.transport.consumer.Consumer._new_offset", "replaced: what to commit for a partition"),
    ("faust.transport.consumer.Consumer._filter_tps_with_pending_acks", "replaced: which partitions to commit"),
    ("faust.transport.consumer.Consumer._filter_committable_offsets", "relied on: calls the two above"),
    ("faust.transport.consumer.Consumer._should_commit", "relied on: commits only forward"),
    ("faust.transport.consumer.Consumer.commit", "called: on revocation"),
    ("faust.transport.consumer.Consumer.perform_seek", "called: after a fetch that crossed a rebalance"),
    ("faust.transport.consumer.Consumer.seek", "called: when a fetch does not start where the last one ended"),
    ("faust.transport.consumer.Consumer.on_stop", "relied on: the final commit after our last flush"),
    ("faust.transport.consumer.Consumer._committed_offset", "read: partitions with no commit yet"),
    ("faust.transport.consumer.Consumer._read_offset", "updated: the last offset handed over per partition"),
    ("faust.transport.drivers.aiokafka.Consumer.verify_event_path", "replaced: faust's livelock check reads "
     "per-message stream sensors that this path no longer feeds"),
    ("faust.transport.drivers.aiokafka.Transport.Consumer", "replaced: installs BatchConsumer"),
    ("faust.app.base.App.transport", "set: the transport carrying BatchConsumer"),
    ("faust.app.base.App.consumer_generation_id", "read: drop records fetched before a rebalance"),
    ("faust.app.base.App._on_partitions_revoked", "relied on: stop_flow() before the revoked signal"),
    ("faust.app.base.App.on_stop", "relied on: fetcher stopped, then on_before_shutdown, then consumer commit"),
    ("faust.app.base.App._on_rebalance_when_stopped", "replaced (ingest.app.StepstreamApp): it closed the "
     "consumer from the wrong event loop"),
    ("faust.tables.manager.TableManager.on_start", "replaced (ingest.startup.TablelessManager): a 1 s sleep "
     "before the consumer subscribes"),
    ("faust.tables.manager.TableManager._update_channels", "called: registers the (no) tables, then subscribes"),
    ("faust.tables.manager.TableManager.recovery", "called: started as faust's on_start starts it"),
    ("faust.transport.drivers.aiokafka.Consumer._new_consumer_thread", "replaced: installs CommittedConsumerThread"),
    ("faust.transport.drivers.aiokafka.AIOKafkaConsumerThread._create_worker_consumer", "wrapped: the consumer it "
     "builds reads committed"),
    ("faust.transport.drivers.aiokafka.AIOKafkaConsumerThread._consumer", "read: the aiokafka consumer"),
    ("aiokafka.consumer.consumer.AIOKafkaConsumer._isolation_level", "set before start: read_committed"),
    ("aiokafka.consumer.consumer.AIOKafkaConsumer._subscription", "read: each partition's position after a fetch"),
    ("aiokafka.consumer.subscription_state.Assignment.state_value", "called: a partition's state"),
    ("aiokafka.consumer.subscription_state.TopicPartitionState.position", "read: the next offset to consume"),
    ("faust.transport.drivers.aiokafka.Producer._ensure_producer", "called (ingest.otlp_bridge.RawBatches): the "
     "aiokafka producer under faust's, whose batch API the OTLP stage produces through"),
)

Records = dict[Any, list[Any]]
# Returns whether it left some partition's records undelivered.
BatchHandler = Callable[[Records, Callable[[Any], bool]], Awaitable[bool]]


class CommittedConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """faust's consumer thread, whose aiokafka consumer reads ``read_committed``."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._isolation_level = "read_committed"  # read by AIOKafkaConsumer.start(), for its Fetcher
        return consumer


class BatchConsumer(faust_aiokafka.Consumer):
    """faust's aiokafka consumer with batch delivery and watermark commits.

    ``handler`` and ``ledger`` are set by the worker before the app starts. The handler
    gets the fetched records and a predicate ``current(tp)``: false once a rebalance has
    begun (faust stops the flow before it signals revocation) or the partition is no
    longer assigned; it must not deliver a partition for which it is false.
    """

    handler: Optional[BatchHandler] = None
    ledger: Optional[Ledger] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gap_tried: dict[Any, int] = {}
        self._sought: dict[Any, int] = {}
        self._reseek = False

    def _new_consumer_thread(self) -> CommittedConsumerThread:
        return CommittedConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def _positions(self, tps: Any) -> dict[Any, int]:
        """aiokafka's position (the next offset it will consume) of each of ``tps`` that
        has one. Read between fetches only: nothing else moves it then."""
        consumer = getattr(self._thread, "_consumer", None)
        subscription = None if consumer is None else consumer._subscription.subscription
        assignment = None if subscription is None else subscription.assignment
        if assignment is None:
            return {}
        out = {}
        for tp in tps:
            state = assignment.state_value(tp)
            if state is not None and state.has_valid_position:
                out[tp] = state.position
        return out

    async def _drain_messages(self, fetcher: Any) -> None:  # the fetch loop, replaced
        consumer_should_stop = self._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        app = self.app

        # Our own seeks: records of a partition fetched before it was sought are stale
        # (the seek reset the position to them or before); all_seeks counts seeks of
        # every partition at once.
        sought: dict[Any, int] = self._sought
        epoch = [0]

        def fetch() -> tuple[int, int, dict[Any, int], asyncio.Future[Any]]:
            return (
                app.consumer_generation_id,
                epoch[0],
                dict(sought),
                asyncio.ensure_future(self._wait_next_records(1.0)),
            )

        # One fetch is always in flight while a batch is handled, so the consumer
        # thread unpacks the next records while this thread folds the current ones.
        pending = fetch()
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                generation, all_seeks, seen, future = pending
                records, _active = await future
                pending = None
                if self.should_stop:
                    pending = fetch()
                    continue
                if self._reseek and self.flow_active and app.consumer_generation_id == generation:
                    # Every partition back to its committed offset; the ledger skips what
                    # this worker already delivered. Records fetched before are dropped.
                    self._reseek = False
                    epoch[0] += 1
                    await self._seek_all_to_committed()
                    pending = fetch()
                    continue
                if not records:
                    pending = fetch()
                    continue
                if all_seeks != epoch[0]:
                    pending = fetch()
                    continue  # fetched before a seek of every partition
                for tp in [tp for tp in records if sought.get(tp, 0) != seen.get(tp, 0)]:
                    del records[tp]  # fetched before that partition was sought
                if not self.flow_active or app.consumer_generation_id != generation:
                    # Fetched across a rebalance: these records are dropped, and faust's
                    # own seek to the committed offsets may already have happened (a
                    # fetch can complete after it). Seek again once the flow is back.
                    self._reseek = True
                    pending = fetch()
                    continue
                assignment = self.assignment()
                await self._seek_gaps(records)
                # Before the next fetch moves them: where this fetch left each partition
                # it delivers, past any transaction marker or aborted records it skipped.
                reached = self._positions([tp for tp, batch in records.items() if batch])
                pending = fetch()

                def current(tp: Any) -> bool:
                    return self.flow_active and app.consumer_generation_id == generation and tp in assignment

                assert self.handler is not None, "BatchConsumer.handler is not set"
                # Shielded: a stop (SIGTERM) waits for the batch in hand instead of
                # cutting a store write in half; nothing new starts after it.
                if await asyncio.shield(self.handler(records, current)):
                    self._reseek = True  # it left records undelivered (a rebalance began)
                else:
                    ledger = self.ledger
                    for tp, offset in reached.items():
                        if ledger is not None and current(tp) and ledger.next_offset(tp) == records[tp][-1].offset + 1:
                            ledger.skipped(tp, offset)
                for tp, batch in records.items():
                    if batch:
                        self._read_offset[tp] = batch[-1].offset
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                return
            raise
        finally:
            if pending is not None:
                pending[3].cancel()

    async def _seek_all_to_committed(self) -> None:
        """Every assigned partition back to its committed offset, and one that has none
        yet back to its start (``perform_seek`` leaves those where the last fetch ended)."""
        await self.perform_seek()
        for tp in self.assignment():
            if not self._committed_offset.get(tp):
                await self.seek(tp, 0)
        self.log.info("sought every partition back to its committed offset")

    async def _seek_gaps(self, records: Records) -> None:
        """A partition's records must start where its last delivery ended (or at its
        committed offset, the first time). When they
        start past it (a fetch was lost), drop them and seek back, once per offset: a
        gap that comes back at the same place is the log's own (e.g. transaction
        markers) and is accepted."""
        ledger = self.ledger
        if ledger is None:
            return
        for tp, batch in list(records.items()):
            # Where this partition's records must start: after the last delivery, or at
            # the committed offset for a first delivery since the partition was assigned.
            expected = ledger.next_offset(tp)
            if expected is None:
                expected = self._committed_offset.get(tp) or None
            if not batch or expected is None or batch[0].offset <= expected:
                continue
            if self._gap_tried.get(tp) == expected:
                self.log.warning("offsets %s..%s of %s are not in the log; going on", expected, batch[0].offset - 1, tp)
                continue
            self._gap_tried[tp] = expected
            self.log.warning("records of %s start at %s, not %s: seeking back", tp, batch[0].offset, expected)
            del records[tp]
            self._sought[tp] = self._sought.get(tp, 0) + 1
            await self.seek(tp, expected)

    def _filter_tps_with_pending_acks(self, topics: Any = None) -> Iterator[Any]:
        ledger = self.ledger
        if ledger is None:
            return iter(())
        return (tp for tp in ledger.partitions() if topics is None or tp in topics or tp.topic in topics)

    def _new_offset(self, tp: Any) -> Optional[int]:
        ledger = self.ledger
        return None if ledger is None else ledger.watermark(tp)

    def verify_event_path(self, now: float, tp: Any) -> None:
        # faust's check reads per-message stream sensors that batch delivery no longer
        # feeds; progress is watched by the lag poller and stepstream_oldest_held_seconds.
        return None


class BatchTransport(faust_aiokafka.Transport):
    """faust's aiokafka transport, with :class:`BatchConsumer`."""

    Consumer = BatchConsumer
