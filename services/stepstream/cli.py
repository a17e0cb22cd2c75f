"""``stepstream``: the one console script (CONTRACT.md section 5).

The composition root: flags and ``STEPSTREAM_*`` variables become frozen
:class:`~stepstream.config.Settings` here, and nowhere else.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from stepstream.config import Settings, load_settings
from stepstream.errors import StepstreamError


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--broker", help="Kafka bootstrap host:port [STEPSTREAM_BROKER, 127.0.0.1:9092]")
    p.add_argument("--topic", help="raw event topic [STEPSTREAM_TOPIC, stepstream.events]")
    p.add_argument("--partitions", type=int, help="partitions of the raw and dead-letter topics [4]")
    p.add_argument("--log-level", help="debug, info, warning, error [warning]")


def _sinks(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps-sink", help="steps store URL [STEPSTREAM_STEPS_SINK, sqlite:///stepstream.db]")
    p.add_argument("--deep-sink", help="deep store URL [STEPSTREAM_DEEP_SINK, the steps sink]")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stepstream", description="Kafka-native ingestion of AI-agent traces.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("worker", help="run the stream processor (faust) on the raw topic")
    _common(p)
    _sinks(p)
    p.add_argument("--app-id", help="faust app id = consumer group [stepstream-worker]")
    p.add_argument("--web-port", type=int, help="port of /metrics, /ready, /healthz [6066]")
    p.add_argument("--web-host", help="bind address of the web port [127.0.0.1]")
    p.add_argument("--max-event-bytes", type=int, help="larger messages are dead-lettered as oversize [1048576]")
    p.add_argument("--idle-flush-seconds", type=float, help="flush an idle thinking tail after this long [5]")
    p.add_argument(
        "--max-hold-seconds", type=float, help="flush the tail holding the oldest uncommitted message after this long [10]"
    )
    p.add_argument("--max-open-runs", type=int, help="runs kept in memory; the least recently used are flushed [20000]")
    p.add_argument(
        "--store-retry-seconds", type=float, help="retry a batch while a store is unavailable, then exit 70 [60]"
    )

    p = sub.add_parser("demo", help="emit realistic agent runs to the raw topic")
    _common(p)
    p.add_argument("--runs", type=int, default=40, help="number of runs [40]")
    p.add_argument("--companies", type=int, default=4, help="number of companies [4]")
    p.add_argument("--seed", type=int, default=7, help="corpus seed [7]")
    p.add_argument("--out", type=Path, help="also write the events as JSON lines to this file")

    p = sub.add_parser("ingest-file", help="run the same engine over a JSON-lines file, without Kafka")
    p.add_argument("events", type=Path, help="JSON-lines file of wire events")
    _sinks(p)
    p.add_argument("--rejects", type=Path, help="where rejected lines go [EVENTS.rejects.jsonl]")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--max-event-bytes", type=int, help="larger lines are rejected as oversize [1048576]")

    p = sub.add_parser("compactor", help="enforce retention, close abandoned runs (loop, or --once)")
    _common(p)
    _sinks(p)
    p.add_argument("--once", action="store_true", help="run one pass and exit (1 if a stage failed)")
    p.add_argument("--interval", type=float, dest="compactor_interval_seconds", help="seconds between passes [60]")
    p.add_argument("--web-port", type=int, dest="compactor_web_port", help="port of /metrics and /healthz [6068]")
    p.add_argument("--web-host", help="bind address of the web port [127.0.0.1]")
    p.add_argument("--deep-runs", type=int, dest="deep_runs_per_company", help="runs per company keeping bodies [50]")
    p.add_argument("--deep-ttl-seconds", type=float, help="drop bodies of runs older than this [0: off]")
    p.add_argument("--step-ttl-seconds", type=float, help="delete whole runs older than this [0: off]")
    p.add_argument("--abandon-after-seconds", type=float, help="close running runs idle this long [3600; 0: off]")
    p.add_argument("--retention-file", help="TOML file of per-company overrides [STEPSTREAM_RETENTION_FILE]")

    p = sub.add_parser("purge", help="destroy the deep bodies of a company or of one run (steps stay)")
    _sinks(p)
    p.add_argument("--company", required=True, help="the company")
    p.add_argument("--run", help="only this run")
    p.add_argument("--dry-run", action="store_true", help="only count what would go")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--log-level", help="debug, info, warning, error [warning]")
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    keys = (
        "broker", "topic", "partitions", "log_level", "steps_sink", "deep_sink", "app_id",
        "web_port", "web_host", "max_event_bytes", "idle_flush_seconds", "max_hold_seconds", "max_open_runs",
        "store_retry_seconds", "compactor_interval_seconds", "compactor_web_port", "deep_runs_per_company",
        "deep_ttl_seconds", "step_ttl_seconds", "abandon_after_seconds", "retention_file",
    )
    return load_settings({k: getattr(args, k, None) for k in keys})


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = _settings(args)
        logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        if args.command == "worker":
            from stepstream.ingest.app import run_worker

            return run_worker(settings)
        if args.command == "demo":
            from stepstream.emitter.demo import run_demo

            return asyncio.run(run_demo(settings, runs=args.runs, companies=args.companies, seed=args.seed, out=args.out))
        if args.command == "ingest-file":
            from stepstream.ingest.offline import ingest_file

            if not args.events.exists():
                print(f"stepstream: no such file: {args.events}", file=sys.stderr)
                return 2
            report = asyncio.run(
                ingest_file(
                    args.events,
                    settings.steps_sink,
                    settings.deep,
                    rejects=args.rejects,
                    max_event_bytes=settings.max_event_bytes,
                    progress=not args.no_progress,
                )
            )
            print(
                f"ingested {report.events} events from {report.lines} lines "
                f"({report.rejected} rejected) into {settings.steps_sink} / {settings.deep}",
                file=sys.stderr,
            )
            return 1 if report.rejected else 0
        if args.command == "compactor":
            from stepstream.compactor.service import run_compactor

            return asyncio.run(run_compactor(settings, once=args.once))
        if args.command == "purge":
            from stepstream.compactor.purge import purge

            result = asyncio.run(
                purge(settings.deep, args.company, args.run, dry_run=args.dry_run, yes=args.yes,
                      progress=not args.no_progress)
            )  # fmt: skip
            if args.dry_run:
                print(f"would destroy {result.bodies} bodies of {result.runs} runs")
                return 0
            if not result.confirmed:
                return 1
            print(f"destroyed {result.destroyed} bodies")
            return 0
    except StepstreamError as exc:
        print(f"stepstream: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
