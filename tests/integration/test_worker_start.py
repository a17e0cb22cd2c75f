"""A worker's start on the real broker: every phase is timed from the process start
(``stepstream_worker_start_seconds{phase}``), in the order the start runs them, and
the first durable batch holds the events it counts (``docs/worker.md``, Start-up)."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import Scenario, wait_for
from stepstream.emitter.corpus import generate_many_runs
from stepstream.ingest.startup import PHASES

pytestmark = pytest.mark.integration


def _phases(text: str) -> dict[str, float]:
    return {
        s.labels["phase"]: s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "stepstream_worker_start_seconds"
    }


async def test_start_phases_are_timed_in_order_up_to_the_first_durable_batch(kafka_bootstrap, tmp_path):
    scenario = Scenario(kafka_bootstrap, tmp_path, partitions=4)
    try:
        events = generate_many_runs(5, runs=30, companies=2)
        await scenario.create_topics()
        await scenario.produce(events)  # waiting before the worker starts, as for a scale-up
        spawned = time.monotonic()
        worker = scenario.start_worker()
        worker.wait_web()
        await wait_for(lambda: worker.metric_sum("stepstream_events_total") > 0, 60, "a first durable batch")
        outside = time.monotonic() - spawned
        await wait_for(lambda: "first_batch" in _phases(worker.metrics()), 10, "the first_batch mark")
        phases = _phases(worker.metrics())
        assert set(phases) == set(PHASES), phases
        ordered = [phases[p] for p in PHASES]
        assert ordered == sorted(ordered), phases  # each phase ends after the one before it
        assert 0 < phases["imported"]
        # Measured from the kernel's start of the process: never later than what the
        # test saw from outside (it spawned the process first), plus the timer's period.
        assert phases["first_batch"] <= outside + 0.5, (phases, outside)
        await wait_for(lambda: worker.metric_sum("stepstream_events_total") >= len(events), 60, "every event")
    finally:
        scenario.stop_all()
