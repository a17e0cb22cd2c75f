"""One compactor pass over every company, through the store ports only.

Per company, in this order (each stage is its own unit of failure):

1. **retain**: read the retention index; finish runs marked pruned that still hold
   bodies (a pass killed between the mark and the delete, or a body that raced the
   mark on MongoDB); choose the runs to drop (``policy.choose_pruned``); mark them in
   the deep store *only if their version is unchanged since the index was read*
   (``mark_pruned``: a run written meanwhile survives this pass); mark their run
   records (``StepStore.mark_deep_pruned``); delete their bodies (``delete_pruned``).
   Mark, record, delete: a pass killed anywhere leaves marked runs that no reader
   sees bodies of and that the next pass finishes, so every backend converges
   without transactions.
2. **abandon**: every ``running`` run idle for ``abandon_after_seconds`` gets a
   ``run_close`` on the raw topic under its key (``seq``: its last applied agent
   ``seq``, from its stored state); the worker folds it like any other event.
   A close is published once per run state per process (remembered only while the
   run stays idle and running, so the memory of it is bounded by the idle runs).
3. **expire** (step TTL, off by default): runs idle for ``step_ttl_seconds`` lose
   their bodies (``purge_run``), then their steps, run record and state
   (``delete_runs``).

**Errors.** A ``SinkError`` (retriable or not) or a Kafka error in a stage is
logged, counted in ``stepstream_compactor_errors_total{stage}`` and ends that stage
for that company; the pass goes on with the next one and is reported failed (its
time is not the last successful pass). Every step is idempotent, so the next pass
retries it. Anything else is a bug and propagates.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine
from datetime import datetime, timezone
from typing import Any, Protocol, TypeVar

import msgspec

from stepstream.compactor.policy import RetentionPolicy, choose_pruned, is_idle
from stepstream.core import wire
from stepstream.core.records import RunRecord
from stepstream.core.timefmt import format_ts
from stepstream.errors import SinkError
from stepstream.metrics import Metrics
from stepstream.sinks.ports import DeepRun, DeepStore, StepStore

log = logging.getLogger(__name__)

__all__ = ["Compactor", "PassReport", "Publisher", "close_event"]

PAGE = 500
T = TypeVar("T")


class Publisher(Protocol):
    """Where ``run_close`` events go: the raw topic, under the run's key."""

    async def publish(self, event: wire.RunClose) -> None: ...


class PassReport(msgspec.Struct):
    companies: int = 0
    runs_pruned: int = 0
    bodies_purged: int = 0
    runs_abandoned: int = 0
    runs_expired: int = 0
    errors: list[str] = []
    stopped: bool = False

    @property
    def ok(self) -> bool:
        return not self.errors and not self.stopped


def close_event(company_id: str, run_id: str, agent_seq: int, closes: int, now: float, idle: float) -> wire.RunClose:
    """The ``run_close`` for a run whose last applied agent seq is ``agent_seq`` (its
    ``event_id`` names the run state it closes, so a repeat is recognisable)."""
    return wire.RunClose(
        v=1,
        event_id=f"compactor-close:{closes}:{agent_seq}"[:128],
        company_id=company_id,
        run_id=run_id,
        seq=agent_seq,
        ts=datetime.fromtimestamp(now, timezone.utc),
        payload=wire.RunClosePayload(status="abandoned", reason=f"no activity for {int(idle)}s"),
    )


class _StageFailed(Exception):
    pass


class Compactor:
    """Runs passes (module docstring). ``clock`` is wall-clock seconds (injected)."""

    def __init__(
        self,
        steps: StepStore,
        deep: DeepStore,
        policy: RetentionPolicy,
        *,
        metrics: Metrics | None = None,
        publisher: Publisher | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.steps = steps
        self.deep = deep
        self.policy = policy
        self.metrics = metrics or Metrics()
        self.publisher = publisher
        self.clock = clock
        self.stopping = False
        self.passes = 0
        self.last_success: float | None = None
        # Per company, the (run, stored last_seq) a close was published for: kept only
        # while that run is still idle and running, so it holds at most the runs whose
        # close is in flight (a folded close makes the run ``abandoned``).
        self._closed: dict[str, set[tuple[str, int]]] = {}

    @property
    def closes_in_flight(self) -> int:
        """Runs a close was published for that are still idle and running (bounded by them)."""
        return sum(len(runs) for runs in self._closed.values())

    def stop(self) -> None:
        """Stop after the stage in progress."""
        self.stopping = True

    async def run_pass(self) -> PassReport:
        report = PassReport()
        started = time.perf_counter()
        now = self.clock()
        try:
            companies = sorted(set(await self.deep.list_companies()) | set(await self.steps.list_companies()))
        except SinkError as exc:
            self._failed(report, "list", "*", exc)
            companies = []
        for gone in self._closed.keys() - set(companies):
            del self._closed[gone]
        for company in companies:
            if self.stopping:
                report.stopped = True
                break
            report.companies += 1
            index = await self._stage(report, "retain", company, self._retain(company, now, report))
            await self._stage(report, "abandon", company, self._abandon(company, now, index or [], report))
            await self._stage(report, "expire", company, self._expire(company, now, index or [], report))
        self.passes += 1
        m = self.metrics
        m.compactor_pass.observe(time.perf_counter() - started)
        m.compactor_passes.labels("ok" if report.ok else "error").inc()
        if report.ok:
            self.last_success = self.clock()
            m.compactor_last_success.set(self.last_success)
        return report

    async def _stage(self, report: PassReport, stage: str, company: str, work: Coroutine[Any, Any, T]) -> T | None:
        if self.stopping:
            work.close()
            report.stopped = True
            return None
        try:
            return await work
        except SinkError as exc:
            self._failed(report, stage, company, exc)
        except _StageFailed as exc:
            self._failed(report, stage, company, exc.__cause__ or exc)
        return None

    def _failed(self, report: PassReport, stage: str, company: str, exc: BaseException) -> None:
        self.metrics.compactor_errors.labels(stage).inc()
        report.errors.append(f"{stage} {company}: {exc}")
        log.warning("compactor: %s of company %s failed (retried next pass): %s", stage, company, exc)

    # -- stages -------------------------------------------------------------------

    async def _retain(self, company: str, now: float, report: PassReport) -> list[DeepRun]:
        policy = self.policy.for_company(company)
        index = await self.deep.retention_index(company)
        at = format_ts(datetime.fromtimestamp(now, timezone.utc))
        # Marked runs still holding bodies: a pass that died after the mark. Their
        # records take the time of their own mark.
        unfinished: dict[str, list[str]] = {}
        for run in index:
            if run.pruned_at is not None and run.bodies > 0:
                unfinished.setdefault(run.pruned_at, []).append(run.run_id)
        chosen = choose_pruned(index, policy, now)
        marked = await self.deep.mark_pruned(company, [(r.run_id, r.version) for r in chosen], at) if chosen else []
        if marked:
            unfinished.setdefault(at, []).extend(marked)
        bodies = 0
        for when, run_ids in unfinished.items():
            await self.steps.mark_deep_pruned(company, run_ids, when)
            bodies += await self.deep.delete_pruned(company, run_ids)
        report.runs_pruned += len(marked)
        report.bodies_purged += bodies
        self.metrics.runs_pruned.inc(len(marked))
        self.metrics.bodies_purged.labels("retention").inc(bodies)
        if marked:
            log.info("compactor: %s: pruned the bodies of %d runs (%d rows)", company, len(marked), bodies)
        return index

    async def _runs(self, company: str) -> list[RunRecord]:
        runs: list[RunRecord] = []
        cursor = None
        while True:
            page = await self.steps.list_runs_page(company, limit=PAGE, before=cursor)
            runs.extend(page.runs)
            cursor = page.next_cursor
            if cursor is None or self.stopping:
                return runs

    async def _abandon(self, company: str, now: float, index: list[DeepRun], report: PassReport) -> None:
        seconds = self.policy.for_company(company).abandon_after_seconds
        if seconds <= 0 or self.publisher is None:
            self._closed.pop(company, None)
            return
        entries = {r.run_id: r for r in index}
        idle = [
            r for r in await self._runs(company) if r.status == "running" and is_idle(r, entries.get(r.run_id), seconds, now)
        ]
        if not idle:
            self._closed.pop(company, None)
            return
        states = await self.steps.load_states(company, [r.run_id for r in idle])
        published = self._closed.get(company, set())
        closed = self._closed[company] = {
            (run_id, last_seq) for run_id, last_seq in published if (state := states.get(run_id)) and state.last_seq == last_seq
        }
        for run in idle:
            state = states.get(run.run_id)
            if state is None:
                continue  # nothing durable yet: its events are still on their way
            key = (run.run_id, state.last_seq)
            agent_seq = state.agent_seq
            if key in closed or agent_seq < 0:
                continue
            event = close_event(company, run.run_id, agent_seq, state.closes, now, seconds)
            try:
                await self.publisher.publish(event)
            except Exception as exc:  # noqa: BLE001 - a broker error ends the stage, counted
                raise _StageFailed(f"publishing a run_close failed: {type(exc).__name__}") from exc
            closed.add(key)
            report.runs_abandoned += 1
            self.metrics.runs_abandoned.inc()
            log.info("compactor: %s/%s: no activity for %ds, published run_close", company, run.run_id, int(seconds))

    async def _expire(self, company: str, now: float, index: list[DeepRun], report: PassReport) -> None:
        seconds = self.policy.for_company(company).step_ttl_seconds
        if seconds <= 0:
            return
        entries = {r.run_id: r for r in index}
        old = [r.run_id for r in await self._runs(company) if is_idle(r, entries.get(r.run_id), seconds, now)]
        if not old:
            return
        bodies = 0
        for run_id in old:  # bodies first, the run record last: a killed pass finds the run again
            bodies += await self.deep.purge_run(company, run_id)
        gone = await self.steps.delete_runs(company, old)
        report.runs_expired += gone
        report.bodies_purged += bodies
        self.metrics.runs_expired.inc(gone)
        self.metrics.bodies_purged.labels("step_ttl").inc(bodies)
