"""A range of a run's rows (``get_steps`` / ``get_deep`` with ``after`` and
``limit``): what the API pages with. Every backend reads the range, in ordinal
order, company- and run-scoped; paging by the last ordinal returns every row once."""

from __future__ import annotations

import pytest

from stepstream.sinks import DeepStore, StepStore

from sink_support import COMPANY, OTHER, deep, step

SEQS = (8, 0, 3, 1, 7, 12)  # written out of order, with holes


async def _seed_steps(store: StepStore) -> None:
    await store.write([step(s) for s in SEQS])
    await store.write([step(s, run="r2") for s in range(20)] + [step(s, company=OTHER) for s in range(20)])


async def _seed_deep(store: DeepStore) -> None:
    await store.write([deep(s) for s in SEQS])
    await store.write([deep(s, run="r2") for s in range(20)] + [deep(s, company=OTHER) for s in range(20)])


@pytest.mark.parametrize(
    ("after", "limit", "want"),
    [
        (None, None, [0, 1, 3, 7, 8, 12]),
        (None, 2, [0, 1]),
        (1, 2, [3, 7]),
        (2, None, [3, 7, 8, 12]),
        (-1, 1, [0]),
        (7, 100, [8, 12]),
        (12, 5, []),
        (10**9, None, []),
    ],
)
async def test_a_range_of_steps_and_of_bodies(
    step_store: StepStore, deep_store: DeepStore, after: int | None, limit: int | None, want: list[int]
) -> None:
    await _seed_steps(step_store)
    await _seed_deep(deep_store)
    got_steps = await step_store.get_steps(COMPANY, "r1", after=after, limit=limit)
    got_deep = await deep_store.get_deep(COMPANY, "r1", after=after, limit=limit)
    assert [s.step_seq for s in got_steps] == want
    assert [d.step_seq for d in got_deep] == want
    assert all(s.run_id == "r1" and s.company_id == COMPANY for s in got_steps)
    assert all(d.run_id == "r1" and d.company_id == COMPANY for d in got_deep)
    if after is None and limit is None:
        assert got_steps == await step_store.get_steps(COMPANY, "r1")
        assert got_deep == await deep_store.get_deep(COMPANY, "r1")


@pytest.mark.parametrize("limit", [1, 2, 5, 7])
async def test_paging_by_the_last_ordinal_returns_every_row_once(
    step_store: StepStore, deep_store: DeepStore, limit: int
) -> None:
    await _seed_steps(step_store)
    await _seed_deep(deep_store)
    for read in (step_store.get_steps, deep_store.get_deep):
        seen: list[int] = []
        after = None
        while True:
            rows = await read(COMPANY, "r1", after=after, limit=limit)
            assert len(rows) <= limit
            if not rows:
                break
            seen += [r.step_seq for r in rows]
            after = rows[-1].step_seq
        assert seen == sorted(SEQS)


async def test_a_limit_below_one_is_refused(step_store: StepStore, deep_store: DeepStore) -> None:
    with pytest.raises(ValueError):
        await step_store.get_steps(COMPANY, "r1", limit=0)
    with pytest.raises(ValueError):
        await deep_store.get_deep(COMPANY, "r1", limit=0)


async def test_a_pruned_run_has_no_range_of_bodies(deep_store: DeepStore) -> None:
    await _seed_deep(deep_store)
    await deep_store.prune(COMPANY, 1)  # keeps one of r1, r2: the newest
    kept = {run for run, _ in await deep_store.list_deep_runs(COMPANY)}
    for run in ("r1", "r2"):
        got = await deep_store.get_deep(COMPANY, run, after=0, limit=3)
        assert (got != []) == (run in kept)
