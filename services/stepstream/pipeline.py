"""The one path from decoded events to durable rows, shared by ``stepstream worker``
and ``stepstream ingest-file`` so both make exactly the same records.

Contract:

* :meth:`Pipeline.push` applies one event to its run's fold (loading the run's
  durable :class:`RunState` from the step store the first time the run is seen)
  and queues what the fold produced in the current batch. Each event carries an
  opaque *token*; ``on_durable(tokens)`` is called with it once the event's
  effect is durable: after the batch holding its rows is written, and for a
  thinking delta still in an unflushed tail, only after that tail is flushed
  and written. The caller acks (commits) on that signal and never earlier.
* A batch is written deep store first, then steps, run records and fold states
  (one transaction on SQLite). A crash between the two leaves rows a replay
  rewrites identically.
* Not thread-safe and not re-entrant: callers serialize calls (the worker holds
  one lock around push, flush and idle flush).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from stepstream.core.fold import Limits, Output, RunFold
from stepstream.core.merge import can_merge_deep, merge_deep, merge_step
from stepstream.core.records import DeepRecord, RunRecord, RunState, StepRecord
from stepstream.core.wire import Event
from stepstream.metrics import Metrics
from stepstream.sinks.ports import DeepStore, StepStore

RunKey = tuple[str, str]
OnDurable = Callable[[list[Any]], None]


class RowBatch:
    """Rows of one write, coalesced by key with the store's own merge semantics
    (``core.merge``), plus the tokens and event times that become durable with it."""

    __slots__ = ("steps", "deeps", "deep_at", "runs", "states", "tokens", "event_ts", "types", "opened")

    def __init__(self, now: float = 0.0) -> None:
        self.steps: dict[tuple[str, str, int], StepRecord] = {}
        self.deeps: list[DeepRecord] = []
        self.deep_at: dict[tuple[str, str, int], int] = {}
        self.runs: dict[RunKey, RunRecord] = {}
        self.states: dict[RunKey, RunState] = {}
        self.tokens: list[Any] = []
        self.event_ts: list[float] = []
        self.types: Counter[str] = Counter()
        self.opened = now

    def __len__(self) -> int:
        return len(self.steps) + len(self.deeps) + len(self.runs) + len(self.tokens)

    def add_step(self, step: StepRecord) -> None:
        key = (step.company_id, step.run_id, step.step_seq)
        self.steps[key] = merge_step(self.steps.get(key), step)

    def add_deep(self, deep: DeepRecord) -> None:
        """Merge into the pending row of the same key when no character would be
        lost; otherwise keep it as a separate write, applied in order."""
        key = (deep.company_id, deep.run_id, deep.step_seq)
        at = self.deep_at.get(key)
        if at is not None and can_merge_deep(self.deeps[at], deep):
            self.deeps[at] = merge_deep(self.deeps[at], deep)
        else:
            self.deep_at[key] = len(self.deeps)
            self.deeps.append(deep)

    def add(self, out: Output) -> None:
        for step in out.steps:
            self.add_step(step)
        for deep in out.deeps:
            self.add_deep(deep)
        if out.run is not None:
            self.runs[(out.run.company_id, out.run.run_id)] = out.run
        if out.state is not None:
            self.states[(out.state.company_id, out.state.run_id)] = out.state


class Pipeline:
    """Folds events into batches and writes them; see the module docstring."""

    def __init__(
        self,
        steps: StepStore,
        deep: DeepStore,
        *,
        limits: Limits | None = None,
        metrics: Metrics | None = None,
        on_durable: OnDurable | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        batch_records: int = 2000,
        batch_seconds: float = 0.05,
        evict_after_seconds: float = 60.0,
    ) -> None:
        self._steps = steps
        self._deep = deep
        self._limits = limits or Limits()
        self._metrics = metrics
        self._on_durable = on_durable
        self._clock = clock
        self._wall = wall_clock
        self._batch_records = batch_records
        self._batch_seconds = batch_seconds
        self._evict_after = evict_after_seconds
        self._folds: dict[RunKey, RunFold] = {}
        self._touched: dict[RunKey, float] = {}
        self._held: dict[RunKey, list[Any]] = {}
        self._ended: set[RunKey] = set()
        self._tails: set[RunKey] = set()  # runs whose fold holds an unflushed thinking tail
        self._next_idle_check = 0.0
        self._next_evict = 0.0
        self._batch = RowBatch(clock())
        self.written_batches = 0

    # -- events -------------------------------------------------------------

    async def push(self, event: Event, token: Any = None) -> None:
        """Apply one event; may write a batch when it is full."""
        key = (event.company_id, event.run_id)
        fold = self._folds.get(key)
        if fold is None:
            fold = await self._load(key)
        now = self._clock()
        self._touched[key] = now
        out = fold.push(event, now)
        batch = self._batch
        if out is None:
            if self._metrics is not None:
                self._metrics.duplicates.inc()
            batch.tokens.append(token)
        else:
            batch.types[event.__struct_config__.tag] += 1
            self._take(key, out, token, event.ts.timestamp())
            if event.__struct_config__.tag == "run_end":
                self._ended.add(key)
        if len(batch) >= self._batch_records:
            await self.flush()

    def _take(self, key: RunKey, out: Output, token: Any, ts: float | None = None) -> None:
        batch = self._batch
        batch.add(out)
        if self._metrics is not None and (out.flushes or out.clipped):
            for trigger in out.flushes:
                self._metrics.thinking_flushes.labels(trigger).inc()
            for field in out.clipped:
                self._metrics.clipped.labels(field).inc()
        if out.state is None:
            # Buffered in the fold's tail: durable only when the tail is flushed.
            self._held.setdefault(key, []).append((token, ts))
            self._tails.add(key)
            return
        self._tails.discard(key)
        held = self._held.pop(key, None)
        if held:
            for held_token, held_ts in held:
                batch.tokens.append(held_token)
                batch.event_ts.append(held_ts)
        batch.tokens.append(token)
        if ts is not None:
            batch.event_ts.append(ts)

    async def _load(self, key: RunKey) -> RunFold:
        states = await self._steps.load_states(key[0], [key[1]])
        fold = RunFold(key[0], key[1], states.get(key[1]), self._limits)
        self._folds[key] = fold
        return fold

    # -- batches ------------------------------------------------------------

    def due(self) -> bool:
        """Whether the current batch is old enough to be written."""
        return len(self._batch) > 0 and self._clock() - self._batch.opened >= self._batch_seconds

    async def flush(self) -> None:
        """Write the current batch (deep first, then steps/runs/states) and report
        its tokens durable. A no-op for an empty batch."""
        batch = self._batch
        self._batch = RowBatch(self._clock())
        if not batch.steps and not batch.deeps and not batch.runs and not batch.states:
            if batch.tokens and self._on_durable is not None:
                self._on_durable(batch.tokens)
            return
        m = self._metrics
        started = time.perf_counter()
        if batch.deeps:
            await self._deep.write(batch.deeps)
        deep_done = time.perf_counter()
        await self._steps.write(list(batch.steps.values()), list(batch.runs.values()), list(batch.states.values()))
        done = time.perf_counter()
        self.written_batches += 1
        if m is not None:
            m.sink_write.labels("deep").observe(deep_done - started)
            m.sink_write.labels("steps").observe(done - deep_done)
            m.rows_written.labels("step").inc(len(batch.steps))
            m.rows_written.labels("deep").inc(len(batch.deeps))
            m.rows_written.labels("run").inc(len(batch.runs))
            for kind, n in batch.types.items():
                m.events.labels(kind).inc(n)
            wall = self._wall()
            observe = m.ingest_lag.observe
            for ts in batch.event_ts:
                if ts is not None:
                    observe(max(0.0, wall - ts))
        if self._on_durable is not None and batch.tokens:
            self._on_durable(batch.tokens)
        self._evict()

    def _evict(self) -> None:
        """Forget folds whose state is durable and that are done (after every write)
        or idle (checked every few seconds); they reload from the step store if
        their run speaks again."""
        for key in self._ended:
            fold = self._folds.get(key)
            if fold is not None and not fold.pending:
                del self._folds[key]
                self._touched.pop(key, None)
        self._ended = {k for k in self._ended if k in self._folds}
        now = self._clock()
        if now >= self._next_evict:
            self._next_evict = now + 5.0
            for key, touched in list(self._touched.items()):
                if now - touched >= self._evict_after and not self._folds[key].pending:
                    del self._folds[key]
                    del self._touched[key]
                    self._ended.discard(key)
        if self._metrics is not None:
            self._metrics.open_runs.set(len(self._folds))
            self._metrics.pending_events.set(sum(len(v) for v in self._held.values()))

    async def tick(self) -> None:
        """Periodic work: flush idle thinking tails, then write a due batch."""
        now = self._clock()
        if self._tails and now >= self._next_idle_check:
            # Idle tails are checked a few times per idle period, not on every tick.
            self._next_idle_check = now + self._limits.idle_seconds / 4
            for key in list(self._tails):
                fold = self._folds.get(key)
                if fold is None:
                    self._tails.discard(key)
                    continue
                out = fold.flush_idle(now)
                if out is not None:
                    self._take(key, out, None)
        if self.due():
            await self.flush()

    async def drain(self) -> None:
        """Make everything durable now: flush every pending tail (as an idle flush
        would, so records equal a run that waited) and write the batch."""
        for key in list(self._tails):
            out = self._folds[key].flush("idle")
            if out is not None:
                self._take(key, out, None)
        self._tails.clear()
        await self.flush()

    def forget(self, keep: Callable[[RunKey], bool]) -> list[Any]:
        """Drop folds (and their held tokens) for which ``keep`` is false, e.g. runs of
        revoked partitions; returns the dropped held tokens. Call after :meth:`flush`."""
        dropped: list[Any] = []
        for key in list(self._folds):
            if not keep(key):
                del self._folds[key]
                self._touched.pop(key, None)
                self._ended.discard(key)
                self._tails.discard(key)
                dropped.extend(token for token, _ in self._held.pop(key, ()))
        return dropped

    @property
    def open_runs(self) -> int:
        return len(self._folds)

    @property
    def held(self) -> int:
        return sum(len(v) for v in self._held.values())
