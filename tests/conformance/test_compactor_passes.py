"""A compactor pass on every backend: limits and overrides, TTLs on an injected clock,
the run record's mark, abandoned runs, and passes that fail midway (a fault-injecting
store) converging on the next pass without a torn run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timezone
from pathlib import Path

import msgspec
import pytest

from stepstream.compactor.passes import Compactor
from stepstream.compactor.policy import CompanyPolicy, RetentionPolicy
from stepstream.core import wire
from stepstream.metrics import Metrics
from stepstream.sinks import DeepStore, StepStore, open_deep_store, open_step_store
from stepstream.sinks.faults import wrap_stores, write_plan

from sink_support import state


def epoch(when: str) -> float:
    return datetime.fromisoformat(when).replace(tzinfo=timezone.utc).timestamp()


class Clock:
    def __init__(self) -> None:
        self.now = epoch("2026-06-01T00:00:00")

    def __call__(self) -> float:
        return self.now


def text(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="microseconds")[:-6] + "Z"


class Recorder:
    def __init__(self) -> None:
        self.events: list[wire.RunClose] = []

    async def publish(self, event: wire.RunClose) -> None:
        self.events.append(event)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def stores(store_url: str, clock: Clock) -> AsyncIterator[tuple[StepStore, DeepStore]]:
    steps = await open_step_store(store_url)
    deep = await open_deep_store(store_url, clock=clock)
    yield steps, deep
    await steps.close()
    await deep.close()


async def add_run(steps: StepStore, deep: DeepStore, company: str, run_id: str, when: float, *, rows: int = 3,
                  status: str = "completed", last_seq: int = 10) -> None:  # fmt: skip
    from stepstream.core.records import DeepRecord, RunRecord, StepRecord

    await deep.write(
        [DeepRecord(company_id=company, run_id=run_id, step_seq=i, kind="tool", ts=text(when), output=f'"{i}"')
         for i in range(rows)]
    )  # fmt: skip
    await steps.write(
        [StepRecord(company_id=company, run_id=run_id, step_seq=i, kind="tool", label=f"s{i}") for i in range(rows)],
        [RunRecord(company_id=company, run_id=run_id, status=status, started_at=text(when), last_event_at=text(when))],  # type: ignore[arg-type]
        [state(run_id, company, last_seq=last_seq)],
    )


async def held(steps: StepStore, deep: DeepStore, company: str) -> dict[str, int]:
    """Run id -> bodies a reader sees, for every run of the company; asserts no run is torn."""
    out = {}
    for run in await steps.list_runs(company, limit=1000):
        bodies = len(await deep.get_deep(company, run.run_id))
        assert bodies in (0, run.step_count or len(await steps.get_steps(company, run.run_id))), run.run_id
        assert len(await steps.get_steps(company, run.run_id)) == 3  # steps are never touched
        out[run.run_id] = bodies
    return out


def policy(keep: int = 2, **overrides: CompanyPolicy) -> RetentionPolicy:
    return RetentionPolicy(CompanyPolicy(deep_runs=keep, abandon_after_seconds=0), dict(overrides))


async def test_limits_and_overrides_per_company(stores, clock: Clock) -> None:
    steps, deep = stores
    # Three companies share run ids; "big" may keep 4.
    for company in ("acme", "big", "small"):
        for i in range(6):
            clock.now += 60
            await add_run(steps, deep, company, f"run-{i}", clock.now)
    compactor = Compactor(steps, deep, policy(2, big=CompanyPolicy(deep_runs=4, abandon_after_seconds=0)),
                          clock=clock, metrics=Metrics())  # fmt: skip
    report = await compactor.run_pass()
    assert report.ok and report.runs_pruned == 4 + 2 + 4 and report.bodies_purged == 3 * 10
    for company, keep in (("acme", 2), ("big", 4), ("small", 2)):
        bodies = await held(steps, deep, company)
        assert sorted(r for r, n in bodies.items() if n) == [f"run-{i}" for i in range(6 - keep, 6)]
        marks = {r.run_id: r.deep_pruned_at for r in await steps.list_runs(company, limit=100)}
        assert {r for r, m in marks.items() if m} == {f"run-{i}" for i in range(6 - keep)}
        assert set(marks.values()) == {None, text(clock.now)}
    assert compactor.metrics.runs_pruned._value.get() == 10
    again = await compactor.run_pass()
    assert again.ok and again.runs_pruned == 0 and again.bodies_purged == 0


async def test_a_future_clock_does_not_outlive_retention(stores, clock: Clock) -> None:
    steps, deep = stores
    await add_run(steps, deep, "acme", "skewed", epoch("2027-06-01T00:00:00"))  # an agent a year ahead
    for i in range(3):
        clock.now += 60
        await add_run(steps, deep, "acme", f"run-{i}", clock.now)
    report = await Compactor(steps, deep, policy(3), clock=clock).run_pass()
    assert report.runs_pruned == 1
    assert (await held(steps, deep, "acme"))["skewed"] == 0


async def test_deep_and_step_ttls(stores, clock: Clock) -> None:
    steps, deep = stores
    await add_run(steps, deep, "acme", "old", clock.now)
    clock.now += 3 * 86400
    await add_run(steps, deep, "acme", "mid", clock.now)
    clock.now += 86400
    await add_run(steps, deep, "acme", "new", clock.now)
    ttl = CompanyPolicy(deep_runs=50, deep_ttl_seconds=2 * 86400, abandon_after_seconds=0)
    report = await Compactor(steps, deep, RetentionPolicy(ttl), clock=clock).run_pass()
    assert report.runs_pruned == 1 and (await held(steps, deep, "acme")) == {"old": 0, "mid": 3, "new": 3}
    whole = CompanyPolicy(deep_runs=50, step_ttl_seconds=2 * 86400, abandon_after_seconds=0)
    clock.now += 1.5 * 86400  # old and mid are past two days, new is not
    report = await Compactor(steps, deep, RetentionPolicy(whole), clock=clock).run_pass()
    assert report.runs_expired == 2 and report.bodies_purged == 3
    assert [r.run_id for r in await steps.list_runs("acme")] == ["new"]
    assert await steps.get_steps("acme", "mid") == [] and await deep.get_deep("acme", "mid") == []


async def test_abandoned_runs_get_one_close_each(stores, clock: Clock) -> None:
    steps, deep = stores
    await add_run(steps, deep, "acme", "idle", clock.now, status="running", last_seq=7)
    await add_run(steps, deep, "acme", "done", clock.now, status="completed")
    clock.now += 3000
    # Its agent clock is a year behind: activity is when its bodies arrived, not its ts.
    await add_run(steps, deep, "other", "idle", clock.now - 365 * 86400, status="running", last_seq=2)
    recorder = Recorder()
    hour = RetentionPolicy(CompanyPolicy(abandon_after_seconds=3600))
    compactor = Compactor(steps, deep, hour, clock=clock, publisher=recorder)
    clock.now += 599
    assert (await compactor.run_pass()).runs_abandoned == 0
    clock.now += 2
    report = await compactor.run_pass()
    assert report.runs_abandoned == 1
    (close,) = recorder.events
    assert (close.company_id, close.run_id, close.seq, close.payload.status) == ("acme", "idle", 7, "abandoned")
    assert close.ts.timestamp() == clock.now
    assert wire.decode_event(wire.encode_event(close)) == close  # it is a valid wire event
    assert (await compactor.run_pass()).runs_abandoned == 0  # published once per run state


async def test_an_abandoned_run_with_late_events_gets_the_close_its_fold_takes(stores, clock: Clock) -> None:
    """The close names the agent seq the fold resumes at (one helper for both): a run
    that ever had a late event is closed, not left running with an ignored close."""
    from stepstream.core.fold import RunFold

    steps, deep = stores
    script = [(0, "run_start", {"agent_name": "bot"}), (2, "state_change", {"key": "k", "value": 2}),
              (1, "state_change", {"key": "k", "value": 1})]  # seq 1 arrives late, filling the gap  # fmt: skip
    fold = RunFold("acme", "late")
    outputs = []
    for seq, kind, payload in script:
        event = wire.decode_event(msgspec.json.encode({
            "v": 1, "event_id": f"e{seq}", "company_id": "acme", "run_id": "late", "seq": seq,
            "ts": text(clock.now), "type": kind, "payload": payload}))  # fmt: skip
        outputs.append(fold.push(event, 0.0))
    last = outputs[-1]
    assert last is not None and last.late and last.state is not None and last.state.run is not None
    assert (last.state.last_seq, last.state.run.late_events) == (3, 1)
    await deep.write([deep_row("late", clock.now)])
    run = msgspec.structs.replace(last.state.run, last_event_at=text(clock.now))
    await steps.write([s for out in outputs if out for s in out.steps], [run], [last.state])
    recorder = Recorder()
    compactor = Compactor(steps, deep, RetentionPolicy(CompanyPolicy(abandon_after_seconds=60)), clock=clock,
                          publisher=recorder)  # fmt: skip
    clock.now += 120
    assert (await compactor.run_pass()).runs_abandoned == 1
    (close,) = recorder.events
    assert close.seq == 2  # the last agent seq applied, not last_seq - closes (3)
    (stored,) = (await steps.load_states("acme", ["late"])).values()
    resumed = RunFold("acme", "late", stored)
    closed = resumed.push(close, 1.0)
    assert closed is not None and closed.run is not None and closed.run.status == "abandoned"
    assert resumed.stale == 0


async def test_the_memory_of_published_closes_is_bounded_by_the_idle_runs(stores, clock: Clock) -> None:
    steps, deep = stores
    for i in range(5):
        await add_run(steps, deep, "acme", f"idle-{i}", clock.now, status="running", last_seq=3)
    compactor = Compactor(steps, deep, RetentionPolicy(CompanyPolicy(abandon_after_seconds=60)), clock=clock,
                          publisher=Recorder())  # fmt: skip
    clock.now += 120
    assert (await compactor.run_pass()).runs_abandoned == 5
    assert compactor.closes_in_flight == 5
    # The worker folds the closes: the runs are abandoned, no longer idle and running.
    from stepstream.core.records import RunRecord

    for i in range(5):
        await steps.write([], [RunRecord(company_id="acme", run_id=f"idle-{i}", status="abandoned")],
                          [state(f"idle-{i}", "acme", last_seq=4, closes=1)])  # fmt: skip
    assert (await compactor.run_pass()).runs_abandoned == 0
    assert compactor.closes_in_flight == 0


def deep_row(run_id: str, when: float):
    from stepstream.core.records import DeepRecord

    return DeepRecord(company_id="acme", run_id=run_id, step_seq=0, kind="tool", ts=text(when), output='"x"')


FAULTS = [
    pytest.param({"store": "deep", "op": "delete_pruned", "action": "fatal"}, id="before-delete"),
    pytest.param({"store": "steps", "op": "mark_deep_pruned", "action": "fail"}, id="before-record"),
    pytest.param({"store": "deep", "op": "mark_pruned", "action": "fail_after"}, id="after-mark"),
    pytest.param({"store": "deep", "op": "delete_pruned", "action": "fail_after"}, id="after-delete"),
    pytest.param({"store": "deep", "op": "retention_index", "action": "fail"}, id="before-ranking"),
]


@pytest.mark.parametrize("rule", FAULTS)
async def test_a_pass_that_fails_midway_converges_on_the_next(stores, clock: Clock, tmp_path: Path, rule) -> None:
    steps, deep = stores
    for company in ("acme", "globex"):
        for i in range(5):
            clock.now += 60
            await add_run(steps, deep, company, f"run-{i}", clock.now)
    plan = tmp_path / "faults.json"
    write_plan(plan, {"rules": [{**rule, "count": 1}]})
    faulty_steps, faulty_deep = wrap_stores(steps, deep, plan)
    metrics = Metrics()
    first = await Compactor(faulty_steps, faulty_deep, policy(2), clock=clock, metrics=metrics).run_pass()
    assert first.errors and not first.ok
    assert sum(s.value for s in metrics.compactor_errors.collect()[0].samples if s.name.endswith("_total")) == 1
    for company in ("acme", "globex"):
        await held(steps, deep, company)  # whatever the failure left, no reader sees a torn run
    # A fresh compactor (the first one was "killed") finishes the job.
    second = await Compactor(steps, deep, policy(2), clock=clock).run_pass()
    assert second.ok
    for company in ("acme", "globex"):
        bodies = await held(steps, deep, company)
        assert bodies == {f"run-{i}": (3 if i >= 3 else 0) for i in range(5)}
        marks = {r.run_id: r.deep_pruned_at for r in await steps.list_runs(company, limit=100)}
        assert {r for r, m in marks.items() if m} == {"run-0", "run-1", "run-2"}
        assert all(r.bodies == 0 for r in await deep.retention_index(company) if r.pruned_at)
