"""Every metric of ``stepstream.metrics`` moves, read through a real worker's
``/metrics`` (issue 9): a crafted stream on the real broker with a gap and a late
event, a duplicate, poison, a run past the step ceiling, a body past its cap, a
thinking run, and a store write that lands and then reports failure (a retry, and
a stale state on the retry), and a record on the partition its key does not hash to.

Two metrics cannot move in a worker and are read here otherwise, said so in
``NOT_FROM_THE_WORKER``: the compactor's families, and a clip at the deep
port needs a body the engine did not clip (the worker's engine clips to the same
caps first), which the service test ``test_port_clips_reach_the_metrics_page``
covers. The OTLP stage's counter moves only with an OTLP topic: its own tests read it.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from aiokafka import AIOKafkaProducer

from harness import Scenario, wait_caught_up
from stepstream.core import wire
from stepstream.emitter.producer import Emitter
from stepstream.ingest.routing import default_partition
from stepstream.metrics import Metrics
from stepstream.sinks.faults import write_plan

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 29, 10, 0, tzinfo=timezone.utc)
_COMPACTOR = "the compactor's, read through its own /metrics in tests/service/test_compactor_cli.py"
NOT_FROM_THE_WORKER = {
    name: _COMPACTOR
    for name in (
        "stepstream_runs_pruned", "stepstream_deep_bodies_purged", "stepstream_runs_abandoned",
        "stepstream_runs_expired", "stepstream_compactor_passes", "stepstream_compactor_pass_seconds",
        "stepstream_compactor_last_success_timestamp_seconds", "stepstream_compactor_errors",
    )
}  # fmt: skip
# Counted only when the worker reads an OTLP topic: tests/integration/test_otlp_worker.py
# and test_otel_collector.py check that it moves.
NOT_FROM_THE_WORKER["stepstream_otlp"] = "the OTLP topic stage (test_otlp_worker.py)"


def event(kind: str, run: str, seq: int, **payload: Any) -> wire.Event:
    cls = {t.__struct_config__.tag: t for t in wire.EVENT_TYPES}[kind]
    payload_type = cls.__annotations__["payload"]
    payload_cls = getattr(wire, payload_type) if isinstance(payload_type, str) else payload_type
    return cls(v=1, event_id=f"{run}-{seq}", company_id="acme", run_id=run, seq=seq,
               ts=T0 + timedelta(milliseconds=seq), payload=payload_cls(**payload))  # fmt: skip


def stream() -> list[wire.Event]:
    events: list[wire.Event] = []
    # A gap (seq 2 skipped), then seq 2 late; then a duplicate of seq 1.
    gap = [event("run_start", "gaps", 0, agent_name="a"), event("state_change", "gaps", 1, key="k", value=1)]
    gap += [event("state_change", "gaps", 3, key="k", value=3), event("state_change", "gaps", 2, key="k", value=2)]
    gap += [gap[1], event("run_end", "gaps", 4, status="completed")]
    events += gap
    # Past the step ceiling of 500: five steps dropped.
    events += [event("state_change", "ceiling", i, key="k", value=i) for i in range(505)]
    events.append(event("run_end", "ceiling", 505, status="failed", failure="too long"))
    # A body past its cap, and a thinking run flushed by size and closed.
    events.append(event("tool_call", "bodies", 0, call_id="c", tool="t", arguments={}))
    events.append(event("tool_result", "bodies", 1, call_id="c", output="x" * 70_000))
    events += [event("thinking_delta", "bodies", 2 + i, text="y" * 1000) for i in range(5)]
    events.append(event("run_end", "bodies", 7, status="completed"))
    # A failure without a type (a common agent shape): kept, counted as coerced.
    events.append(event("run_start", "untyped", 0, agent_name="a"))
    events.append(event("run_end", "untyped", 1, status="failed", failure={"message": "boom", "kind": "ToolError"}))
    return events


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def total(found: dict, name: str, **labels: str) -> float:
    return sum(v for got, v in found.get(name, []) if all(got.get(k) == w for k, w in labels.items()))


async def test_every_metric_moves_on_the_metrics_page(kafka_bootstrap, tmp_path):
    scenario = Scenario(kafka_bootstrap, tmp_path, partitions=2)
    plan = tmp_path / "faults.json"
    # The first step write lands, then reports failure: retried, and the retry finds
    # its states already stored (stale).
    write_plan(plan, {"rules": [{"store": "steps", "op": "write", "action": "fail_after", "count": 1}]})
    try:
        await scenario.create_topics()
        worker = scenario.start_worker(STEPSTREAM_FAULT_PLAN=str(plan))
        async with Emitter(scenario.broker, scenario.topic) as emitter:
            await emitter.emit_many(stream())
            await emitter.emit_raw(b"acme/poison", b"{not json")
        # A valid event on the other partition than its key's (another partitioner's choice).
        stray = event("run_start", "stray", 0, agent_name="a")
        key = wire.partition_key("acme", "stray")
        producer = AIOKafkaProducer(bootstrap_servers=scenario.broker)
        await producer.start()
        try:
            await producer.send_and_wait(scenario.topic, wire.encode_event(stray), key=key, partition=1 - default_partition(key, 2))
        finally:
            await producer.stop()
        await asyncio.to_thread(worker.wait_web)
        await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [worker], timeout=120)
        # The retried first batch left its runs stale (dropped from memory as such); a
        # run that ends after it leaves memory as ended.
        async with Emitter(scenario.broker, scenario.topic) as emitter:
            await emitter.emit_many(
                [event("run_start", "last", 0, agent_name="a"), event("run_end", "last", 1, status="completed")]
            )
        await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [worker], timeout=120)
        found: dict = {}
        for _ in range(40):  # the lag poller and the gauges settle within a few beats
            found = samples(worker.metrics())
            if total(found, "stepstream_consumer_lag_records") == 0 and found.get("stepstream_consumer_lag_records"):
                break
            await asyncio.sleep(0.25)
        assert worker.stop(timeout=30) == 0, worker.tail()
    finally:
        scenario.stop_all()

    moved = {
        "stepstream_events": total(found, "stepstream_events_total", type="state_change") == 505 + 3,
        "stepstream_duplicate_events": total(found, "stepstream_duplicate_events_total") == 1,
        "stepstream_late_events": total(found, "stepstream_late_events_total") == 1,
        "stepstream_seq_gaps": total(found, "stepstream_seq_gaps_total") == 1,
        "stepstream_steps_dropped": total(found, "stepstream_steps_dropped_total") == 5,
        "stepstream_run_failures_coerced": total(found, "stepstream_run_failures_coerced_total", shape="untyped") == 1,
        "stepstream_dead_letters": total(found, "stepstream_dead_letters_total", reason="not_json") == 1,
        "stepstream_clipped_bodies": total(found, "stepstream_clipped_bodies_total", field="output") == 1,
        "stepstream_thinking_flushes": total(found, "stepstream_thinking_flushes_total", trigger="size") >= 1
        and total(found, "stepstream_thinking_flushes_total", trigger="close") == 1,
        "stepstream_rows_written": total(found, "stepstream_rows_written_total", kind="deep") > 0,
        "stepstream_ingest_lag_seconds": total(found, "stepstream_ingest_lag_seconds_count") > 0,
        "stepstream_sink_write_seconds": total(found, "stepstream_sink_write_seconds_count") > 0,
        "stepstream_store_retries": total(found, "stepstream_store_retries_total", sink="steps") == 1,
        "stepstream_stale_run_writes": total(found, "stepstream_stale_run_writes_total") >= 1,
        "stepstream_evicted_runs": total(found, "stepstream_evicted_runs_total", reason="ended") >= 1,
        "stepstream_misrouted_records": total(found, "stepstream_misrouted_records_total", topic=scenario.topic) == 1,
        "stepstream_store_available": total(found, "stepstream_store_available") == 1,
        # Gauges: set by the worker (present with a value), whatever the value.
        "stepstream_consumer_lag_records": bool(found.get("stepstream_consumer_lag_records")),
        "stepstream_open_runs": bool(found.get("stepstream_open_runs")),
        "stepstream_oldest_held_seconds": bool(found.get("stepstream_oldest_held_seconds")),
        "stepstream_pending_events": bool(found.get("stepstream_pending_events")),
        "stepstream_worker_start_seconds": total(found, "stepstream_worker_start_seconds", phase="first_batch") > 0,
    }
    declared = {family.name for family in Metrics().registry.collect()}
    assert declared - set(NOT_FROM_THE_WORKER) == set(moved), "every declared metric is checked here"
    assert [name for name, ok in moved.items() if not ok] == [], sorted(found)
