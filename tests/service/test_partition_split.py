"""A run whose events are on two partitions with two owners (a partition count
changed under a live run, or a producer with another partitioner): two pipelines
sharing one store. The owner whose batch the store refuses as stale reloads the run
from the store and applies its refused events as late ones; nothing is lost, and
its offsets are not committable before the redone rows are written."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import msgspec

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
    ToolResult,
    ToolResultPayload,
)
from stepstream.pipeline import Ledger, Pipeline
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore

T0 = datetime(2026, 11, 29, 12, tzinfo=timezone.utc)
LIMITS = Limits(idle_seconds=1000)


def _ev(cls, payload, seq, run="r1", company="acme"):
    return cls(v=1, event_id=f"{run}-{seq}", company_id=company, run_id=run, seq=seq, ts=T0 + timedelta(seconds=seq), payload=payload)


def _call(seq: int, call_id: str):
    return _ev(ToolCall, ToolCallPayload(call_id=call_id, tool="t", arguments={"q": call_id}), seq)


def _result(seq: int, call_id: str):
    return _ev(ToolResult, ToolResultPayload(call_id=call_id, output=f"out-{call_id}"), seq)


def _delta(seq: int, text: str):
    return _ev(ThinkingDelta, ThinkingDeltaPayload(text=text), seq)


class Owner:
    """One worker's pipeline and ledger, consuming one partition (offsets 0, 1, ...)."""

    def __init__(self, steps, deep, tp: str) -> None:
        self.pipe = Pipeline(steps, deep, ledger=Ledger(), limits=LIMITS, batch_records=10_000, max_hold_seconds=1000)
        self.tp = tp
        self.offset = 0

    async def push(self, event) -> None:
        self.pipe.ledger.delivered(self.tp, self.offset, self.offset)
        await self.pipe.push(event, self.tp, self.offset)
        self.offset += 1

    @property
    def watermark(self) -> int | None:
        return self.pipe.ledger.watermark(self.tp)


async def _dump(steps, deep) -> tuple:
    state = (await steps.load_states("acme", ["r1"]))["r1"]
    return (
        msgspec.to_builtins(state),
        [msgspec.to_builtins(s) for s in await steps.get_steps("acme", "r1")],
        [msgspec.to_builtins(d) for d in await deep.get_deep("acme", "r1")],
    )


async def _ingest_file(events) -> tuple:
    """The rows ``ingest-file`` makes of ``events`` in this order (one pipeline, no ledger)."""
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    pipe = Pipeline(steps, deep, limits=LIMITS, batch_records=10_000)
    for event in events:
        await pipe.push(event)
    await pipe.drain()
    return await _dump(steps, deep)


async def test_the_owner_refused_as_stale_applies_its_events_late_instead_of_losing_them():
    """A owns the run's old partition, B its new one. A's batch of seq 3 and 4 lands
    after B wrote seq 5 (a gap over 3 and 4): the store refuses A's batch. A reloads
    the run, applies 3 and 4 as late events, and its next event (seq 6, still on the
    old partition) continues from the store's state, not from the refused one."""
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    a, b = Owner(steps, deep, "p0"), Owner(steps, deep, "p1")
    for event in (_ev(RunStart, RunStartPayload(agent_name="x"), 0), _call(1, "c"), _call(2, "d")):
        await a.push(event)
    await a.pipe.flush()
    await a.push(_result(3, "c"))
    await a.push(_result(4, "d"))  # A's open batch: seq 3, 4
    await b.push(_call(5, "e"))  # B loads the run at seq 2: 5 skips 3 and 4
    await b.pipe.flush()
    await a.pipe.flush()  # refused as stale: the store holds seq 5
    assert a.watermark == 5  # every offset of A durable, 3 and 4 included
    await a.push(_ev(RunEnd, RunEndPayload(status="completed"), 6))
    await a.pipe.drain()
    await b.pipe.drain()

    got = await _dump(steps, deep)
    assert got == await _ingest_file([_ev(RunStart, RunStartPayload(agent_name="x"), 0), _call(1, "c"), _call(2, "d"),
                                      _call(5, "e"), _result(3, "c"), _result(4, "d"),
                                      _ev(RunEnd, RunEndPayload(status="completed"), 6)])
    state = got[0]
    assert state["run"]["late_events"] == 2 and state["run"]["status"] == "completed"
    assert [(s["step_seq"], s["status"]) for s in got[1]] == [(0, "ok"), (1, "ok"), (2, "running")]


async def test_a_refused_owner_redoes_its_unflushed_thinking_tail_too():
    """A's refused batch carries the run's clean state while a thinking tail is still
    buffered (its deltas held). The redo applies the tail's deltas against the stored
    state as late ones: each a closed thinking step of its own, as ``ingest-file`` of
    the same order makes them; nothing of the tail is flushed onto the store's ordinals."""
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    a, b = Owner(steps, deep, "p0"), Owner(steps, deep, "p1")
    start = [_ev(RunStart, RunStartPayload(agent_name="x"), 0), _call(1, "c")]
    for event in start:
        await a.push(event)
    await a.pipe.flush()
    moved = [_result(2, "c"), _delta(3, "abc"), _delta(4, "def")]
    for event in moved:
        await a.push(event)
    await b.push(_call(5, "e"))
    await b.pipe.flush()
    await a.pipe.flush()  # the result is refused; the deltas sit in A's tail
    await a.pipe.drain()
    await b.pipe.drain()
    assert a.watermark == 5
    assert await _dump(steps, deep) == await _ingest_file([*start, _call(5, "e"), *moved])


async def test_the_redo_is_redone_when_the_other_owner_wins_again():
    """The redone batch is itself refused when the other owner wrote as far meanwhile
    (between the redo's store read and its write): the run is reloaded once more, and
    the events still land."""
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    a, b = Owner(steps, deep, "p0"), Owner(steps, deep, "p1")
    start = [_ev(RunStart, RunStartPayload(agent_name="x"), 0), _call(1, "c"), _call(2, "d")]
    for event in start:
        await a.push(event)
    await a.pipe.flush()
    await a.push(_result(3, "c"))
    await a.push(_result(4, "d"))
    await b.push(_call(5, "e"))
    await b.pipe.flush()
    read = steps.load_states
    reads = []

    async def load_states(company, runs):
        states = await read(company, runs)
        reads.append(states[runs[0]].last_seq)
        if len(reads) == 1:  # A's redo read seq 5; B writes 6 and 7 before A's redo lands
            await b.push(_result(6, "e"))
            await b.push(_call(7, "f"))
            await b.pipe.flush()
        return states

    steps.load_states = load_states  # type: ignore[method-assign]
    await a.pipe.flush()
    assert reads == [5, 7]  # refused twice: read again after the second refusal
    await a.pipe.drain()
    await b.pipe.drain()
    assert a.watermark == 5
    assert await _dump(steps, deep) == await _ingest_file(
        [*start, _call(5, "e"), _result(6, "e"), _call(7, "f"), _result(3, "c"), _result(4, "d")]
    )


async def test_the_worker_counts_records_keyed_for_another_partition():
    """The worker's delivery path checks every record's key against Kafka's default
    partitioner under the topic's current partition count, per topic."""
    from aiokafka.structs import ConsumerRecord
    from faust.types import TP
    from prometheus_client import generate_latest

    from stepstream.config import load_settings
    from stepstream.core.wire import encode_event, partition_key
    from stepstream.ingest.app import IngestWorker
    from stepstream.ingest.routing import default_partition
    from stepstream.metrics import Metrics

    settings = load_settings({"steps_sink": "memory://", "deep_sink": "memory://"}, environ={})
    metrics = Metrics()
    worker = IngestWorker(settings, metrics, dlq_topic=None, partitions_of={settings.topic: 4}.get)
    await worker.start()
    try:
        key = partition_key("acme", "r1")
        home = default_partition(key, 4)

        def records(partition: int, events) -> dict:
            tp = TP(settings.topic, partition)
            return {tp: [ConsumerRecord(settings.topic, partition, i, 0, 0, key, encode_event(e), None, len(key), 0, [])
                         for i, e in enumerate(events)]}  # fmt: skip

        assert not await worker.on_records(records(home, [_ev(RunStart, RunStartPayload(agent_name="x"), 0)]), lambda tp: True)
        assert "stepstream_misrouted_records_total{" not in generate_latest(metrics.registry).decode()
        elsewhere = (home + 1) % 4
        assert not await worker.on_records(records(elsewhere, [_call(1, "c"), _call(2, "d")]), lambda tp: True)
        text = generate_latest(metrics.registry).decode()
        assert f'stepstream_misrouted_records_total{{topic="{settings.topic}"}} 2.0' in text
        await worker.pipeline.drain()
        assert [s.step_seq for s in await worker._stores[0].get_steps("acme", "r1")] == [0, 1]  # counted, not refused
    finally:
        for store in worker._stores:
            await store.close()
