"""The ingest route's max rate and API CPU per event, two trees side by side: this
tree's ``services/`` against another's (a commit before a change), interleaved in
one run so the machine's noise falls on both.

    git archive COMMIT services | tar -x -C /tmp/before
    PYTHONPATH=services python -m benchmarks.compare_ingest --broker HOST:PORT \\
        --before /tmp/before/services [--rounds 3] [--seconds 6]

Each round starts ``stepstream api --ingest`` from each tree in turn (``PYTHONPATH``
first, so that tree's package is the one imported) and runs ``bench_ingest``'s max
rate (16 clients, 1 KiB events in batches of 100) against it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

from benchmarks import bench_ingest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare_ingest")
    parser.add_argument("--broker", default=os.environ.get("STEPSTREAM_TEST_BROKER"), required="STEPSTREAM_TEST_BROKER" not in os.environ)
    parser.add_argument("--before", required=True, help="the services/ folder of the tree to compare against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args(argv)
    trees = {"before": str(Path(args.before).resolve()), "this": str(Path(__file__).resolve().parents[1] / "services")}
    topic = asyncio.run(bench_ingest.create_topic(args.broker))
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    saved = os.environ.get("PYTHONPATH")
    try:
        for round_ in range(args.rounds):
            for name, services in trees.items():
                os.environ["PYTHONPATH"] = services
                with tempfile.TemporaryDirectory(prefix="stepstream-compare-ingest-") as tmp:
                    api = bench_ingest.Api(args.broker, topic, Path(tmp))
                    try:
                        rate, cpu, tally = asyncio.run(bench_ingest.max_rate(api, args.seconds, args.clients))
                    finally:
                        api.stop()
                results[name].append((rate, cpu))
                print(f"round {round_} {name:6} {rate:9,.0f} events/s {cpu * 1e6:6.1f} us API CPU per event; "
                      f"errors {tally.errors}", flush=True)  # fmt: skip
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    mean = {name: (sum(r for r, _ in v) / len(v), sum(c for _, c in v) / len(v)) for name, v in results.items()}
    print(f"compare.ingest  this/before: {mean['this'][0] / mean['before'][0]:.2f}x events/s, "
          f"{mean['this'][1] / mean['before'][1]:.2f}x API CPU per event (before {mean['before'][0]:,.0f} events/s, "
          f"{mean['before'][1] * 1e6:.1f} us; this {mean['this'][0]:,.0f} events/s, {mean['this'][1] * 1e6:.1f} us)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "services"))
    raise SystemExit(main())
