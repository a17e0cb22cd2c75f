"""A short, bounded load check: concurrent readers against ``stepstream api`` (its
own process, uvicorn) while ``stepstream ingest-file`` writes into the same SQLite
database. No request may fail. ``make bench`` runs the longer version and prints
the latency quantiles."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_api import run_load  # noqa: E402


def test_concurrent_readers_while_a_writer_writes(tmp_path):
    report = run_load(tmp_path, readers=6, seconds=3.0, seed_runs=20, write_runs=150, max_requests=5000)
    print("\n".join(report.lines()))
    assert report.errors == 0, report.error_samples
    assert report.writer_exit == 0
    assert report.requests > 50 and all(report.latencies[route] for route in report.latencies)
