"""Purge and prune: counts, whole runs only, and steps survive every one of them."""

from __future__ import annotations

import pytest

from stepstream.sinks import DeepStore, StepStore

from sink_support import COMPANY, deep, run, step, ts


async def _runs_with_bodies(step_store: StepStore, deep_store: DeepStore, spans: dict[str, tuple[int, int]]) -> None:
    """Each run gets one step and one deep row per ``ts`` in its span (inclusive)."""
    for run_id, (first, last) in spans.items():
        seqs = range(last - first + 1)
        await step_store.write(
            [step(i, run_id, label=f"{run_id}/{i}") for i in seqs], [run(run_id, started_at=ts(first))]
        )
        await deep_store.write([deep(i, run_id, output=f'"{run_id}/{i}"', at=first + i) for i in seqs])


async def _assert_steps_intact(step_store: StepStore, spans: dict[str, tuple[int, int]]) -> None:
    for run_id, (first, last) in spans.items():
        assert [s.label for s in await step_store.get_steps(COMPANY, run_id)] == [
            f"{run_id}/{i}" for i in range(last - first + 1)
        ]
        assert await step_store.get_run(COMPANY, run_id) is not None


async def test_purge_run_counts_bodies_then_zero(step_store: StepStore, deep_store: DeepStore) -> None:
    spans = {"a": (1, 3), "b": (2, 2)}
    await _runs_with_bodies(step_store, deep_store, spans)
    assert await deep_store.purge_run(COMPANY, "a") == 3
    assert await deep_store.purge_run(COMPANY, "a") == 0
    assert await deep_store.get_deep(COMPANY, "a") == []
    assert len(await deep_store.get_deep(COMPANY, "b")) == 1
    assert [r for r, _ in await deep_store.list_deep_runs(COMPANY)] == ["b"]
    await _assert_steps_intact(step_store, spans)


async def test_a_purged_run_can_be_written_again(deep_store: DeepStore) -> None:
    await deep_store.write([deep(0, reasoning="old", kind="thinking", clipped=True)])
    await deep_store.purge_run(COMPANY, "r1")
    await deep_store.write([deep(0, reasoning="new", kind="thinking")])
    got = await deep_store.get_deep(COMPANY, "r1")
    assert [(d.reasoning, d.clipped) for d in got] == [("new", False)]


async def test_list_deep_runs_ranks_by_the_newest_body(deep_store: DeepStore) -> None:
    await deep_store.write([deep(0, "old-start", at=1), deep(1, "old-start", at=50)])
    await deep_store.write([deep(0, "mid", at=20), deep(1, "mid", at=30)])
    await deep_store.write([deep(0, "tie-a", at=40), deep(0, "tie-b", at=40)])
    assert await deep_store.list_deep_runs(COMPANY) == [
        ("old-start", ts(50)),
        ("tie-b", ts(40)),
        ("tie-a", ts(40)),
        ("mid", ts(30)),
    ]


async def test_prune_keeps_the_newest_runs_whole(step_store: StepStore, deep_store: DeepStore) -> None:
    # Interleaved spans: ranking rows instead of runs would tear runs apart.
    spans = {"r1": (1, 10), "r2": (3, 4), "r3": (5, 30), "r4": (2, 20), "r5": (25, 26)}
    await _runs_with_bodies(step_store, deep_store, spans)
    # Newest by last body: r3 (30), r5 (26), r4 (20), r1 (10), r2 (4).
    assert await deep_store.prune(COMPANY, 3) == ["r1", "r2"]
    assert [r for r, _ in await deep_store.list_deep_runs(COMPANY)] == ["r3", "r5", "r4"]
    for run_id, (first, last) in spans.items():
        got = await deep_store.get_deep(COMPANY, run_id)
        expected = 0 if run_id in ("r1", "r2") else last - first + 1
        assert len(got) == expected, run_id  # whole, or nothing: never torn
    assert await deep_store.prune(COMPANY, 3) == []
    assert await deep_store.prune(COMPANY, 10) == []
    assert await deep_store.prune(COMPANY, 1) == ["r5", "r4"]
    assert await deep_store.prune(COMPANY, 0) == ["r3"]
    assert await deep_store.list_deep_runs(COMPANY) == []
    await _assert_steps_intact(step_store, spans)


async def test_prune_refuses_a_negative_keep(deep_store: DeepStore) -> None:
    with pytest.raises(ValueError):
        await deep_store.prune(COMPANY, -1)


async def test_steps_survive_every_purge_and_prune(step_store: StepStore, deep_store: DeepStore) -> None:
    spans = {f"r{i}": (i, i + 2) for i in range(6)}
    await _runs_with_bodies(step_store, deep_store, spans)
    await deep_store.purge_run(COMPANY, "r0")
    await deep_store.prune(COMPANY, 2)
    await deep_store.purge_company(COMPANY)
    assert await deep_store.list_deep_runs(COMPANY) == []
    await _assert_steps_intact(step_store, spans)
    assert [r.run_id for r in await step_store.list_runs(COMPANY)] == [f"r{i}" for i in reversed(range(6))]
