"""``make bench``: every benchmark, each printing ratios measured side by side in one run.

    python -m benchmarks [--broker HOST:PORT] [--mongo URL] [--secure DIR] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys


QUICK_NOTE = ("--quick: a smoke run. Its figures are NOT comparable with the full run's: smaller corpora, "
              "one round, and worker windows of a fraction of a second.")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--broker", default=os.environ.get("STEPSTREAM_TEST_BROKER"))
    parser.add_argument("--mongo", default=os.environ.get("STEPSTREAM_TEST_MONGO_URL"))
    parser.add_argument("--secure", default=os.environ.get("STEPSTREAM_TEST_SECURE_KAFKA"),
                        help="folder of the locked-down broker (kafka.sh up --secure)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="smaller corpora, for a smoke run")
    args = parser.parse_args()

    from benchmarks import bench_engine, bench_memory, bench_redact, bench_sinks, bench_worker

    if args.quick:
        print(QUICK_NOTE, flush=True)
    print("== engine (decode + fold vs msgspec decode alone) ==", flush=True)
    bench_engine.main(["--runs", "100", "--rounds", "2", "--open-runs", "2000"] if args.quick else [])
    print("\n== redaction (second line: near-match budget, RE2 vs re, engine on/off) ==", flush=True)
    redact_ok = bench_redact.main(["--quick"] if args.quick else []) == 0
    print("\n== sinks (SQLite / MongoDB vs bare driver) ==", flush=True)
    quick_sinks = ["--batches", "10", "--rounds", "1", "--mongo-batches", "2"] if args.quick else []
    bench_sinks.main((["--mongo", args.mongo] if args.mongo else []) + quick_sinks)
    print("\n== OTLP (decode alone: upb vs pure-Python protobuf vs JSON; decode + mapping vs native decode) ==", flush=True)
    from benchmarks import bench_otlp

    bench_otlp.main((["--broker", args.broker] if args.broker else []) + (["--traces", "300", "--rounds", "1"] if args.quick else []))
    print("\n== capacity constants (engine + MongoDB sink: CPU, store operations and bytes per event; the sizing model) ==",
          flush=True)  # fmt: skip
    from benchmarks import bench_capacity

    bench_capacity.main((["--mongo", args.mongo] if args.mongo else []) + (["--broker", args.broker] if args.broker else [])
                        + (["--quick"] if args.quick else []))  # fmt: skip
    print("\n== store ceiling (the worker into MongoDB beside a bare pymongo replay of its recorded writes) ==",
          flush=True)  # fmt: skip
    from benchmarks import bench_ceiling

    bench_ceiling.main((["--mongo", args.mongo] if args.mongo else []) + (["--quick"] if args.quick else []))
    print("\n== API (concurrent readers while a writer ingests into the same SQLite store) ==", flush=True)
    from benchmarks import bench_api

    bench_api.main((["--broker", args.broker] if args.broker else []) + (["--seconds", "3", "--write-runs", "200"] if args.quick else []))
    print("\n== viewer (server time of the pages beside their JSON twins; the 500-step page in Chromium) ==", flush=True)
    from benchmarks import bench_viewer

    bench_viewer.main(["--requests", "10"] if args.quick else [])
    if args.broker:
        print("\n== worker (end to end on the real broker: two corpora, three sinks, their ceilings) ==", flush=True)
        bench_worker.main(
            ["--broker", args.broker, *(["--mongo", args.mongo] if args.mongo else []), *(["--quick"] if args.quick else [])]
        )
        print("\n== backfill (ingest-file beside the worker into SQLite, both corpora; target >= 1.0x) ==", flush=True)
        from benchmarks import bench_backfill, bench_start

        bench_backfill.main(["--broker", args.broker, *(["--quick"] if args.quick else [])])
        print("\n== worker start (process start to the first durable batch, with its breakdown; target <= 3 s) ==",
              flush=True)  # fmt: skip
        bench_start.main(["--broker", args.broker, *(["--quick"] if args.quick else [])])
        print("\n== HTTP ingest (events/s per API process, p99 at half that rate, the SDK over HTTP, beside a bare producer) ==",
              flush=True)  # fmt: skip
        from benchmarks import bench_ingest

        bench_ingest.main(["--broker", args.broker, *(["--quick"] if args.quick else [])])
        print("\n== memory (a backlog of cap-sized bodies: worker + writer peak RSS under 1 GiB) ==", flush=True)
        memory_ok = bench_memory.main(["--broker", args.broker, *(["--quick"] if args.quick else [])]) == 0
    else:
        memory_ok = True
        print("\n(worker and memory benchmarks skipped: no --broker / STEPSTREAM_TEST_BROKER; `make bench` starts one)",
              file=sys.stderr)  # fmt: skip
    security_ok = True
    if args.secure:
        print("\n== Kafka security (the worker over SASL_SSL vs plaintext, same broker and topic) ==", flush=True)
        from benchmarks import bench_kafka_security

        security_ok = bench_kafka_security.main(["--secure", args.secure, *(["--quick"] if args.quick else [])]) == 0
    else:
        print("\n(Kafka security benchmark skipped: no --secure / STEPSTREAM_TEST_SECURE_KAFKA; `make bench` starts one)",
              file=sys.stderr)  # fmt: skip
    if not security_ok:
        print("the Kafka security benchmark gave no ratio (see above)", file=sys.stderr)
    if not redact_ok:
        print("redaction near-match budget exceeded (see redact.near_match above)", file=sys.stderr)
    if not memory_ok:
        print("worker memory bound exceeded (see memory above)", file=sys.stderr)
    if args.quick:
        print("\n" + QUICK_NOTE, flush=True)
    return 0 if redact_ok and memory_ok and security_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
