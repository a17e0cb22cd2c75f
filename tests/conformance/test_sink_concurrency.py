"""Concurrent writers to different runs lose nothing: tasks on one store, two store
instances on the same storage, and a second process writing while we read; and two
writers of one run (a stale owner woke up late) never undo the newer one's work."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import stepstream
from stepstream.core.records import DeepRecord
from stepstream.sinks import DeepStore, StepStore

from interleave import LateWriter
from sink_support import COMPANY, deep, run, state, step, ts

CHUNK = 40
BATCHES = 12


def _reasoning(run_id: str) -> str:
    return "".join(f"[{run_id}:{i}:\U0001f9e0]" for i in range(BATCHES * 8))


async def _write_run(step_store: StepStore, deep_store: DeepStore, run_id: str) -> None:
    """One run written the way the engine writes it: thinking flushed in positional
    chunks, a tool call then its result, the run record and its state every batch."""
    text = _reasoning(run_id)
    size = len(text) // BATCHES + 1
    for b in range(BATCHES):
        chunk = text[b * size : (b + 1) * size]
        await deep_store.write(
            [
                deep(0, run_id, kind="thinking", reasoning=chunk, reasoning_offset=b * size, at=b),
                deep(b + 1, run_id, arguments=f'{{"b":{b}}}', at=b),
                deep(b + 1, run_id, output=f'"out {run_id} {b}"', at=b),
            ]
        )
        await step_store.write(
            [
                step(0, run_id, kind="thinking", started_at=ts(0)),
                step(b + 1, run_id, label=f"call {b}", status="running"),
                step(b + 1, run_id, status="ok", ended_at=ts(b)),
            ],
            [run(run_id, started_at=ts(0), step_count=b + 2)],
            [state(run_id, last_seq=b, next_ordinal=b + 2)],
        )
        await asyncio.sleep(0)


async def _assert_run_complete(step_store: StepStore, deep_store: DeepStore, run_id: str) -> None:
    got_deep = await deep_store.get_deep(COMPANY, run_id)
    assert got_deep[0].reasoning == _reasoning(run_id), run_id
    assert [(d.step_seq, d.arguments, d.output) for d in got_deep[1:]] == [
        (b + 1, f'{{"b":{b}}}', f'"out {run_id} {b}"') for b in range(BATCHES)
    ]
    got_steps = await step_store.get_steps(COMPANY, run_id)
    assert [(s.step_seq, s.label, s.status) for s in got_steps[1:]] == [
        (b + 1, f"call {b}", "ok") for b in range(BATCHES)
    ]
    assert (await step_store.get_run(COMPANY, run_id)).step_count == BATCHES + 1
    assert (await step_store.load_states(COMPANY, [run_id]))[run_id].last_seq == BATCHES - 1


async def test_concurrent_writers_to_different_runs_lose_nothing(step_store: StepStore, deep_store: DeepStore) -> None:
    run_ids = [f"run-{i}" for i in range(CHUNK)]
    await asyncio.gather(*(_write_run(step_store, deep_store, r) for r in run_ids))
    for run_id in run_ids:
        await _assert_run_complete(step_store, deep_store, run_id)
    assert len(await step_store.list_runs(COMPANY, limit=1000)) == CHUNK
    assert len(await deep_store.list_deep_runs(COMPANY)) == CHUNK


async def test_two_store_instances_on_the_same_storage(
    open_steps: Callable[[], Awaitable[StepStore]],
    open_deep: Callable[[], Awaitable[DeepStore]],
    needs: Callable[[object, str], None],
) -> None:
    first = (await open_steps(), await open_deep())
    second = (await open_steps(), await open_deep())
    needs(first[0], "shared_storage")
    run_ids = [f"run-{i}" for i in range(10)]
    await asyncio.gather(*(_write_run(*(first if i % 2 else second), r) for i, r in enumerate(run_ids)))
    for stores in (first, second):
        for run_id in run_ids:
            await _assert_run_complete(*stores, run_id)
    # A purge through one instance is seen by the other.
    assert await first[1].purge_run(COMPANY, "run-0") == BATCHES + 1
    assert await second[1].get_deep(COMPANY, "run-0") == []
    assert await second[1].purge_run(COMPANY, "run-0") == 0


_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from stepstream.sinks import open_deep_store, open_step_store
    from stepstream.core.records import DeepRecord, StepRecord

    async def main(url, count):
        steps, deep = await open_step_store(url), await open_deep_store(url)
        for i in range(count):
            await deep.write([DeepRecord(company_id="acme", run_id="child", step_seq=i, kind="tool",
                                         ts="2025-01-01T00:00:00.000000Z", output='"x"' * 500)])
            await steps.write([StepRecord(company_id="acme", run_id="child", step_seq=i, kind="tool")])
        await steps.close()
        await deep.close()

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    """
)


async def test_another_process_writes_while_we_read(
    store_url: str,
    step_store: StepStore,
    deep_store: DeepStore,
    needs: Callable[[object, str], None],
) -> None:
    needs(step_store, "shared_storage")
    count = 150
    services = str(Path(stepstream.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [services, os.environ.get("PYTHONPATH")]))}
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", _CHILD, store_url, str(count), env=env)
    writer = asyncio.create_task(_write_run(step_store, deep_store, "parent"))
    while child.returncode is None:
        rows = await deep_store.get_deep(COMPANY, "child")
        assert [d.step_seq for d in rows] == list(range(len(rows)))  # a prefix, never a torn row
        assert all(d.output == '"x"' * 500 for d in rows)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(child.wait(), 0.01)
    await writer
    assert child.returncode == 0
    assert len(await deep_store.get_deep(COMPANY, "child")) == count
    assert len(await step_store.get_steps(COMPANY, "child")) == count
    await _assert_run_complete(step_store, deep_store, "parent")


async def test_a_large_batch_of_rewrites_lands(step_store: StepStore, deep_store: DeepStore) -> None:
    # 300 updates of existing rows in one write: FerretDB 1.24 deadlocks on ~100 in
    # one command unless the adapter splits it (see sinks/mongodb.py).
    n = 300
    await deep_store.write([deep(i, output='"first"') for i in range(n)])
    await step_store.write([step(i, label="first") for i in range(n)])
    await asyncio.wait_for(deep_store.write([deep(i, output='"second"') for i in range(n)]), 60)
    await asyncio.wait_for(step_store.write([step(i, status="ok") for i in range(n)]), 60)
    assert {d.output for d in await deep_store.get_deep(COMPANY, "r1")} == {'"second"'}
    assert {(s.label, s.status) for s in await step_store.get_steps(COMPANY, "r1")} == {("first", "ok")}


@pytest.mark.requires("monotonic_states")  # a race lost only sometimes: no strict xfail can hold it
async def test_racing_owners_never_move_a_state_backwards(
    open_steps: Callable[[], Awaitable[StepStore]], needs: Callable[[object, str], None]
) -> None:
    """Two owners of one run (the old one woke up late) write at the same time
    through two store instances: whatever the interleaving, the stored state ends
    at the highest ``last_seq`` written and the run record belongs to it."""
    first, second = await open_steps(), await open_steps()
    needs(first, "shared_storage")
    top = 40
    rng = random.Random(8)
    seqs = list(range(1, top + 1))
    rng.shuffle(seqs)

    async def owner(store: StepStore, mine: list[int]) -> None:
        for seq in mine:
            skipped = await store.write(
                [step(seq, label=f"s{seq}")], [run(step_count=seq)], [state(last_seq=seq, next_ordinal=seq + 1)]
            )
            assert skipped in ([], [(COMPANY, "r1")])
            await asyncio.sleep(0)

    await asyncio.gather(owner(first, seqs[::2]), owner(second, seqs[1::2]))
    for store in (first, second):
        assert (await store.load_states(COMPANY, ["r1"]))["r1"].last_seq == top
        if store.capabilities.atomic_batch:  # rows and state decided together
            assert (await store.get_run(COMPANY, "r1")).step_count == top


# Consecutive chunks of one thinking step (astral characters: offsets count code points).
CHUNKS = tuple(f"{letter * 4}\U0001f9e0" for letter in "ABCD")


def _chunk(k: int) -> DeepRecord:
    offset = sum(len(c) for c in CHUNKS[:k])
    return deep(0, kind="thinking", reasoning=CHUNKS[k], reasoning_offset=offset, at=k)


# (chunks stored before, the stale writer's chunk, the new owner's chunks meanwhile)
STALE_CASES = {
    "replay": ([0], 0, [1]),  # it rewrites chunk 0, the new owner wrote chunk 1 since
    "extend": ([0], 1, [1, 2]),  # it writes chunk 1, the new owner wrote chunks 1 and 2 since
    "new-row": ([], 0, [0, 1]),  # it found no row, the new owner created it since
}


@pytest.mark.parametrize("case", STALE_CASES)
async def test_a_stale_write_of_an_earlier_chunk_never_erases_a_newer_one(
    deep_store: DeepStore, late_writer: LateWriter, case: str
) -> None:
    """The zombie: a former owner of the run, paused past its session timeout, writes
    an earlier chunk of a thinking step. Its write read the row before the new owner
    wrote newer chunks and writes after them (held between the two where the backend
    has a window). The newer chunks survive, the next chunk lands after them, and the
    text is what one uninterrupted writer leaves. (Without a conditional write, the
    ``replay`` case stored ``AAAA…CCCC…``: chunk 1 erased and chunk 2 after the hole.)"""
    before, stale, meanwhile = STALE_CASES[case]
    if before:
        await deep_store.write([_chunk(k) for k in before])
    zombie = await late_writer.deep()
    pause = late_writer.pause("run_step_details")
    await pause.hold(lambda: zombie.write([_chunk(stale)]))
    await deep_store.write([_chunk(k) for k in meanwhile])
    await pause.release()
    after = meanwhile[-1] + 1
    await deep_store.write([_chunk(after)])
    for store in (deep_store, zombie):
        [row] = await store.get_deep(COMPANY, "r1")
        assert row.reasoning == "".join(CHUNKS[: after + 1])


@pytest.mark.requires("atomic_reasoning")  # a race lost only sometimes: no strict xfail can hold it
async def test_racing_writers_of_one_thinking_step_never_lose_a_chunk(
    deep_store: DeepStore, late_writer: LateWriter
) -> None:
    """Two owners of one run write the same thinking step chunk by chunk at the same
    time, the old one a little behind: whatever the interleaving, no chunk is lost
    (a chunk written from a row read just before the other writer's newer chunk
    must not land over it)."""
    owner, zombie = deep_store, await late_writer.deep()
    chunks = [f"<{i}:\U0001f9e0>" for i in range(24)]
    offsets = [sum(len(c) for c in chunks[:i]) for i in range(len(chunks))]
    rng = random.Random(3)

    async def write_all(store: DeepStore, lag: float) -> None:
        for k, (chunk, offset) in enumerate(zip(chunks, offsets, strict=True)):
            await store.write([deep(0, kind="thinking", reasoning=chunk, reasoning_offset=offset, at=k)])
            await asyncio.sleep(rng.random() * lag)

    await asyncio.gather(write_all(owner, 0.0), write_all(zombie, 0.004))
    for store in (owner, zombie):
        [row] = await store.get_deep(COMPANY, "r1")
        assert row.reasoning == "".join(chunks)
