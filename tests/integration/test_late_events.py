"""Late, duplicated and gapped deliveries through a real worker on the real broker
give exactly the rows ``ingest-file`` makes of the same messages (issue 9): the late
event that lands while a thinking tail is pending rides on a batch without a state,
and the worker's watermark must still cover it."""

from __future__ import annotations

import asyncio
import random
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from harness import Scenario, dump, first_difference, wait_caught_up
from stepstream.core import wire
from stepstream.core.wire import encode_event
from stepstream.emitter.producer import Emitter
from stepstream.ingest.offline import ingest_file

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 29, 10, 0, tzinfo=timezone.utc)
PAYLOADS = {t.__struct_config__.tag: t for t in wire.EVENT_TYPES}


def event(kind: str, run: str, seq: int, **payload: Any) -> wire.Event:
    cls = PAYLOADS[kind]
    payload_cls = getattr(wire, cls.__annotations__["payload"])
    return cls(v=1, event_id=f"{run}-{seq}", company_id="acme", run_id=run, seq=seq,
               ts=T0 + timedelta(milliseconds=seq), payload=payload_cls(**payload))  # fmt: skip


def script(run: str) -> list[wire.Event]:
    ops: list[tuple[str, dict]] = [("run_start", {"agent_name": "a", "environment": {"region": "eu"}})]
    for i in range(6):
        ops += [("thinking_delta", {"text": f"step {i} " * 40})] * 3
        ops.append(("tool_call", {"call_id": f"c{i}", "tool": "sh", "arguments": {"i": i}}))
        ops.append(("tool_result", {"call_id": f"c{i}", "output": {"ok": i}}))
    ops.append(("run_end", {"status": "failed", "failure": wire.FailurePayload(type="E", message="m", step=3)}))
    return [event(kind, run, seq, **payload) for seq, (kind, payload) in enumerate(ops)]


def delivered(rng: random.Random) -> list[wire.Event]:
    """Per run: some non-delta events held back a few positions (late), a few
    re-deliveries; runs interleaved."""
    runs = []
    for r in range(6):
        events = script(f"late-{r}")
        keys = []
        for i, e in enumerate(events):
            late = e.__struct_config__.tag != "thinking_delta" and rng.random() < 0.3
            keys.append((i + (rng.randint(1, 5) + 0.5 if late else 0), i))
        order = [events[i] for _, i in sorted(keys)]
        for _ in range(3):
            at = rng.randrange(len(order))
            order.insert(at, order[rng.randrange(at + 1)])
        runs.append(order)
    out = []
    while any(runs):
        run = rng.choice([r for r in runs if r])
        out.append(run.pop(0))
    return out


async def test_worker_equals_ingest_file_with_late_events(kafka_bootstrap, tmp_path):
    events = delivered(random.Random(9))
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    golden_url = f"sqlite:///{tmp_path / 'golden.db'}"
    report = await ingest_file(path, golden_url, golden_url, progress=False)
    assert report.rejected == 0
    golden = await dump(golden_url, golden_url, ["acme"])
    assert len(golden) == 6 and sum(v["run"].get("late_events", 0) for v in golden.values()) > 0
    assert all(v["run"]["failure"] == {"type": "E", "message": "m", "step": 3} for v in golden.values())

    scenario = Scenario(kafka_bootstrap, tmp_path, partitions=2)
    try:
        await scenario.create_topics()
        worker = scenario.start_worker()
        async with Emitter(scenario.broker, scenario.topic) as emitter:
            await emitter.emit_many(events)
        await asyncio.to_thread(worker.wait_web)
        await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [worker], timeout=120)
        late = worker.metric_sum("stepstream_late_events_total")
        assert worker.stop(timeout=30) == 0, worker.tail()
    finally:
        scenario.stop_all()
    got = await dump(scenario.steps_url, scenario.deep_url, ["acme"])
    assert got == golden, first_difference(golden, got)
    assert late > 0
