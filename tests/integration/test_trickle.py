"""A slow trickle of tiny thinking deltas (issue 8): commits stay bounded.

One run emits an empty or one-character thinking delta every 0.2 s for ~20 s. No
delta fills the 2 KiB flush, none closes the step, and the run is never idle long
enough for the idle flush, so without a bound the partition's commits would wait for
the whole trickle. With ``max_hold_seconds`` = 2 the committed offset may lag the
oldest uncommitted delta by at most the documented bound (docs/worker.md, "Bounds"):
the hold bound, plus a batch write, plus the commit interval (1 s); we allow
:data:`SLACK` on top for polling and a loaded machine. Measured from outside, by
polling the group's committed offset, as an operator would.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone

import pytest
from aiokafka import AIOKafkaProducer

from harness import Scenario, committed_offsets, dump, first_difference, golden_dump, wait_caught_up
from stepstream.core import wire
from stepstream.core.wire import encode_event, partition_key

pytestmark = pytest.mark.integration

PARTITIONS = 2
MAX_HOLD = 2.0
COMMIT_INTERVAL = 1.0  # faust's broker_commit_interval in create_app
SLACK = 2.0
BOUND = MAX_HOLD + COMMIT_INTERVAL + SLACK
INTERVAL = 0.2
DELTAS = 100  # ~20 s
POLL = 0.2


def trickle_run() -> list[wire.Event]:
    company, run = "trickle-co", "run-trickle-1"
    start = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)

    def envelope(seq: int) -> dict:
        return dict(v=1, event_id=f"ev-{seq}", company_id=company, run_id=run, seq=seq,
                    ts=start + timedelta(milliseconds=200 * seq))  # fmt: skip

    events: list[wire.Event] = [wire.RunStart(**envelope(0), payload=wire.RunStartPayload(agent_name="slow-thinker"))]
    for i in range(1, DELTAS + 1):
        text = "" if i % 2 else "."
        events.append(wire.ThinkingDelta(**envelope(i), payload=wire.ThinkingDeltaPayload(text=text)))
    events.append(wire.RunEnd(**envelope(DELTAS + 1), payload=wire.RunEndPayload(status="completed")))
    return events


async def test_trickle_of_tiny_deltas_keeps_commit_lag_bounded(kafka_bootstrap, tmp_path):
    events = trickle_run()
    golden = await golden_dump(events, tmp_path / "golden", ["trickle-co"])
    scenario = Scenario(kafka_bootstrap, tmp_path, PARTITIONS)
    produced: list[tuple[int, float]] = []  # (offset, time the broker had it), in order
    lags: list[float] = []
    try:
        await scenario.create_topics()
        worker = scenario.start_worker(STEPSTREAM_MAX_HOLD_SECONDS=str(MAX_HOLD))
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=True)
        await producer.start()
        key = partition_key("trickle-co", "run-trickle-1")
        # The run starts, and the group has joined and committed it, before the clock runs.
        meta = await producer.send_and_wait(scenario.topic, encode_event(events[0]), key=key)
        await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [worker], timeout=60)
        done = asyncio.Event()
        partition = meta.partition

        async def poll() -> None:
            while not done.is_set():
                committed = await committed_offsets(scenario.broker, scenario.group, scenario.topic, PARTITIONS)
                now = time.monotonic()
                # The oldest delta the group has not committed: how long it has waited.
                waiting = [at for offset, at in produced if offset >= committed[partition]]
                lags.append(now - waiting[0] if waiting else 0.0)
                await asyncio.sleep(POLL)

        poller = asyncio.ensure_future(poll())
        try:
            for event in events[1:-1]:
                meta = await producer.send_and_wait(scenario.topic, encode_event(event), key=key)
                produced.append((meta.offset, time.monotonic()))
                await asyncio.sleep(INTERVAL)
            done.set()
            await poller
            await producer.send_and_wait(scenario.topic, encode_event(events[-1]), key=key)
        finally:
            done.set()
            await producer.stop()
        await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [worker], timeout=60)
        assert worker.stop(timeout=30) == 0, worker.tail()
    finally:
        scenario.stop_all()

    worst = max(lags)
    print(f"trickle: {len(produced)} messages over {produced[-1][1] - produced[0][1]:.1f}s; worst commit lag "
          f"{worst:.2f}s (bound {BOUND:g}s) over {len(lags)} polls")  # fmt: skip
    assert len(lags) >= DELTAS * INTERVAL / POLL / 2, "too few polls to judge"
    assert worst <= BOUND, f"commit lag reached {worst:.1f}s, bound {BOUND:g}s; lags over time: {[round(x, 1) for x in lags]}"
    got = await dump(scenario.steps_url, scenario.deep_url, ["trickle-co"])
    assert got == golden, first_difference(golden, got)
