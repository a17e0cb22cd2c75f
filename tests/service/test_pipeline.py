"""The pipeline shared by the worker and ingest-file, on the memory stores: when an
event is reported durable, restart convergence, and the in-order ack tracker."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from stepstream.core.fold import Limits
from stepstream.core.wire import (
    RunEnd,
    RunEndPayload,
    RunStart,
    RunStartPayload,
    ThinkingDelta,
    ThinkingDeltaPayload,
    ToolCall,
    ToolCallPayload,
)
from stepstream.emitter.corpus import generate_events
from stepstream.ingest.acks import AckTracker
from stepstream.pipeline import Pipeline
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore

T0 = datetime(2026, 11, 29, 12, tzinfo=timezone.utc)


def _ev(cls, payload, seq, run="r1", company="acme"):
    return cls(v=1, event_id=f"{run}-{seq}", company_id=company, run_id=run, seq=seq, ts=T0 + timedelta(seconds=seq), payload=payload)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _dump(steps: MemoryStepStore, deep: MemoryDeepStore, companies) -> dict:
    out = {}
    for company in companies:
        for run in await steps.list_runs(company, limit=10_000):
            out[(company, run.run_id)] = (
                msgspec.to_builtins(run),
                [msgspec.to_builtins(s) for s in await steps.get_steps(company, run.run_id)],
                [msgspec.to_builtins(d) for d in await deep.get_deep(company, run.run_id)],
            )
    return out


async def test_thinking_delta_is_durable_only_after_its_tail_is_written():
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    durable: list = []
    clock = Clock()
    pipe = Pipeline(steps, deep, on_durable=durable.extend, clock=clock, batch_records=10_000, limits=Limits(idle_seconds=5))
    await pipe.push(_ev(RunStart, RunStartPayload(agent_name="a"), 0), "start")
    await pipe.push(_ev(ThinkingDelta, ThinkingDeltaPayload(text="hmm "), 1), "d1")
    await pipe.push(_ev(ThinkingDelta, ThinkingDeltaPayload(text="more"), 2), "d2")
    await pipe.flush()
    # The run_start is durable; the deltas sit in an unflushed tail.
    assert durable == ["start"]
    assert pipe.held == 2
    assert await deep.get_deep("acme", "r1") == []
    # Not idle long enough: nothing moves.
    clock.now = 4.0
    await pipe.tick()
    await pipe.flush()
    assert durable == ["start"]
    # Idle: the tail is flushed and written, then both deltas are durable.
    clock.now = 10.0
    await pipe.tick()
    await pipe.flush()
    assert durable[:3] == ["start", "d1", "d2"]
    rows = await deep.get_deep("acme", "r1")
    assert [r.reasoning for r in rows] == ["hmm more"]
    states = await steps.load_states("acme", ["r1"])
    assert states["r1"].last_seq == 2


async def test_tool_call_closes_thinking_and_releases_held_events_in_one_batch():
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    durable: list = []
    pipe = Pipeline(steps, deep, on_durable=durable.extend, batch_records=10_000)
    await pipe.push(_ev(ThinkingDelta, ThinkingDeltaPayload(text="plan"), 0), "d0")
    await pipe.push(_ev(ToolCall, ToolCallPayload(call_id="c", tool="sh", arguments={"password": "hunter2"}), 1), "call")
    await pipe.flush()
    assert durable == ["d0", "call"]
    got = await steps.get_steps("acme", "r1")
    assert [s.kind for s in got] == ["thinking", "tool"]
    assert "hunter2" not in msgspec.json.encode(got).decode()
    assert "hunter2" in (await deep.get_deep("acme", "r1"))[1].arguments


async def test_forgotten_runs_replay_from_the_store_identically():
    events = generate_events(3, runs=12, companies=3)
    companies = sorted({e.company_id for e in events})
    ref_steps, ref_deep = MemoryStepStore(), MemoryDeepStore()
    ref = Pipeline(ref_steps, ref_deep, batch_records=50)
    for e in events:
        await ref.push(e)
    await ref.drain()
    want = await _dump(ref_steps, ref_deep, companies)

    # A worker that loses its memory (a crash or a revoked partition) every so often
    # and is re-fed everything from the last durable point (modelled as: from the start).
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    rng = random.Random(9)
    durable: list[int] = []
    pipe = Pipeline(steps, deep, batch_records=37, on_durable=durable.extend)
    i = 0
    while i < len(events):
        await pipe.push(events[i], i)
        i += 1
        if rng.random() < 0.01:
            await pipe.flush()
            pipe.forget(lambda key: False)
            # Resume from the first event not yet durable, as a committed offset would.
            done = set(durable)
            i = next((j for j in range(len(events)) if j not in done), len(events))
            durable = sorted(done)
            pipe = Pipeline(steps, deep, batch_records=37, on_durable=durable.extend)
    await pipe.drain()
    assert await _dump(steps, deep, companies) == want


def test_ack_tracker_acks_only_the_done_prefix_in_offset_order():
    acked: list = []
    tracker = AckTracker(acked.append)
    a = [tracker.track("p0", off, f"p0@{off}") for off in range(5)]
    b = [tracker.track("p1", off, f"p1@{off}") for off in range(3)]
    assert tracker.done([a[1], a[2], b[0]]) == 1
    assert acked == ["p1@0"]
    tracker.done([a[0]])
    assert acked == ["p1@0", "p0@0", "p0@1", "p0@2"]
    assert tracker.drop(["p1"]) == 2
    tracker.done([b[1], b[2], a[4]])
    assert acked == ["p1@0", "p0@0", "p0@1", "p0@2"]
    tracker.done([a[3], None])
    assert acked[-2:] == ["p0@3", "p0@4"]
    assert tracker.waiting == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=1, max_size=60), st.randoms(use_true_random=False))
def test_ack_tracker_never_acks_past_an_unfinished_message(script, rnd):
    acked: list = []
    tracker = AckTracker(acked.append)
    entries = []
    offsets = {0: 0, 1: 0, 2: 0}
    for part, _ in script:
        entries.append(tracker.track(part, offsets[part], (part, offsets[part])))
        offsets[part] += 1
    finished = [e for e, (_, done) in zip(entries, script) if done]
    rnd.shuffle(finished)
    tracker.done(finished)
    for part in offsets:
        mine = [e for e in entries if e.tp == part]
        prefix = 0
        while prefix < len(mine) and mine[prefix].done:
            prefix += 1
        assert [a for a in acked if a[0] == part] == [(part, k) for k in range(prefix)]


async def test_duplicates_are_durable_at_once_and_change_nothing():
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    durable: list = []
    pipe = Pipeline(steps, deep, on_durable=durable.extend)
    end = _ev(RunEnd, RunEndPayload(status="completed"), 1)
    await pipe.push(_ev(RunStart, RunStartPayload(agent_name="a"), 0), "s")
    await pipe.push(end, "e")
    await pipe.flush()
    before = await _dump(steps, deep, ["acme"])
    await pipe.push(end, "dup")
    await pipe.flush()
    assert durable == ["s", "e", "dup"]
    assert await _dump(steps, deep, ["acme"]) == before
