"""The run environment through the pipeline (issue 19, item 8): written once, with its
run_start, so a small event of a run with a large environment writes a small state;
capped on the run record; kept across evictions, replays and states stored by the
previous version. On the memory and SQLite step stores, measured at the port."""

from __future__ import annotations

import contextlib
import sqlite3
from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest

from stepstream.core.caps import CLIP_MARKER
from stepstream.core.fold import Limits
from stepstream.core.records import RunRecord, RunState
from stepstream.core.wire import RunStart, RunStartPayload, StateChange, StateChangePayload
from stepstream.pipeline import Pipeline
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore
from stepstream.sinks.sqlite import SqliteStepStore

T0 = datetime(2026, 11, 29, 12, tzinfo=timezone.utc)
BIG = {f"var_{i:04d}": "x" * 250 for i in range(3400)}  # ~900 KB of compact JSON
SMALL_WRITE = 4096  # bytes: a run record and a state without the environment


def _start(seq: int = 0, run: str = "r1", environment: Any = BIG) -> RunStart:
    return RunStart(v=1, event_id=f"{run}-{seq}", company_id="acme", run_id=run, seq=seq, ts=T0 + timedelta(seconds=seq),
                    payload=RunStartPayload(agent_name="bot", environment=environment))  # fmt: skip


def _change(seq: int, run: str = "r1") -> StateChange:
    # A one-byte value: the smallest event that writes a step.
    return StateChange(v=1, event_id=f"{run}-{seq}", company_id="acme", run_id=run, seq=seq, ts=T0 + timedelta(seconds=seq),
                       payload=StateChangePayload(key="k", value="x"))  # fmt: skip


class Recording:
    """A step store that records the run records and states of every write."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.writes: list[tuple[list[RunRecord], list[RunState]]] = []

    async def write(self, steps, runs=(), states=()):
        self.writes.append((list(runs), list(states)))
        return await self.store.write(steps, runs, states)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def bytes_of(self, write: int) -> int:
        runs, states = self.writes[write]
        return len(msgspec.json.encode(runs)) + len(msgspec.json.encode(states))


@pytest.fixture(params=["memory", "sqlite"])
async def store(request, tmp_path):
    if request.param == "memory":
        yield MemoryStepStore()
        return
    sqlite = await SqliteStepStore(str(tmp_path / "steps.db")).open()
    try:
        yield sqlite
    finally:
        await sqlite.close()


async def test_a_small_event_of_a_run_with_a_large_environment_writes_far_less_than_it(store, tmp_path) -> None:
    recording = Recording(store)
    pipe = Pipeline(recording, MemoryDeepStore())
    await pipe.push(_start())
    await pipe.flush()
    await pipe.push(_change(1))
    await pipe.flush()
    assert len(recording.writes) == 2
    # The run_start's batch writes the environment once, capped: not twice, not whole.
    (first,), _ = recording.writes[0]
    cap = Limits().environment_bytes
    assert isinstance(first.environment, str) and first.environment.endswith(CLIP_MARKER)
    assert len(msgspec.json.encode(first.environment)) <= cap and recording.bytes_of(0) < cap + SMALL_WRITE
    # The next batch (a one-byte value) writes a small run record and state (was ~1.8 MB).
    assert recording.bytes_of(1) < SMALL_WRITE
    run = await store.get_run("acme", "r1")
    assert run is not None and run.environment == first.environment and run.step_count == 1
    if isinstance(store, SqliteStepStore):  # the rows as stored
        with contextlib.closing(sqlite3.connect(tmp_path / "steps.db")) as db:
            ((state_bytes,),) = db.execute("SELECT length(CAST(state AS BLOB)) FROM run_state").fetchall()
            ((environment_bytes,),) = db.execute("SELECT length(CAST(environment AS BLOB)) FROM runs").fetchall()
        assert state_bytes < SMALL_WRITE and environment_bytes <= cap


async def test_a_replay_does_not_rewrite_the_environment(store) -> None:
    pipe = Pipeline(store, MemoryDeepStore())
    for event in (_start(environment={"os": "linux"}), _change(1)):
        await pipe.push(event)
    await pipe.flush()
    # A restart replays the same events: the run_start is a duplicate and writes nothing.
    recording = Recording(store)
    replay = Pipeline(recording, MemoryDeepStore())
    for event in (_start(environment={"os": "linux"}), _change(1), _change(2)):
        await replay.push(event)
    await replay.flush()
    assert all(r.environment is None for runs, _ in recording.writes for r in runs)
    run = await store.get_run("acme", "r1")
    assert run is not None and run.environment == {"os": "linux"} and run.step_count == 2


async def test_the_environment_survives_its_fold_leaving_memory_before_the_write(store) -> None:
    """Evicted (capacity) while its batch is open, the run reopens from that batch's
    state, which has no environment: the batch still writes the run_start's."""
    pipe = Pipeline(store, MemoryDeepStore(), max_open_runs=1)
    for event in (_start(environment={"os": "linux"}), _change(0, run="r2"), _change(1)):
        await pipe.push(event)
    await pipe.flush()
    run = await store.get_run("acme", "r1")
    assert run is not None and run.environment == {"os": "linux"} and run.step_count == 1


async def test_a_state_written_by_the_previous_version_with_the_environment_loads(store) -> None:
    record = RunRecord(company_id="acme", run_id="r1", agent_name="bot", environment={"os": "linux"})
    await store.write([], [record], [RunState(company_id="acme", run_id="r1", last_seq=0, run=record)])
    recording = Recording(store)
    pipe = Pipeline(recording, MemoryDeepStore())
    await pipe.push(_change(1))
    await pipe.flush()
    (runs, (state,)) = recording.writes[0]
    assert state.run is not None and state.run.environment is None and runs[0].environment is None
    run = await store.get_run("acme", "r1")
    assert run is not None and (run.agent_name, run.environment, run.step_count) == ("bot", {"os": "linux"}, 1)
