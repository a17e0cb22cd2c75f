"""The retention index, prune marks and the run record's mark, on every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import datetime, timezone

import pytest

from stepstream.sinks import DeepStore, StepStore, open_deep_store
from stepstream.sinks.retention import now_text

from sink_support import COMPANY, OTHER, deep, run, state, step


class Clock:
    """An injected wall clock (seconds since the epoch), moved by hand."""

    def __init__(self, when: str = "2026-06-01T00:00:00") -> None:
        self.now = datetime.fromisoformat(when).replace(tzinfo=timezone.utc).timestamp()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def at(when: str) -> str:
    """A stored timestamp for ``YYYY-MM-DDTHH:MM:SS``."""
    return now_text(lambda: datetime.fromisoformat(when).replace(tzinfo=timezone.utc).timestamp())


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def clocked(store_url: str, clock: Clock) -> AsyncIterator[Callable[[], DeepStore]]:
    opened: list[DeepStore] = []

    async def open_() -> DeepStore:
        store = await open_deep_store(store_url, clock=clock)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        await store.close()


async def _write(store: DeepStore, run_id: str, when: str, rows: int = 2, company: str = COMPANY) -> None:
    await store.write([_deep_at(i, run_id, company, when) for i in range(rows)])


def _deep_at(seq: int, run_id: str, company: str, when: str):  # type: ignore[no-untyped-def]
    record = deep(seq, run_id, company, output=f'"{run_id}/{seq}"')
    record.ts = at(when)
    return record


async def test_rank_is_event_time_capped_at_receipt(clocked, clock: Clock) -> None:
    store = await clocked()
    # An agent a year ahead, received first: it ranks as when it arrived, not as next year.
    await _write(store, "future", "2027-06-01T00:00:00")
    clock.advance(3600)
    await _write(store, "later", "2026-06-01T01:00:00")
    clock.advance(3600)
    await _write(store, "latest", "2026-06-01T02:00:00")
    index = await store.retention_index(COMPANY)
    assert [r.run_id for r in index] == ["latest", "later", "future"]
    future = index[-1]
    assert future.rank == at("2026-06-01T00:00:00") and future.last_ts == at("2027-06-01T00:00:00")
    assert (future.version, future.bodies, future.pruned_at) == (1, 2, None)
    assert await store.prune(COMPANY, 2) == ["future"]
    assert await store.get_deep(COMPANY, "future") == []


async def test_a_backfill_keeps_its_own_order(clocked, clock: Clock) -> None:
    store = await clocked()
    # Old runs ingested now, newest first: they rank by their own times.
    for day in (5, 3, 4, 1, 2):
        await _write(store, f"day{day}", f"2020-01-0{day}T00:00:00")
        clock.advance(1)
    assert [r.run_id for r in await store.retention_index(COMPANY)] == ["day5", "day4", "day3", "day2", "day1"]
    assert await store.prune(COMPANY, 3) == ["day2", "day1"]


async def test_a_run_written_after_ranking_survives_the_mark(clocked, clock: Clock) -> None:
    store = await clocked()
    await _write(store, "old", "2026-05-01T00:00:00")
    await _write(store, "new", "2026-05-02T00:00:00")
    (new, old) = await store.retention_index(COMPANY)
    await store.write([_deep_at(5, "old", COMPANY, "2026-05-01T00:10:00")])  # it moves on after ranking
    assert await store.mark_pruned(COMPANY, [(old.run_id, old.version)], at("2026-06-01T00:00:00")) == []
    assert await store.delete_pruned(COMPANY, ["old"]) == 0
    assert len(await store.get_deep(COMPANY, "old")) == 3
    (_, moved) = await store.retention_index(COMPANY)
    assert moved.version == old.version + 1 and moved.pruned_at is None


async def test_a_marked_run_reads_empty_refuses_bodies_and_is_finished_later(clocked) -> None:
    store = await clocked()
    await _write(store, "a", "2026-05-01T00:00:00", rows=3)
    await _write(store, "a", "2026-05-01T00:00:00", rows=3, company=OTHER)  # same run id, other company
    (entry,) = await store.retention_index(COMPANY)
    when = at("2026-06-01T00:00:00")
    assert await store.mark_pruned(COMPANY, [("a", entry.version)], when) == ["a"]
    assert await store.mark_pruned(COMPANY, [("a", entry.version)], when) == []  # once
    # Killed here, between the mark and the delete: no reader sees a torn run.
    assert await store.get_deep(COMPANY, "a") == []
    assert await store.list_deep_runs(COMPANY) == []
    (marked,) = await store.retention_index(COMPANY)
    assert (marked.pruned_at, marked.bodies) == (when, 3)
    await store.write([_deep_at(7, "a", COMPANY, "2026-05-01T00:00:01")])  # a late body: refused
    assert await store.delete_pruned(COMPANY, ["a"]) == 3
    assert await store.delete_pruned(COMPANY, ["a"]) == 0
    (done,) = await store.retention_index(COMPANY)
    assert (done.pruned_at, done.bodies) == (when, 0)
    assert await store.get_deep(COMPANY, "a") == []
    # The other company's run of the same id is untouched.
    assert len(await store.get_deep(OTHER, "a")) == 3
    assert [r.pruned_at for r in await store.retention_index(OTHER)] == [None]


async def test_version_zero_marks_a_run_the_index_never_saw(clocked) -> None:
    store = await clocked()
    assert await store.mark_pruned(COMPANY, [("ghost", 0)], at("2026-06-01T00:00:00")) == ["ghost"]
    await _write(store, "ghost", "2026-05-01T00:00:00")
    assert await store.get_deep(COMPANY, "ghost") == []
    assert [(r.run_id, r.bodies) for r in await store.retention_index(COMPANY)] == [("ghost", 0)]


async def test_purge_forgets_a_live_run_but_keeps_a_pruned_mark(clocked) -> None:
    store = await clocked()
    await _write(store, "live", "2026-05-02T00:00:00")
    await _write(store, "gone", "2026-05-01T00:00:00")
    assert await store.prune(COMPANY, 1) == ["gone"]
    assert await store.purge_company(COMPANY) == 2
    assert [r.run_id for r in await store.retention_index(COMPANY)] == ["gone"]  # the mark stays
    await _write(store, "live", "2026-05-03T00:00:00", rows=1)  # a purged live run takes bodies again
    await _write(store, "gone", "2026-05-03T00:00:00", rows=1)  # a pruned one does not
    assert len(await store.get_deep(COMPANY, "live")) == 1
    assert await store.get_deep(COMPANY, "gone") == []
    assert await store.purge_run(COMPANY, "live") == 1
    assert [r.run_id for r in await store.retention_index(COMPANY)] == ["gone"]


async def test_list_companies_of_both_stores(clocked, step_store: StepStore) -> None:
    store = await clocked()
    await _write(store, "a", "2026-05-01T00:00:00", company="zeta")
    await _write(store, "a", "2026-05-01T00:00:00", company=OTHER)
    await step_store.write([step(0, "r", "beta")], [run("r", "beta")], [state("r", "beta", last_seq=0)])
    assert await store.list_companies() == [OTHER, "zeta"]
    assert await step_store.list_companies() == ["beta"]


async def test_the_run_records_mark_survives_later_run_writes(step_store: StepStore) -> None:
    await step_store.write([step(0)], [run(status="running")], [state(last_seq=0)])
    await step_store.write([step(0, company=OTHER)], [run(company=OTHER)], [state(company=OTHER, last_seq=0)])
    when = at("2026-06-01T00:00:00")
    assert await step_store.mark_deep_pruned(COMPANY, ["r1", "missing"], when) == 1
    assert await step_store.mark_deep_pruned(COMPANY, ["r1"], "2099-01-01T00:00:00.000000Z") == 0  # kept as is
    # The worker writes the run again (it never knows the mark): the mark stays.
    await step_store.write([step(1)], [run(status="completed", step_count=2)], [state(last_seq=1)])
    got = await step_store.get_run(COMPANY, "r1")
    assert got is not None and (got.status, got.step_count, got.deep_pruned_at) == ("completed", 2, when)
    assert (await step_store.get_run(OTHER, "r1")).deep_pruned_at is None  # type: ignore[union-attr]
    assert [r.deep_pruned_at for r in await step_store.list_runs(COMPANY)] == [when]


async def test_a_resumed_run_record_goes_back_to_running(step_store: StepStore) -> None:
    """A run record replaces whole: a status and an end time can go back (abandoned, then resumed)."""
    await step_store.write([], [run(status="abandoned", ended_at=at("2026-06-01T00:00:00"))], [state(last_seq=1)])
    await step_store.write([], [run(status="running")], [state(last_seq=2)])
    got = await step_store.get_run(COMPANY, "r1")
    assert got is not None and (got.status, got.ended_at) == ("running", None)


async def test_delete_runs_removes_whole_runs_of_one_company(step_store: StepStore) -> None:
    for company in (COMPANY, OTHER):
        for run_id in ("a", "b"):
            await step_store.write([step(0, run_id, company)], [run(run_id, company)], [state(run_id, company, last_seq=3)])
    assert await step_store.delete_runs(COMPANY, ["a", "nope"]) == 1
    assert await step_store.get_run(COMPANY, "a") is None
    assert await step_store.get_steps(COMPANY, "a") == []
    assert await step_store.load_states(COMPANY, ["a", "b"]) == {"b": state("b", last_seq=3)}
    assert len(await step_store.get_steps(OTHER, "a")) == 1
    assert await step_store.get_run(OTHER, "a") is not None
    # A run deleted whole starts over if it is written again.
    await step_store.write([step(0, "a")], [run("a")], [state("a", last_seq=0)])
    assert (await step_store.load_states(COMPANY, ["a"]))["a"].last_seq == 0


async def test_a_sqlite_file_from_before_the_mark_gets_its_column(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A runs table made before ``deep_pruned_at`` existed is migrated at open."""
    import sqlite3

    from stepstream.sinks import open_step_store

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE runs (company_id TEXT NOT NULL, run_id TEXT NOT NULL, status TEXT NOT NULL, "
            "recency TEXT NOT NULL, PRIMARY KEY (company_id, run_id)) WITHOUT ROWID"
        )
    store = await open_step_store(f"sqlite:///{path}")
    try:
        await store.write([], [run(status="completed")], [state(last_seq=0)])
        assert await store.mark_deep_pruned(COMPANY, ["r1"], at("2026-06-01T00:00:00")) == 1
        got = await store.get_run(COMPANY, "r1")
        assert got is not None and got.deep_pruned_at == at("2026-06-01T00:00:00")
    finally:
        await store.close()
