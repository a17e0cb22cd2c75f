"""Clips at the deep port reach the worker's metrics page (issue 9). In a running
worker the engine clips first, to the same caps, so only a foreign body (an import,
a store opened with smaller caps) is ever cut at the port; this drives one through
the worker's own deep store and reads the exposition text the ``/metrics`` page
serves (``generate_latest`` of the worker's registry)."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stepstream.config import load_settings
from stepstream.core.records import DeepRecord
from stepstream.ingest.app import IngestWorker
from stepstream.metrics import Metrics


def clipped_by_field(text: str) -> dict[str, float]:
    return {
        s.labels["field"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "stepstream_clipped_bodies_total"
    }


async def test_port_clips_reach_the_metrics_page():
    settings = load_settings({"steps_sink": "memory://", "deep_sink": "memory://"}, environ={})
    metrics = Metrics()
    worker = IngestWorker(settings, metrics, dlq_topic=None)
    await worker.start()
    try:
        deep_store = worker._stores[1]
        foreign = DeepRecord(company_id="acme", run_id="r1", step_seq=0, kind="tool", ts="2026-11-29T10:00:00.000000Z",
                             arguments={"blob": "a" * 40_000}, output="o" * 70_000)  # fmt: skip
        await deep_store.write([foreign])
        await deep_store.write([foreign])  # the same foreign body again: counted again
        assert clipped_by_field(generate_latest(metrics.registry).decode()) == {"arguments": 2.0, "output": 2.0}
        (row,) = await deep_store.get_deep("acme", "r1")
        assert row.clipped and len(row.output) == 65_536
    finally:
        for store in worker._stores:
            await store.close()
