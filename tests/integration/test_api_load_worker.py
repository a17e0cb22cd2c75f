"""Concurrent API readers while ``stepstream worker`` writes, on the real broker:
the API (uvicorn, its own process) and the worker share one SQLite database; the
demo producer fills a fresh topic. Bounded (a few seconds of reading); no request
may fail. ``make bench`` runs the longer version and prints p99."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_api import run_load  # noqa: E402

pytestmark = pytest.mark.integration


def test_concurrent_readers_while_the_worker_writes(tmp_path, kafka_bootstrap):
    report = run_load(
        tmp_path, readers=6, seconds=4.0, seed_runs=20, write_runs=60, max_requests=5000, broker=kafka_bootstrap
    )
    print("\n".join(report.lines()))
    assert report.errors == 0, report.error_samples
    assert report.writer_exit == 0, "the worker did not apply every event"
    assert report.requests > 50 and all(report.latencies[route] for route in report.latencies)
