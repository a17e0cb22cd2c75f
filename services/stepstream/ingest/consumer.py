"""faust's Kafka consumer, delivering records to the worker in per-partition batches.

faust keeps everything it is good at: the consumer group, heartbeats on its consumer
thread, the rebalance listener and its signals, ``perform_seek``, the periodic commit
loop and the final commit on stop, the web server and the worker lifecycle. What goes
is the per-message path (a ``ConsumerMessage``, an ``Event``, a task and an ack per
message, about 100 us of CPU each): :meth:`BatchConsumer._drain_messages` takes the
``{TP: [records]}`` that ``_wait_next_records`` fetched and hands them to a batch
handler, and faust's commit loop asks the worker's :class:`~stepstream.ingest.ledger.Ledger`
what to commit (``_new_offset`` returns the partition's durable watermark).

This leans on private names of faust-streaming 0.15.3 (the exact pin); every one of
them is listed in :data:`FAUST_INTERNALS` and ``tests/unit/test_faust_internals.py``
fails by name when one changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Optional

from faust.transport.drivers import aiokafka as faust_aiokafka

from stepstream.ingest.ledger import Ledger

#: ``(qualified name, what we use it for)``: the faust internals this module relies on.
FAUST_INTERNALS: tuple[tuple[str, str], ...] = (
    ("faust.transport.consumer.Consumer._drain_messages", "replaced: the fetch loop"),
    ("faust.transport.consumer.Consumer._wait_next_records", "called: flow-aware fetch of {TP: [records]}"),
    ("faust.transport.consumer.Consumer._new_offset", "replaced: what to commit for a partition"),
    ("faust.transport.consumer.Consumer._filter_tps_with_pending_acks", "replaced: which partitions to commit"),
    ("faust.transport.consumer.Consumer._filter_committable_offsets", "relied on: calls the two above"),
    ("faust.transport.consumer.Consumer._should_commit", "relied on: commits only forward"),
    ("faust.transport.consumer.Consumer.commit", "called: on revocation"),
    ("faust.transport.consumer.Consumer.on_stop", "relied on: the final commit after our last flush"),
    ("faust.transport.consumer.Consumer._read_offset", "updated: the last offset handed over per partition"),
    ("faust.transport.drivers.aiokafka.Consumer.verify_event_path", "replaced: faust's livelock check reads "
     "per-message stream sensors that this path no longer feeds"),
    ("faust.transport.drivers.aiokafka.Transport.Consumer", "replaced: installs BatchConsumer"),
    ("faust.app.base.App.transport", "set: the transport carrying BatchConsumer"),
    ("faust.app.base.App.consumer_generation_id", "read: drop records fetched before a rebalance"),
    ("faust.app.base.App._on_partitions_revoked", "relied on: stop_flow() before the revoked signal"),
    ("faust.app.base.App.on_stop", "relied on: fetcher stopped, then on_before_shutdown, then consumer commit"),
)

Records = dict[Any, list[Any]]
BatchHandler = Callable[[Records, Callable[[Any], bool]], Awaitable[None]]


class BatchConsumer(faust_aiokafka.Consumer):
    """faust's aiokafka consumer with batch delivery and watermark commits.

    ``handler`` and ``ledger`` are set by the worker before the app starts. The handler
    gets the fetched records and a predicate ``current(tp)``: false once a rebalance has
    begun (faust stops the flow before it signals revocation) or the partition is no
    longer assigned; it must not deliver a partition for which it is false.
    """

    handler: Optional[BatchHandler] = None
    ledger: Optional[Ledger] = None

    async def _drain_messages(self, fetcher: Any) -> None:  # the fetch loop, replaced
        consumer_should_stop = self._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        app = self.app

        def fetch() -> tuple[int, asyncio.Future[Any]]:
            return app.consumer_generation_id, asyncio.ensure_future(self._wait_next_records(1.0))

        # One fetch is always in flight while a batch is handled, so the consumer
        # thread unpacks the next records while this thread folds the current ones.
        pending = fetch()
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                generation, future = pending
                records, _active = await future
                pending = fetch()
                if not records or self.should_stop:
                    continue
                if not self.flow_active or app.consumer_generation_id != generation:
                    continue  # fetched across a rebalance: re-read from the committed offset
                assignment = self.assignment()

                def current(tp: Any) -> bool:
                    return self.flow_active and app.consumer_generation_id == generation and tp in assignment

                assert self.handler is not None, "BatchConsumer.handler is not set"
                # Shielded: a stop (SIGTERM) waits for the batch in hand instead of
                # cutting a store write in half; nothing new starts after it.
                await asyncio.shield(self.handler(records, current))
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
            pending[1].cancel()

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
