"""``stepstream import --publish`` (issue 13): a bundle's events reach the raw topic
in order, keyed by the new run, and decode as wire events."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from stepfork.recorder import record

from stepstream.cli import main
from stepstream.core.wire import decode_event, partition_key

pytestmark = pytest.mark.integration


async def test_import_publishes_in_order(tmp_path: Path, kafka_bootstrap: str, kafka_topic_factory) -> None:
    topic = await kafka_topic_factory(2, prefix="import")
    bundle = tmp_path / "rec.sftrace"
    with record("ref", output=bundle) as session:
        for i in range(5):
            call = session.record_tool_call(name="t", input={"i": i})
            session.record_tool_result(call, i)
    argv = ["import", str(bundle), "--company", "acme", "--run-id", "imp-1", "-o", str(tmp_path / "e.jsonl"),
            "--publish", "--broker", kafka_bootstrap, "--topic", topic]  # fmt: skip
    assert await asyncio.to_thread(main, argv) == 0
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=f"{topic}.r")  # fmt: skip
    await consumer.start()
    got = []
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while len(got) < 12 and loop.time() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                got.extend(records)
    finally:
        await consumer.stop()
    assert len(got) == 12  # run_start, 5 calls, 5 results, run_end
    assert {r.key for r in got} == {partition_key("acme", "imp-1")}
    events = [decode_event(r.value) for r in sorted(got, key=lambda r: r.offset)]
    assert [e.seq for e in events] == list(range(12))
