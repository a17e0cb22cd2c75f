"""A run split over two partitions with two owners, on the real broker (issue 19,
item 5): what ``kafka-topics --alter`` does to a live run. Its first events are on
partition 0 (where one partition put them), the rest where the default partitioner
puts its key under two partitions (partition 1). The owner of partition 0 is slow to
write its second batch (a store write that hangs), so the owner of partition 1
writes the run further first and the store refuses the slow owner's batch as stale.
The slow owner reloads the run and applies its events late: the sinks equal what
``ingest-file`` makes of the events in the order they were applied, and the records
of partition 0 are counted as misrouted."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest
from aiokafka import AIOKafkaProducer

from harness import Scenario, dump, first_difference, golden_dump, run_states, wait_caught_up, wait_for
from stepstream.core.wire import (
    RunEnd,
    RunEndPayload,
    RunStart,
    RunStartPayload,
    ToolCall,
    ToolCallPayload,
    ToolResult,
    ToolResultPayload,
    encode_event,
    partition_key,
)
from stepstream.ingest.routing import default_partition
from stepstream.sinks.faults import read_log, write_plan

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 29, 12, tzinfo=timezone.utc)
HANG_SECONDS = 20.0  # long enough for the other owner to fetch and write on a loaded machine


def _ev(cls, payload, seq, run, company="acme"):
    return cls(v=1, event_id=f"{run}-{seq}", company_id=company, run_id=run, seq=seq, ts=T0 + timedelta(seconds=seq), payload=payload)


def _run_keyed_for(partition: int, partitions: int, company: str) -> str:
    return next(f"run-{i}" for i in range(1000) if default_partition(partition_key(company, f"run-{i}"), partitions) == partition)


async def _send(broker: str, topic: str, events, partition: int | None) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=broker, enable_idempotence=True)
    await producer.start()
    try:
        for e in events:
            await producer.send(topic, encode_event(e), key=partition_key(e.company_id, e.run_id), partition=partition)
        await producer.flush()
    finally:
        await producer.stop()


async def test_a_run_split_over_two_partitions_loses_no_event(kafka_bootstrap, tmp_path):
    scenario = Scenario(kafka_bootstrap, tmp_path, partitions=2)
    run = _run_keyed_for(1, 2, "acme")
    call = lambda seq, c: _ev(ToolCall, ToolCallPayload(call_id=c, tool="t", arguments={"q": c}), seq, run)  # noqa: E731
    result = lambda seq, c: _ev(ToolResult, ToolResultPayload(call_id=c, output=f"out-{c}"), seq, run)  # noqa: E731
    before = [_ev(RunStart, RunStartPayload(agent_name="x"), 0, run), call(1, "c"), call(2, "d")]
    held = [result(3, "c"), result(4, "d")]  # still on partition 0, written late
    after = [call(5, "e"), result(6, "e"), _ev(RunEnd, RunEndPayload(status="completed"), 7, run)]
    plans = {name: tmp_path / f"plan-{name}.json" for name in ("a", "b")}
    try:
        await scenario.create_topics()
        workers = {name: scenario.start_worker(name, STEPSTREAM_FAULT_PLAN=str(plan)) for name, plan in plans.items()}
        for w in workers.values():
            await asyncio.to_thread(w.wait_web)
        await wait_for(lambda: all(w.ready().get("ready") for w in workers.values()), 60, "both workers assigned")
        # Which worker owns partition 0: a probe run's event there, counted by its owner.
        probe = _run_keyed_for(0, 2, "probe")
        await _send(scenario.broker, scenario.topic, [_ev(RunStart, RunStartPayload(agent_name="p"), 0, probe, "probe")], 0)
        owner = await wait_for(
            lambda: next((n for n, w in workers.items() if w.metric_sum("stepstream_events_total") > 0), None),
            60, "the probe applied",
        )
        slow, fast = workers[owner], workers["b" if owner == "a" else "a"]

        # Under one partition every event was on partition 0.
        await _send(scenario.broker, scenario.topic, before, 0)
        await wait_for(lambda: _last_seq(scenario, run, 2), 60, "the first events durable")
        write_plan(plans[owner], {"rules": [{"store": "steps", "op": "write", "action": "hang", "seconds": HANG_SECONDS, "count": 1}]})
        await _send(scenario.broker, scenario.topic, held, 0)
        await wait_for(lambda: read_log(plans[owner]), 60, "the slow owner's write hanging")
        # The partition count is two now: the run's key goes to partition 1.
        await scenario.produce(after)
        await wait_for(lambda: _last_seq(scenario, run, 7), HANG_SECONDS - 5, "the other owner's write, while the first hangs")
        await wait_caught_up(scenario.broker, scenario.group, scenario.topic, list(workers.values()), timeout=120)
        assert slow.metric_sum("stepstream_stale_run_writes_total") >= 1
        assert slow.metric_sum("stepstream_misrouted_records_total") == len(before) + len(held)
        assert fast.metric_sum("stepstream_misrouted_records_total") == 0
        got = await dump(scenario.steps_url, scenario.deep_url, ["acme"])
        for w in workers.values():
            assert w.stop(timeout=30) == 0, w.tail()
    finally:
        scenario.stop_all()

    want = await golden_dump([*before, *after, *held], tmp_path / "golden", ["acme"])
    assert got == want, first_difference(got, want)


async def _last_seq(scenario: Scenario, run: str, at_least: int) -> bool:
    states = await run_states(scenario.steps_url, {"acme": [run]})
    return states.get(("acme", run), -1) >= at_least
