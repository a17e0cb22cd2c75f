"""The :class:`Pipeline`: folds events into the open batch and writes sealed batches.

See the package docstring (:mod:`stepstream.pipeline`) for the parts and contracts.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Any

from stepstream.core.fold import BUFFERED, Limits, Output, RunFold
from stepstream.core.records import RunState
from stepstream.core.wire import Event
from stepstream.errors import WireError
from stepstream.pipeline.journal import Journal
from stepstream.pipeline.ledger import Ledger
from stepstream.metrics import Metrics, observe_many
from stepstream.pipeline.batch import RowBatch, RunKey
from stepstream.pipeline.folds import FoldCache
from stepstream.pipeline.writer import BatchWriter, StoreFailed
from stepstream.sinks.ports import DeepStore, StepStore

__all__ = ["BATCH_BYTES", "GROWTH", "NotLoaded", "Pipeline"]

_MISSING: Any = object()

#: How many times ``batch_records`` a batch may grow to while the previous write is in flight
#: (never past ``batch_bytes``: the byte bound does not grow).
GROWTH = 4

#: The default byte bound of a batch: the values of the messages it settles.
BATCH_BYTES = 32 * 1024 * 1024

#: How many times in a row a stale run is reloaded and its events applied again before the
#: write gives up (:class:`StoreFailed`: the process stops and Kafka rewinds, nothing lost).
REDO_ATTEMPTS = 5

Covers = dict[RunKey, tuple[Journal, int]]


class NotLoaded(RuntimeError):
    """:meth:`Pipeline.apply` of a run whose state is nowhere in memory: it was never
    :meth:`~Pipeline.load` ed, or it left memory since (it ended, or was evicted, and
    the batches that held its state were written). Nothing changed: load it, apply again."""

    def __init__(self, key: RunKey) -> None:
        super().__init__(f"run {key[0]}/{key[1]} applied before it was loaded")
        self.key = key


class Pipeline:
    """Folds events into batches and writes them; see the module docstring."""

    def __init__(
        self,
        steps: StepStore,
        deep: DeepStore,
        *,
        limits: Limits | None = None,
        metrics: Metrics | None = None,
        ledger: Ledger | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        batch_records: int = 2000,
        batch_seconds: float = 0.05,
        batch_bytes: int = BATCH_BYTES,
        evict_after_seconds: float = 60.0,
        max_open_runs: int = 20_000,
        max_hold_seconds: float = 10.0,
        retry_seconds: float = 60.0,
        before_durable: Callable[[], Awaitable[None]] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._steps = steps
        self._limits = limits or Limits()
        self._metrics = metrics
        self.ledger = ledger
        self._clock = clock
        self._wall = wall_clock
        self._batch_records = batch_records
        self._batch_seconds = batch_seconds
        self._batch_bytes = batch_bytes
        self._evict_after = evict_after_seconds
        self._max_open_runs = max_open_runs
        self._max_hold = max_hold_seconds
        self._before_durable = before_durable
        self.writer = BatchWriter(steps, deep, metrics=metrics, retry_seconds=retry_seconds, clock=clock, sleep=sleep)
        self.folds = FoldCache(self._limits)
        self._staged: dict[RunKey, RunState | None] = {}  # loaded, not yet opened
        self._held_ts: dict[RunKey, list[float]] = {}  # event times of held deltas
        self._journals: dict[RunKey, Journal] = {}  # events not yet in an admitted state, per run
        self._batch = RowBatch(clock())
        self._writing: RowBatch | None = None  # the batch being written, or the last one written
        self._inflight: asyncio.Future[None] | None = None
        self._next_idle_check = 0.0
        self._next_evict = 0.0
        self.duplicates = 0

    # -- events -------------------------------------------------------------

    async def load(self, keys: Iterable[RunKey]) -> None:
        """Load the durable state of every run in ``keys`` that is not in memory, in one
        store query per company. :meth:`apply` needs it for a run it has not seen."""
        wanted: dict[str, list[str]] = {}
        folds, staged = self.folds, self._staged
        for key in dict.fromkeys(keys):  # a fetch repeats its runs' keys: each is looked at once
            if key in folds or key in staged or self._pending_state(key) is not _MISSING:
                continue
            runs = wanted.get(key[0])
            if runs is None:
                wanted[key[0]] = [key[1]]
            else:
                runs.append(key[1])
        if not wanted:
            return

        async def one(company: str, runs: list[str]) -> None:
            states = await self.writer.read(lambda: self._steps.load_states(company, runs))
            for run in runs:
                self._staged[(company, run)] = states.get(run)

        # The companies' queries at once: one wait instead of one per company.
        await asyncio.gather(*(one(company, runs) for company, runs in wanted.items()))

    def unstage(self) -> None:
        """Forget the states :meth:`load` ed for runs not applied since (a fetch's
        partitions that were not delivered): the next load reads them again."""
        self._staged.clear()

    def apply(self, event: Event, tp: Hashable = None, offset: int = 0, size: int = 0) -> bool:
        """Fold one event (``size``: the bytes of its message) into the open batch;
        ``True`` when the batch is full (the caller then awaits :meth:`flush`). Raises
        ``WireError`` for an event the fold refuses (nothing changed); the run must
        have been :meth:`load` ed."""
        key = (event.company_id, event.run_id)
        now = self._clock()
        entry = self.folds.touch(key, tp, now)
        if entry is None:
            entry = self._open(key, tp, now)
        out = entry.fold.push(event, now)
        batch = self._batch
        batch.records += 1
        batch.message_bytes += size
        if out is None:
            self.duplicates += 1
        else:
            journal = self._journals.get(key)
            if journal is None:
                journal = self._journals[key] = Journal()
            tag = event.__struct_config__.tag
            batch.types[tag] += 1
            if out is BUFFERED or (
                out.state is None
                and out.run is None
                and not (out.steps or out.deeps or out.flushes or out.clipped or out.dropped or out.failure_coerced)
                and not (out.seq_gap or out.late)
            ):
                # A delta buffered in the fold's tail (most events of a thinking run):
                # nothing to batch yet, only what makes it durable later (inline: the
                # hot path of a thinking run; Journal.add and _hold say the same).
                entries = journal.entries
                if journal.tail is None:
                    journal.tail = journal.start + len(entries)
                entries.append((event, tp, offset))
                self.folds.tails.add(key)
                if self.ledger is not None and tp is not None:
                    self.ledger.hold(key, tp, offset, now)
                held = self._held_ts.get(key)
                if held is None:
                    self._held_ts[key] = [event.ts.timestamp()]
                else:
                    held.append(event.ts.timestamp())
            else:
                journal.add(event, tp, offset, out.state is None)
                self._take(key, out, tp, offset, now, event.ts.timestamp(), tag == "thinking_delta")
                if tag == "run_end":
                    batch.ended.append(key)
        # The common case (neither bound reached) without a call.
        return (
            len(batch.steps) + len(batch.deeps) + len(batch.runs) + batch.records >= self._batch_records
            or batch.message_bytes >= self._batch_bytes
        ) and self._full(batch)

    def _full(self, batch: RowBatch) -> bool:
        """Group commit: a batch of ``batch_records`` is written once the store is free;
        while the previous write is still in flight it keeps growing, up to
        :data:`GROWTH` times that, so a slow store takes fewer, larger writes instead of
        stopping the folds at every batch. A batch that settles ``batch_bytes`` of
        messages is full at once, store free or not (it waits for the write in flight
        rather than grow): what a batch holds is bounded in bytes, not only in rows."""
        if batch.message_bytes >= self._batch_bytes:
            return True
        length = len(batch)
        if length < self._batch_records:
            return False
        return length >= self._batch_records * GROWTH or not self.writing

    @property
    def writing(self) -> bool:
        """Whether a batch write is in flight."""
        task = self._inflight
        return task is not None and not task.done()

    async def push(self, event: Event, tp: Hashable = None, offset: int = 0, size: int = 0) -> None:
        """:meth:`load`, :meth:`apply` and, when the batch is full, :meth:`flush`."""
        key = (event.company_id, event.run_id)
        if key not in self.folds:
            await self.load((key,))
        if self.apply(event, tp, offset, size):
            await self.flush(wait=False)

    def settle(self, records: int = 1) -> None:
        """``records`` consumed records with no event (dead letters) ride on the open batch."""
        self._batch.records += records

    def _open(self, key: RunKey, tp: Hashable, now: float) -> Any:
        state = self._pending_state(key)
        if state is _MISSING:
            state = self._staged.pop(key, _MISSING)
            if state is _MISSING:
                raise NotLoaded(key)
        else:
            self._staged.pop(key, None)
        if len(self.folds) >= self._max_open_runs:
            self._evict_least_recent(now)
        return self.folds.open(key, state, tp, now)

    def _pending_state(self, key: RunKey) -> Any:
        """The run's state in a batch not yet durable (newer than the store's)."""
        state = self._batch.states.get(key, _MISSING)
        if type(state) is RunFold:
            return state.durable_state()
        if state is _MISSING and self._writing is not None:
            state = self._writing.states.get(key, _MISSING)
        return state

    def _take(
        self,
        key: RunKey,
        out: Output,
        tp: Hashable,
        offset: int,
        now: float,
        ts: float | None,
        delta: bool = False,
        batch: RowBatch | None = None,
    ) -> None:
        if batch is None:
            batch = self._batch
        batch.add(out)
        m = self._metrics
        if m is not None and (
            out.flushes or out.clipped or out.seq_gap or out.late or out.dropped or out.failure_coerced
        ):
            for trigger in out.flushes:
                m.thinking_flushes.labels(trigger).inc()
            for field in out.clipped:
                m.clipped.labels(field).inc()
            if out.seq_gap:
                m.seq_gaps.inc()
            if out.late:
                m.late_events.inc()
            if out.dropped:
                m.steps_dropped.inc(out.dropped)
            if out.failure_coerced:
                m.failures_coerced.labels(out.failure_coerced).inc()
        if out.state is None:
            self._hold(key, tp, offset, now, ts)
            return
        self.folds.tails.discard(key)
        journal = self._journals.get(key)
        if journal is not None:
            journal.flushed()
        if self.ledger is not None:
            self.ledger.release(key)
        held = self._held_ts.pop(key, None)
        if held:
            batch.delta_ts.extend(held)
        if ts is not None:
            (batch.delta_ts if delta else batch.event_ts).append(ts)

    def _hold(self, key: RunKey, tp: Hashable, offset: int, now: float, ts: float | None) -> None:
        """An event buffered in ``key``'s fold tail: durable only when the tail is flushed."""
        self.folds.tails.add(key)
        if self.ledger is not None and tp is not None:
            self.ledger.hold(key, tp, offset, now)
        if ts is not None:
            held = self._held_ts.get(key)
            if held is None:
                self._held_ts[key] = [ts]
            else:
                held.append(ts)

    def _flush_tail(self, key: RunKey, trigger: str, now: float) -> None:
        entry = self.folds.get(key)
        if entry is None:
            self.folds.tails.discard(key)
            return
        out = entry.fold.flush(trigger)
        if out is not None:
            self._take(key, out, entry.tp, 0, now, None)

    def _evict_least_recent(self, now: float) -> None:
        """Make room for one fold: drop the least recently used (flushing its tail
        into the open batch first, so its state there is the one a reload uses)."""
        while self.folds and len(self.folds) >= self._max_open_runs:
            key, entry = self.folds.least_recent()
            if entry.fold.pending:
                self._flush_tail(key, "evict", now)
            self.folds.drop(key)
            if self._metrics is not None:
                self._metrics.evicted_runs.labels("capacity").inc()

    # -- batches ------------------------------------------------------------

    def due(self) -> bool:
        """Whether the open batch is old enough to be written."""
        batch = self._batch
        length = len(batch)
        if length == 0 or self._clock() - batch.opened < self._batch_seconds:
            return False
        return not self.writing or length >= self._batch_records * GROWTH or batch.message_bytes >= self._batch_bytes

    async def flush(self, *, wait: bool = True) -> None:
        """Seal the open batch, write it under the fault policy and mark it durable.

        With ``wait=False`` the write runs in the background while folding goes on; at
        most one write is in flight (this call first waits for the previous one), so
        batches land in order and the folds are never more than one batch ahead of the
        store. Raises :class:`StoreFailed` (from this write or the previous one) when
        the policy gives up: stop the process."""
        await self.wait_written()
        batch = self._batch
        if not batch.has_rows and not batch.records:
            return
        self._batch = RowBatch(self._clock())
        batch.seal()
        covers = self._covers(batch)
        sealed = self.ledger.seal() if self.ledger is not None else None
        self._writing = batch
        self._inflight = asyncio.ensure_future(self._write(batch, sealed, covers))
        if wait:
            await self.wait_written()

    async def wait_written(self) -> None:
        """Wait for the write in flight, if any. A write that failed stays failed: its
        :class:`StoreFailed` is raised again by every later call (and so by every later
        :meth:`flush` and :meth:`tick`), so no later batch is ever written ahead of it."""
        task = self._inflight
        if task is None:
            return
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise StoreFailed("the batch write was cancelled before it landed") from None
            raise
        self._inflight = None

    def _covers(self, batch: RowBatch) -> Covers:
        """Per run whose state ``batch`` carries, how far into its journal that state
        reflects the events (taken when the batch is sealed, as its states are)."""
        journals = self._journals
        return {key: (journals[key], journals[key].covered()) for key in batch.states if key in journals}

    async def _write(self, batch: RowBatch, sealed: Any, covers: Covers) -> None:
        # ``_writing`` stays this batch until the next flush: a run loaded while it was in
        # flight skipped the store for it, and must still find its state here afterwards.
        written = batch
        skipped = await self.writer.write(batch, before=self._before_durable)
        for attempt in range(REDO_ATTEMPTS + 1):
            self._settle(covers, skipped)
            self._after_write(written, skipped)
            if not skipped:
                break
            if attempt == REDO_ATTEMPTS:
                raise StoreFailed(f"{len(skipped)} runs were refused as stale {attempt + 1} times in a row")
            # Another owner wrote these runs further (their events are on two partitions):
            # the batch's offsets are durable only once the events are applied again.
            written, covers = await self._redo(skipped, batch, sealed)
            skipped = await self.writer.write(written)
        if sealed is not None:
            self.ledger.durable(sealed)  # type: ignore[union-attr]

    def _settle(self, covers: Covers, skipped: list[RunKey]) -> None:
        """The journal entries of the admitted runs' written states are durable."""
        refused = set(skipped)
        for key, (journal, position) in covers.items():
            if key not in refused and journal.settle(position) and self._journals.get(key) is journal:
                del self._journals[key]

    async def _redo(self, keys: list[RunKey], refused: RowBatch, sealed: Any) -> tuple[RowBatch, Covers]:
        """The runs ``keys`` the store refused as stale, reloaded from the store, their
        journal applied again: a batch to write in place of their refused rows.

        Every row this pipeline made for them since their last admitted state came from
        a fold that did not see the other owner's events: the refused batch's, the open
        batch's and the fold's unflushed tail. All are made again from the stored state;
        the events the other owner skipped are late events there, the ones it applied
        are duplicates. A held offset rides on ``sealed`` (the refused batch's floors,
        durable once this batch is written); a pending tail becomes a hold again."""
        wanted: dict[str, list[str]] = {}
        for company, run in keys:
            wanted.setdefault(company, []).append(run)
        stored: dict[RunKey, RunState | None] = {}
        for company, runs in wanted.items():
            states = await self.writer.read(partial(self._steps.load_states, company, runs))
            for run in runs:
                stored[(company, run)] = states.get(run)
        # Nothing awaits from here to the seal: no event of these runs comes in between.
        now = self._clock()
        redo = RowBatch(now)
        for key in keys:
            self._batch.discard(key)
            self._held_ts.pop(key, None)
            if self.ledger is not None:
                self.ledger.release(key, sealed)
            old = self.folds.drop(key)
            journal = self._journals.setdefault(key, Journal())
            entries = journal.take()
            tp = old.tp if old is not None else (entries[-1][1] if entries else None)
            if len(self.folds) >= self._max_open_runs:
                self._evict_least_recent(now)
            fold = self.folds.open(key, stored[key], tp, now).fold
            for event, event_tp, offset in entries:
                try:
                    out = fold.push(event, now)
                except WireError:  # not for an event it took before; never drop the rest
                    continue
                if out is None:
                    continue  # applied by the other owner (or by this write, if it landed)
                journal.add(event, event_tp, offset, out.state is None)
                self._take(key, out, event_tp, offset, now, None, batch=redo)
                if event.__struct_config__.tag == "run_end":
                    redo.ended.append(key)
            if not journal.entries:
                del self._journals[key]
        redo.seal()
        for key in keys:
            # A run opened from ``_writing`` (the refused batch) must find the redone state there.
            refused.states.pop(key, None)
            refused.runs.pop(key, None)
            if key in redo.states:
                refused.states[key] = redo.states[key]
            if key in redo.runs:
                refused.runs[key] = redo.runs[key]
        return redo, self._covers(redo)

    def _after_write(self, batch: RowBatch, skipped: list[RunKey]) -> None:
        m = self._metrics
        for key in batch.ended:
            entry = self.folds.get(key)
            if entry is not None and not entry.fold.pending:
                self.folds.drop(key)
                if m is not None:
                    m.evicted_runs.labels("ended").inc()
        if m is None:
            return
        if skipped:
            m.stale_runs.inc(len(skipped))
        if self.duplicates:
            m.duplicates.inc(self.duplicates)
            self.duplicates = 0
        m.rows_written.labels("step").inc(len(batch.steps))
        m.rows_written.labels("deep").inc(len(batch.deeps))
        m.rows_written.labels("run").inc(len(batch.runs))
        for kind, n in batch.types.items():
            m.events.labels(kind).inc(n)
        wall = self._wall()
        for kind, times in (("other", batch.event_ts), ("thinking_delta", batch.delta_ts)):
            if times:
                observe_many(m.ingest_lag.labels(kind), [wall - ts if ts < wall else 0.0 for ts in times])
        m.open_runs.set(len(self.folds))
        m.pending_events.set(self.held)
        if self.ledger is not None:
            m.held_age.set(self.ledger.oldest_hold_age(self._clock()))

    async def tick(self) -> None:
        """Periodic work: flush idle tails and too-old holds, drop idle folds, then
        write a due batch."""
        if self._inflight is not None and self._inflight.done():
            await self.wait_written()  # surfaces a write that failed in the background
        now = self._clock()
        tails = self.folds.tails
        if tails and now >= self._next_idle_check:
            # Idle tails are checked every 250 ms (or 4 times per idle period), not every tick,
            # so a tail is flushed at most 250 ms after it turned idle.
            self._next_idle_check = now + min(self._limits.idle_seconds / 4, 0.25)
            for key in list(tails):
                entry = self.folds.get(key)
                if entry is None:
                    tails.discard(key)
                    continue
                out = entry.fold.flush_idle(now)
                if out is not None:
                    self._take(key, out, entry.tp, 0, now, None)
        if self.ledger is not None and self.ledger.held_runs:
            for key in list(self.ledger.expired_holds(now, self._max_hold)):
                self._flush_tail(key, "age", now)
        if now >= self._next_evict:
            self._next_evict = now + min(5.0, self._evict_after / 4)
            for key in list(self.folds.idle_since(now - self._evict_after)):
                self.folds.drop(key)
                if self._metrics is not None:
                    self._metrics.evicted_runs.labels("idle").inc()
        if self.due():
            await self.flush(wait=False)

    async def drain(self) -> None:
        """Make everything durable now: flush every pending tail (as an idle flush
        would, so records equal a run that waited) and write the batch."""
        now = self._clock()
        for key in list(self.folds.tails):
            self._flush_tail(key, "idle", now)
        self.folds.tails.clear()
        await self.flush()

    def drop_partitions(self, tps: Iterable[Hashable]) -> int:
        """Forget the folds and holds of partitions this worker no longer owns (call
        after :meth:`flush`). Returns how many folds went."""
        gone = set(tps)
        # Another owner may move these runs on: from now on their state comes from the store.
        self._writing = None
        keys = self.folds.on_partitions(gone)
        for key in keys:
            self.folds.drop(key)
            self._held_ts.pop(key, None)
            self._journals.pop(key, None)
        if self.ledger is not None:
            for key in self.ledger.drop(gone):
                self.folds.drop(key)
                self._held_ts.pop(key, None)
                self._journals.pop(key, None)
        if self._metrics is not None and keys:
            self._metrics.evicted_runs.labels("revoked").inc(len(keys))
        return len(keys)

    @property
    def open_runs(self) -> int:
        return len(self.folds)

    @property
    def held(self) -> int:
        return sum(len(v) for v in self._held_ts.values())

    @property
    def written_batches(self) -> int:
        return self.writer.batches
