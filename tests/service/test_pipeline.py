"""The pipeline shared by the worker and ingest-file, on the memory stores: when an
event's offset becomes committable (the ledger's watermark), restart convergence,
bounds (held-message age, open runs) and the store fault policy."""

from __future__ import annotations

import asyncio
import random
from datetime import datetime, timedelta, timezone

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
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
from stepstream.errors import SinkError, SinkUnavailable
from stepstream.pipeline.ledger import Ledger
from stepstream.pipeline import Pipeline, StoreFailed
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



class Feed:
    """Events pushed as records of one partition, offsets 0, 1, 2, ..."""

    def __init__(self, pipe: Pipeline, tp: str = "p0") -> None:
        self.pipe = pipe
        self.tp = tp
        self.offset = 0

    async def push(self, event) -> int:
        offset = self.offset
        self.offset += 1
        self.pipe.ledger.delivered(self.tp, offset, offset)
        await self.pipe.push(event, self.tp, offset)
        return offset

    @property
    def watermark(self) -> int | None:
        return self.pipe.ledger.watermark(self.tp)


def _pipe(steps, deep, **kw) -> Pipeline:
    kw.setdefault("batch_records", 10_000)
    return Pipeline(steps, deep, ledger=Ledger(), **kw)


async def test_thinking_delta_is_durable_only_after_its_tail_is_written():
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    clock = Clock()
    pipe = _pipe(steps, deep, clock=clock, limits=Limits(idle_seconds=5), max_hold_seconds=100)
    feed = Feed(pipe)
    await feed.push(_ev(RunStart, RunStartPayload(agent_name="a"), 0))
    await feed.push(_ev(ThinkingDelta, ThinkingDeltaPayload(text="hmm "), 1))
    await feed.push(_ev(ThinkingDelta, ThinkingDeltaPayload(text="more"), 2))
    assert feed.watermark == 0  # nothing written yet
    await pipe.flush()
    # The run_start is durable; the deltas sit in an unflushed tail.
    assert feed.watermark == 1
    assert pipe.held == 2
    assert await deep.get_deep("acme", "r1") == []
    # Not idle long enough: nothing moves.
    clock.now = 4.0
    await pipe.tick()
    await pipe.flush()
    assert feed.watermark == 1
    # Idle: the tail is flushed and written, then both deltas are durable.
    clock.now = 10.0
    await pipe.tick()
    await pipe.flush()
    assert feed.watermark == 3
    rows = await deep.get_deep("acme", "r1")
    assert [r.reasoning for r in rows] == ["hmm more"]
    states = await steps.load_states("acme", ["r1"])
    assert states["r1"].last_seq == 2


async def test_a_held_message_is_flushed_once_it_is_older_than_the_bound():
    """A trickle (a delta every second, never idle for 5 s) no longer holds commits
    forever: the tail holding the oldest message is flushed at max_hold_seconds."""
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    clock = Clock()
    pipe = _pipe(steps, deep, clock=clock, limits=Limits(idle_seconds=5), max_hold_seconds=3)
    feed = Feed(pipe)
    await feed.push(_ev(RunStart, RunStartPayload(agent_name="a"), 0))
    lags = []
    for seq in range(1, 30):
        clock.now = float(seq)
        await feed.push(_ev(ThinkingDelta, ThinkingDeltaPayload(text=""), seq))
        await pipe.tick()
        await pipe.flush()
        lags.append(feed.offset - feed.watermark)
    # Never more than max_hold_seconds worth of messages (one a second) behind.
    assert max(lags) <= 4, lags
    assert (await steps.load_states("acme", ["r1"]))["r1"].last_seq >= 25


async def test_tool_call_closes_thinking_and_releases_held_events_in_one_batch():
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    pipe = _pipe(steps, deep)
    feed = Feed(pipe)
    await feed.push(_ev(ThinkingDelta, ThinkingDeltaPayload(text="plan"), 0))
    await feed.push(_ev(ToolCall, ToolCallPayload(call_id="c", tool="sh", arguments={"password": "hunter2"}), 1))
    assert feed.watermark == 0
    await pipe.flush()
    assert feed.watermark == 2
    got = await steps.get_steps("acme", "r1")
    assert [s.kind for s in got] == ["thinking", "tool"]
    assert "hunter2" not in msgspec.json.encode(got).decode()
    assert "hunter2" in msgspec.json.encode((await deep.get_deep("acme", "r1"))[1].arguments).decode()


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
    # and is re-fed everything from its committed offset (the ledger's watermark).
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    rng = random.Random(9)
    pipe = _pipe(steps, deep, batch_records=37)
    feed = Feed(pipe)
    restarts = 0
    while feed.offset < len(events):
        await feed.push(events[feed.offset])
        if rng.random() < 0.01:
            await pipe.flush()
            committed = feed.watermark
            pipe = _pipe(steps, deep, batch_records=37)
            feed = Feed(pipe)
            feed.offset = committed
            restarts += 1
    await pipe.drain()
    assert restarts > 3
    assert await _dump(steps, deep, companies) == want


async def test_many_open_runs_are_evicted_and_reload_identically():
    """With a cap far below the number of runs in flight, folds are flushed and dropped
    (least recently used first) and reload from the unwritten batch or the store."""
    events = generate_events(5, runs=30, companies=2)
    companies = sorted({e.company_id for e in events})
    ref_steps, ref_deep = MemoryStepStore(), MemoryDeepStore()
    ref = Pipeline(ref_steps, ref_deep, batch_records=500)
    for e in events:
        await ref.push(e)
    await ref.drain()
    rng = random.Random(4)
    shuffled = _interleave(events, rng)
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    pipe = Pipeline(steps, deep, batch_records=53, max_open_runs=3)
    for e in shuffled:
        await pipe.push(e)
        assert pipe.open_runs <= 3
    await pipe.drain()
    assert await _dump(steps, deep, companies) == await _dump(ref_steps, ref_deep, companies)


def _interleave(events, rng):
    """Runs interleaved at random, each run's events still in order."""
    by_run: dict = {}
    for e in events:
        by_run.setdefault((e.company_id, e.run_id), []).append(e)
    queues = [list(v) for v in by_run.values()]
    out = []
    while queues:
        q = rng.choice(queues)
        out.append(q.pop(0))
        if not q:
            queues.remove(q)
    return out


async def test_duplicates_are_durable_at_once_and_change_nothing():
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    pipe = _pipe(steps, deep)
    feed = Feed(pipe)
    end = _ev(RunEnd, RunEndPayload(status="completed"), 1)
    await feed.push(_ev(RunStart, RunStartPayload(agent_name="a"), 0))
    await feed.push(end)
    await pipe.flush()
    before = await _dump(steps, deep, ["acme"])
    await feed.push(end)
    await pipe.flush()
    assert feed.watermark == 3
    assert await _dump(steps, deep, ["acme"]) == before


class FlakyStepStore(MemoryStepStore):
    """A memory step store whose next ``fail`` writes raise ``error``."""

    def __init__(self, fail: int, error: Exception) -> None:
        super().__init__()
        self.fail = fail
        self.error = error
        self.calls = 0

    async def write(self, steps, runs=(), states=()):
        self.calls += 1
        if self.fail > 0:
            self.fail -= 1
            raise self.error
        return await super().write(steps, runs, states)


async def _sleep(_: float) -> None:
    return None


async def test_a_retriable_store_error_retries_the_same_batch_until_it_lands():
    steps, deep = FlakyStepStore(3, SinkUnavailable("locked")), MemoryDeepStore()
    pipe = _pipe(steps, deep, sleep=_sleep)
    feed = Feed(pipe)
    await feed.push(_ev(RunStart, RunStartPayload(agent_name="a"), 0))
    await feed.push(_ev(ToolCall, ToolCallPayload(call_id="c", tool="sh", arguments={}), 1))
    await pipe.flush()
    assert steps.calls == 4
    assert feed.watermark == 2
    assert pipe.writer.available
    assert [s.kind for s in await steps.get_steps("acme", "r1")] == ["tool"]


async def test_a_non_retriable_store_error_or_an_exhausted_budget_is_fatal_and_commits_nothing():
    for error, fail in ((SinkError("disk image is malformed"), 1), (SinkUnavailable("locked"), 10_000)):
        clock = Clock()

        async def sleep(seconds: float) -> None:
            clock.now += seconds

        steps, deep = FlakyStepStore(fail, error), MemoryDeepStore()
        pipe = _pipe(steps, deep, sleep=sleep, clock=clock, retry_seconds=30)
        feed = Feed(pipe)
        await feed.push(_ev(RunStart, RunStartPayload(agent_name="a"), 0))
        with pytest.raises(StoreFailed):
            await pipe.flush()
        assert feed.watermark == 0, "nothing may be committed past a batch that did not land"
        assert not pipe.writer.available or fail == 1
        assert clock.now <= 30


async def test_an_exception_that_is_not_a_sink_error_is_fatal():
    steps, deep = FlakyStepStore(1, OverflowError("int too big")), MemoryDeepStore()
    pipe = _pipe(steps, deep, sleep=_sleep)
    feed = Feed(pipe)
    await feed.push(_ev(RunStart, RunStartPayload(agent_name="a"), 0))
    with pytest.raises(StoreFailed, match="OverflowError"):
        await pipe.flush()
    assert feed.watermark == 0


async def _eager_reference(events) -> tuple[MemoryStepStore, MemoryDeepStore]:
    """The rows of the plain fold: one eager ``RunFold`` per run (a copy of its state
    per event), every output in one batch, tails flushed at the end."""
    from stepstream.core.fold import RunFold
    from stepstream.pipeline.batch import RowBatch

    folds: dict = {}
    batch = RowBatch()
    for e in events:
        fold = folds.setdefault((e.company_id, e.run_id), RunFold(e.company_id, e.run_id))
        assert not fold.lazy
        out = fold.push(e, 0.0)
        if out is not None:
            batch.add(out)
    for fold in folds.values():
        out = fold.flush("close")
        if out is not None:
            batch.add(out)
    batch.seal()  # as the pipeline does before a write (the run_starts' environments go in)
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    await deep.write(batch.deeps)
    await steps.write(list(batch.steps.values()), list(batch.runs.values()), list(batch.states.values()))
    return steps, deep


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
@given(
    seed=st.integers(0, 2**16),
    batch_records=st.integers(3, 200),
    max_open_runs=st.integers(1, 12),
    crash_rate=st.sampled_from([0.0, 0.005, 0.03]),
)
async def test_lazy_snapshots_write_the_eager_folds_rows_across_batches_evictions_and_crashes(
    seed, batch_records, max_open_runs, crash_rate
):
    """The pipeline's folds keep no state copy per event: a batch takes each run's
    durable state when it is sealed. Whatever the batch size, eviction pressure and
    crash points (a crash loses memory and replays from the committed watermark), the
    rows equal the eager fold's."""
    rng = random.Random(seed)
    events = _interleave(generate_events(seed, runs=6, companies=2, turns=2), rng)
    companies = sorted({e.company_id for e in events})
    ref_steps, ref_deep = await _eager_reference(events)
    want = await _dump(ref_steps, ref_deep, companies)

    steps, deep = MemoryStepStore(), MemoryDeepStore()

    def fresh() -> Pipeline:
        return _pipe(steps, deep, batch_records=batch_records, max_open_runs=max_open_runs)

    pipe = fresh()
    feed = Feed(pipe)
    crashes_left = 4  # a bound: each crash replays from the watermark, so unbounded ones may never end
    while feed.offset < len(events):
        await feed.push(events[feed.offset])
        if rng.random() < 0.2:
            # A write lands now and then while folding goes on (the worker's event loop
            # turns at every fetch); without it a batch written only when the store is
            # free would grow (group commit) past every crash point and never commit.
            await pipe.wait_written()
        if crashes_left and rng.random() < crash_rate:
            crashes_left -= 1
            await pipe.wait_written()  # what was written is durable; the open batch is lost
            committed = feed.watermark
            pipe = fresh()
            feed = Feed(pipe)
            feed.offset = 0 if committed is None else committed
    await pipe.drain()
    assert await _dump(steps, deep, companies) == want


async def test_a_run_that_left_memory_during_a_fetch_is_reloaded_not_refused():
    """A fetch is loaded once, then applied: a run that ends early in the fetch leaves
    memory after its batch is written, and two flushes later nothing holds its state.
    A later event of that run in the same fetch is loaded again (``NotLoaded``), not
    refused as unfoldable."""
    from stepstream.pipeline import NotLoaded

    steps, deep = MemoryStepStore(), MemoryDeepStore()
    pipe = _pipe(steps, deep, batch_records=4)
    fetch = [
        _ev(RunStart, RunStartPayload(agent_name="a"), 1, run="x"),
        _ev(RunEnd, RunEndPayload(status="succeeded"), 2, run="x"),
        *[_ev(RunStart, RunStartPayload(agent_name="a"), 1, run=f"o{i}") for i in range(12)],
        _ev(ToolCall, ToolCallPayload(call_id="c", tool="t", arguments={}), 3, run="x"),  # after its end
    ]
    await pipe.load((e.company_id, e.run_id) for e in fetch)
    refused = 0
    for e in fetch:
        try:
            full = pipe.apply(e)
        except NotLoaded:
            refused += 1
            await pipe.load([(e.company_id, e.run_id)])
            full = pipe.apply(e)
        if full:
            await pipe.flush(wait=False)
    await pipe.drain()
    assert refused == 1  # the run had left memory and every batch: it was read again
    assert [s.step_seq for s in await steps.get_steps("acme", "x")] == [0]
    assert (await steps.load_states("acme", ["x"]))["x"].last_seq == 3


async def test_a_late_event_in_a_later_batch_lands():
    """A late event takes no new agent seq, yet its batch must pass the stores'
    "never backwards" check: the stored last_seq counts late events too."""
    from stepstream.core.wire import ToolResult, ToolResultPayload

    steps, deep = MemoryStepStore(), MemoryDeepStore()
    pipe = _pipe(steps, deep)
    feed = Feed(pipe)
    call = ToolCallPayload(call_id="c", tool="t", arguments={})
    for e in [
        _ev(RunStart, RunStartPayload(agent_name="a"), 0),
        _ev(ToolCall, call, 1),
        _ev(ToolCall, ToolCallPayload(call_id="d", tool="t", arguments={}), 3),  # seq 2 skipped
    ]:
        await feed.push(e)
    await pipe.flush()
    await feed.push(_ev(ToolResult, ToolResultPayload(call_id="c", output="ok"), 2))  # late, its own batch
    await pipe.flush()
    got = {s.step_seq: s.status for s in await steps.get_steps("acme", "r1")}
    assert got == {0: "ok", 1: "running"}
    state = (await steps.load_states("acme", ["r1"]))["r1"]
    assert state.skipped_seqs == () and state.run.late_events == 1
    # A restart from the stored state takes the late event as applied: a replay skips it.
    pipe2 = _pipe(steps, deep)
    await pipe2.push(_ev(ToolResult, ToolResultPayload(call_id="c", output="ok"), 2))
    assert pipe2.duplicates == 1


class GatedStepStore(MemoryStepStore):
    """Each write waits until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.sizes: list[int] = []

    async def write(self, steps, runs=(), states=()):
        await self.gate.wait()
        self.sizes.append(len(steps))
        return await super().write(steps, runs, states)


async def test_group_commit_a_batch_grows_while_the_previous_write_is_in_flight():
    """Full at ``batch_records`` when the store is free; while a write is in flight the
    next batch keeps folding, up to GROWTH times that, and is written once the store
    is free; the timer does not start a write that would only wait either."""
    from stepstream.pipeline import GROWTH

    steps, deep = GatedStepStore(), MemoryDeepStore()
    clock = Clock()
    pipe = _pipe(steps, deep, batch_records=10, batch_seconds=0.05, clock=clock)
    feed = Feed(pipe)
    seq = iter(range(10_000))

    def call() -> ToolCall:
        n = next(seq)
        return _ev(ToolCall, ToolCallPayload(call_id=f"c{n}", tool="t", arguments={}), n)

    await pipe.load([("acme", "r1")])
    full = False
    while not full:
        full = pipe.apply(call(), feed.tp, feed.offset)
        feed.offset += 1
    first = len(pipe._batch)
    assert 10 <= first < 10 + 4  # full at batch_records (one event adds a few)
    await pipe.flush(wait=False)  # the write waits at the gate
    assert pipe.writing
    grown = 0
    while True:
        grown += 1
        if pipe.apply(call(), feed.tp, feed.offset):
            break
        clock.now += 1.0
        assert not pipe.due()  # old enough, but the store is busy
        assert grown < 100
    assert 10 * GROWTH <= len(pipe._batch) < 10 * GROWTH + 4
    steps.gate.set()
    await pipe.flush()
    assert not pipe.writing and len(steps.sizes) == 2 and steps.sizes[1] > steps.sizes[0] * 2
    # A free store again: full at batch_records.
    full, n = False, 0
    while not full:
        full = pipe.apply(call(), feed.tp, feed.offset)
        n += 1
    assert len(pipe._batch) < 10 + 4


async def test_states_loaded_for_a_partition_not_delivered_are_read_again():
    """A fetch's states are loaded for all its partitions at once; when a partition is
    then not delivered (a rebalance began), ``unstage`` drops what was loaded for it:
    by the time it comes back another owner may have moved the run on."""
    from stepstream.pipeline import NotLoaded

    steps, deep = MemoryStepStore(), MemoryDeepStore()
    start = _ev(RunStart, RunStartPayload(agent_name="a"), 0)
    call = _ev(ToolCall, ToolCallPayload(call_id="c", tool="t", arguments={}), 1)
    mine = _pipe(steps, deep)
    await mine.load([("acme", "r1")])  # nothing stored yet
    mine.unstage()  # the partition was not delivered
    other = _pipe(steps, deep)  # the other owner applies the run's first events
    await other.push(start)
    await other.push(call)
    await other.flush()
    with pytest.raises(NotLoaded):
        mine.apply(_ev(ToolCall, ToolCallPayload(call_id="d", tool="t", arguments={}), 2))
    await mine.load([("acme", "r1")])
    mine.apply(_ev(ToolCall, ToolCallPayload(call_id="d", tool="t", arguments={}), 2))
    await mine.flush()
    assert [s.step_seq for s in await steps.get_steps("acme", "r1")] == [0, 1]


class BodyCountingDeepStore(MemoryDeepStore):
    """Records how many body characters each deep write carried."""

    def __init__(self) -> None:
        super().__init__()
        self.body_chars: list[int] = []

    async def write(self, deeps):
        chars = 0
        for d in deeps:
            chars += len(d.reasoning or "")
            for body in (d.arguments, d.output):
                if body is not None:
                    chars += len(body) if type(body) is str else len(msgspec.json.encode(body))
        self.body_chars.append(chars)
        return await super().write(deeps)


def _cap_sized_run(limits: Limits, cycles: int) -> list:
    """A run whose bodies are all at their caps: per cycle, a thinking run past the
    reasoning cap (9 deltas of 8,192 characters), a tool call whose arguments' JSON
    text is at the arguments cap, and its result with an output at the output cap."""
    from stepstream.core.wire import ToolResult, ToolResultPayload

    events = [_ev(RunStart, RunStartPayload(agent_name="a"), 0)]
    for c in range(cycles):
        for d in range(9):
            events.append(_ev(ThinkingDelta, ThinkingDeltaPayload(text=f"{c}.{d} ".ljust(8192, "t")), len(events)))
        arguments = {"query": "q" * (limits.arguments_chars - len('{"query":""}'))}
        events.append(_ev(ToolCall, ToolCallPayload(call_id=f"c{c}", tool="search", arguments=arguments), len(events)))
        events.append(_ev(ToolResult, ToolResultPayload(call_id=f"c{c}", output="o" * limits.output_chars), len(events)))
    events.append(_ev(RunEnd, RunEndPayload(status="completed"), len(events)))
    return events


async def test_a_batch_of_cap_sized_bodies_seals_by_bytes_even_while_a_write_is_in_flight():
    """Rows are not the measure of a batch's memory: at their caps 40 cycles of bodies
    are 442 events and fewer than 1,000 records and rows, far under ``batch_records``,
    yet 6.9 MB of messages. Every batch is full once
    the messages it settles reach ``batch_bytes`` (at most the one message that crossed
    it more), and group commit, which grows a batch while a write is in flight, grows
    it in rows only: the bound holds while the store is busy too. The records equal
    those of a pipeline with no byte bound."""
    from stepstream.core.wire import encode_event

    limits, bound = Limits(), 1_000_000
    events = _cap_sized_run(limits, cycles=40)
    steps, deep = GatedStepStore(), BodyCountingDeepStore()
    pipe = _pipe(steps, deep, batch_records=10_000, batch_bytes=bound)
    await pipe.load([("acme", "r1")])
    sealed: list[tuple[int, bool]] = []  # (message bytes, whether a write was in flight)
    for offset, event in enumerate(events):
        size = len(encode_event(event))
        if pipe.apply(event, None, offset, size):
            batch = pipe._batch
            assert bound <= batch.message_bytes < bound + size, "full only at the byte bound"
            assert len(batch) < 10_000
            sealed.append((batch.message_bytes, pipe.writing))
            steps.gate.set()  # the write in flight (if any) lands; this batch's write starts
            await pipe.flush(wait=False)
            steps.gate.clear()  # ... and waits at the gate while the next batch folds
    steps.gate.set()
    await pipe.drain()
    assert len(sealed) >= 5 and all(writing for _, writing in sealed[1:]), sealed
    assert all(chars <= bound for chars in deep.body_chars), deep.body_chars

    ref_steps, ref_deep = MemoryStepStore(), MemoryDeepStore()
    ref = _pipe(ref_steps, ref_deep, batch_records=10_000)
    for event in events:
        await ref.push(event, size=len(encode_event(event)))
    await ref.drain()
    assert ref.written_batches == 1  # under the default bound: one batch, as before
    assert await _dump(steps, deep, ["acme"]) == await _dump(ref_steps, ref_deep, ["acme"])
