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

from stepstream.config import KAFKA_OVERRIDES, Settings, load_settings
from stepstream.errors import StepstreamError


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--broker", help="Kafka bootstrap host:port or kafka://host:port, comma-separated [STEPSTREAM_BROKER, 127.0.0.1:9092]"
    )
    p.add_argument("--topic", help="raw event topic [STEPSTREAM_TOPIC, stepstream.events]")
    _kafka_security(p)
    p.add_argument("--partitions", type=int, help="partitions of the raw and dead-letter topics [4]")
    p.add_argument("--replication-factor", type=int, help="replication factor of the topics created [1]")
    p.add_argument("--log-level", help="debug, info, warning, error [warning]")


class _RefusePassword(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        parser.error("a password is never a flag: set STEPSTREAM_KAFKA_SASL_PASSWORD or --kafka-sasl-password-file")


def _kafka_security(p: argparse.ArgumentParser) -> None:
    """The Kafka connection's security (stepstream.kafka.connection). No password flag:
    STEPSTREAM_KAFKA_SASL_PASSWORD, or a file (--kafka-sasl-password-file)."""
    g = p.add_argument_group("Kafka security")
    g.add_argument("--kafka-security-protocol", help="PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL "
                   "[STEPSTREAM_KAFKA_SECURITY_PROTOCOL, PLAINTEXT]")  # fmt: skip
    g.add_argument("--kafka-sasl-mechanism", help="PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 [STEPSTREAM_KAFKA_SASL_MECHANISM]")
    g.add_argument("--kafka-sasl-username", help="SASL user [STEPSTREAM_KAFKA_SASL_USERNAME]")
    g.add_argument("--kafka-sasl-password-file", help="file holding the SASL password "
                   "[STEPSTREAM_KAFKA_SASL_PASSWORD_FILE; or STEPSTREAM_KAFKA_SASL_PASSWORD]")  # fmt: skip
    # Present only to refuse it (else argparse would take it for --kafka-sasl-password-file).
    g.add_argument("--kafka-sasl-password", action=_RefusePassword, nargs="?", help=argparse.SUPPRESS)
    g.add_argument("--kafka-ssl-cafile", help="PEM CA bundle the brokers' certificates must chain to "
                   "[STEPSTREAM_KAFKA_SSL_CAFILE, the system's]")  # fmt: skip
    g.add_argument("--kafka-ssl-certfile", help="PEM client certificate, for mTLS [STEPSTREAM_KAFKA_SSL_CERTFILE]")
    g.add_argument("--kafka-ssl-keyfile", help="PEM key of the client certificate [STEPSTREAM_KAFKA_SSL_KEYFILE]")
    g.add_argument("--kafka-ssl-check-hostname", action=argparse.BooleanOptionalAction, default=None,
                   help="check the broker's name against its certificate [STEPSTREAM_KAFKA_SSL_CHECK_HOSTNAME, on]")  # fmt: skip


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
    p.add_argument("--no-create-topics", dest="create_topics", action="store_false", default=None,
                   help="do not create the topics; check that they exist with --partitions partitions")  # fmt: skip
    p.add_argument("--web-port", type=int, help="port of /metrics, /ready, /healthz [6066]")
    p.add_argument("--web-host", help="bind address of the web port [127.0.0.1]")
    p.add_argument("--max-event-bytes", type=int, help="larger messages are dead-lettered as oversize [1048576]")
    p.add_argument("--idle-flush-seconds", type=float, help="flush an idle thinking tail after this long [5]")
    p.add_argument(
        "--max-hold-seconds", type=float, help="flush the tail holding the oldest uncommitted message after this long [10]"
    )
    p.add_argument(
        "--batch-bytes", type=int, help="write a batch once its messages reach this many bytes [33554432: 32 MiB]"
    )
    p.add_argument("--max-open-runs", type=int, help="runs kept in memory; the least recently used are flushed [20000]")
    p.add_argument(
        "--store-retry-seconds", type=float, help="retry a batch while a store is unavailable, then exit 70 [60]"
    )
    p.add_argument(
        "--stop-grace-seconds", type=float,
        help="on SIGTERM, exit this long after the last batch is committed even if faust has not finished [15]",
    )

    p = sub.add_parser("demo", help="emit realistic agent runs to the raw topic")
    _common(p)
    p.add_argument("--no-create-topics", dest="create_topics", action="store_false", default=None,
                   help="do not create the topics (an agent principal may only write the raw topic)")  # fmt: skip
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
    _api_commands(sub)
    _bundle_commands(sub)
    return parser


def _bundle_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``export`` and ``verify``: the ``.sftrace`` bundle (docs/bundle.md)."""
    p = sub.add_parser("export", help="write one run as a .sftrace bundle (docs/bundle.md)")
    _sinks(p)
    p.add_argument("--company", required=True, help="the company")
    p.add_argument("--run", required=True, help="the run id")
    p.add_argument("-o", "--out", required=True, type=Path,
                   help="the bundle directory (ending .sftrace), or a directory to write <run>.sftrace into")  # fmt: skip
    p.add_argument("--log-level", help="debug, info, warning, error [warning]")
    p = sub.add_parser("verify", help="check a .sftrace bundle: exit 0 verified, 3 mismatch, 4 invalid, 5 unverified_legacy")
    p.add_argument("bundle", type=Path, help="the .sftrace directory")
    p.add_argument("--log-level", help="debug, info, warning, error [warning]")
    p = sub.add_parser("import", help="a .sftrace bundle (ours or stepfork's) as wire events of a new run")
    _sinks(p)
    p.add_argument("bundle", type=Path, help="the .sftrace directory")
    p.add_argument("--company", required=True, help="the company the run is imported into")
    p.add_argument("--run-id", help="the run id [a new one, imported-<hex>]")
    p.add_argument("-o", "--out", required=True, type=Path, help="the JSON-lines file of wire events to write")
    p.add_argument("--ingest", action="store_true", help="also run the events through the engine into the sinks")
    p.add_argument("--publish", action="store_true", help="also publish the events, in order, to the raw topic")
    _common(p)
    p = sub.add_parser("replay", help="first divergence of a new run's events from a bundle: exit 0 same, 1 diverged")
    p.add_argument("bundle", type=Path, help="the recording (.sftrace directory)")
    p.add_argument("--against", required=True, type=Path, help="JSON-lines wire events of the new run")
    p.add_argument("--log-level", help="debug, info, warning, error [warning]")


def _run_replay(args: argparse.Namespace) -> int:
    from stepstream.bundle.replay import live_calls, recorded_calls, replay
    from stepstream.bundle.verify import verify_bundle
    from stepstream.core.wire import decode_event
    from stepstream.errors import WireError

    verdict = verify_bundle(args.bundle)
    if verdict.status in ("mismatch", "invalid"):
        print(f"stepstream replay: the recording is {verdict.status}: {verdict.message}", file=sys.stderr)
        return verdict.exit_code
    events = []
    for number, line in enumerate(args.against.read_bytes().splitlines(), start=1):
        if line.strip():
            try:
                events.append(decode_event(line))
            except WireError as exc:
                print(f"stepstream replay: {args.against} line {number}: {exc}", file=sys.stderr)
                return 4
    report = replay(recorded_calls(args.bundle), live_calls(events))
    if report.divergence is None:
        extra = f"; fingerprints computed here at positions {report.computed}" if report.computed else ""
        print(f"{report.status}: {report.calls} calls, no divergence{extra}")
        return 0
    d = report.divergence
    print(f"diverged at call {d.position}: {d.field}: recorded {d.recorded!r}, live {d.live!r}")
    return 1


def _run_import(settings: Settings, args: argparse.Namespace) -> int:
    from stepstream.bundle.importer import ImportRefused, bundle_events
    from stepstream.core.wire import encode_event

    try:
        events, status = bundle_events(args.bundle, args.company, args.run_id)
    except ImportRefused as exc:
        print(f"stepstream import: refused: {exc}", file=sys.stderr)
        return 3
    args.out.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    run_id = events[0].run_id if events else args.run_id
    print(f"wrote {len(events)} events of run {run_id} ({status}) to {args.out}")
    if args.publish:
        from stepstream.emitter.producer import Emitter

        async def publish() -> int:
            from stepstream.kafka.preflight import preflight

            await preflight(settings.kafka, topics=(settings.topic,))
            async with Emitter(settings.kafka, settings.topic) as emitter:
                return await emitter.emit_many(events)

        print(f"published {asyncio.run(publish())} events to {settings.topic}")
    if args.ingest:
        from stepstream.ingest.offline import ingest_file

        report = asyncio.run(ingest_file(args.out, settings.steps_sink, settings.deep, progress=False))
        print(f"ingested {report.events} events ({report.rejected} rejected)")
        return 1 if report.rejected else 0
    return 0


def _run_export(settings: Settings, args: argparse.Namespace) -> int:
    from stepstream.bundle.build import BundleRefused
    from stepstream.bundle.export import export_run
    from stepstream.core.canonical import CanonicalError

    try:
        path, bundle = asyncio.run(export_run(settings.steps_sink, settings.deep, args.company, args.run, args.out))
    except BundleRefused as exc:
        print(f"stepstream export: refused ({exc.reason}): {exc}", file=sys.stderr)
        return 3
    except CanonicalError as exc:
        print(f"stepstream export: run {args.run} holds a value outside JSON: {exc}", file=sys.stderr)
        return 4
    except FileExistsError as exc:
        print(f"stepstream export: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}: {bundle.events} events, {bundle.redactions} redactions, {bundle.clipped} clipped bodies")
    return 0


def _run_verify(args: argparse.Namespace) -> int:
    from stepstream.bundle.verify import verify_bundle

    verdict = verify_bundle(args.bundle)
    where = f" ({verdict.file})" if verdict.file and verdict.status != "verified" else ""
    print(f"{verdict.status}{where}: {verdict.message}", file=sys.stdout if verdict.status == "verified" else sys.stderr)
    return verdict.exit_code


def _api_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``api`` and ``token add|list|revoke`` (CONTRACT.md section 4, docs/api.md)."""
    from stepstream.api.tokens import SCOPES

    tokens_help = "tokens file [STEPSTREAM_TOKENS_FILE, stepstream-tokens.json]"
    p = sub.add_parser("api", help="serve the read API (HTTP)")
    _sinks(p)
    p.add_argument("--host", dest="api_host", help="bind address [STEPSTREAM_API_HOST, 127.0.0.1]")
    p.add_argument("--port", dest="api_port", type=int, help="port [STEPSTREAM_API_PORT, 8080]")
    p.add_argument("--tokens-file", help=tokens_help)
    p.add_argument(
        "--max-exports", dest="api_max_exports", type=int,
        help="deep reads and bundle builds at once; more wait, then get 503 [STEPSTREAM_API_MAX_EXPORTS, 4]",
    )  # fmt: skip
    p.add_argument(
        "--export-wait", dest="api_export_wait_seconds", type=float,
        help="seconds a deep read or bundle waits for a free slot [STEPSTREAM_API_EXPORT_WAIT_SECONDS, 2]",
    )  # fmt: skip
    p.add_argument("--log-level", help="debug, info (one access line per request), warning, error [warning]")
    _ingest_flags(p)

    p = sub.add_parser("token", help="manage API tokens (add prints the new token on stdout, once)")
    tokens = p.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    add = tokens.add_parser("add", help="create a token; prints only the token")
    add.add_argument("--company", required=True, help="the one company the token reads (or, with ingest, writes)")
    add.add_argument(
        "--scope", action="append", required=True, choices=list(SCOPES),
        help="a scope; repeat for several",
    )
    add.add_argument("--tokens-file", help=tokens_help)
    listing = tokens.add_parser("list", help="ids, companies, scopes, created and revoked times (never a token)")
    listing.add_argument("--tokens-file", help=tokens_help)
    revoke = tokens.add_parser("revoke", help="revoke a token by id (the API refuses it on its next request)")
    revoke.add_argument("id", help="token id, as `token list` shows it")
    revoke.add_argument("--tokens-file", help=tokens_help)


def _ingest_flags(p: argparse.ArgumentParser) -> None:
    """The API's ingest route (docs/api.md, "Writing events"): off unless ``--ingest``."""
    g = p.add_argument_group("ingest (POST /v1/companies/{company}/events)")
    g.add_argument("--ingest", dest="api_ingest", action="store_const", const=True,
                   help="serve the ingest route, producing to --topic [STEPSTREAM_API_INGEST, off]")  # fmt: skip
    g.add_argument("--broker", help="Kafka bootstrap host:port or kafka://host:port [STEPSTREAM_BROKER, 127.0.0.1:9092]")
    g.add_argument("--topic", help="raw event topic [STEPSTREAM_TOPIC, stepstream.events]")
    g.add_argument("--ingest-max-body-bytes", type=int, help="413 past it [8388608]")
    g.add_argument("--ingest-max-events", type=int, help="events per request, 413 past it [10000]")
    g.add_argument("--ingest-rate-events", type=float, help="events per second per company, 429 past it; 0: off [10000]")
    g.add_argument("--ingest-burst-events", type=int, help="the bucket's size, at least --ingest-max-events [50000]")
    g.add_argument("--ingest-timeout-seconds", type=float, help="every acknowledgement within this, else 503 [10]")
    g.add_argument("--ingest-max-inflight-bytes", type=int, help="sent and not yet acknowledged, 503 past it [67108864]")
    g.add_argument("--ingest-transactions", action="store_const", const=True, default=None,
                   help="each request in one Kafka transaction: whole or not at all downstream "
                        "[STEPSTREAM_INGEST_TRANSACTIONS, off]")  # fmt: skip
    g.add_argument("--ingest-max-requests", type=int, help="ingest requests at once, 503 past it [32]")
    g.add_argument("--ingest-transactional-id", help="prefix of the producers' transactional.id, which needs Kafka "
                   "WRITE and DESCRIBE on it [STEPSTREAM_INGEST_TRANSACTIONAL_ID, stepstream-api]")  # fmt: skip
    _kafka_security(p)  # the ingest producer's connection, as every other client's


def _run_token(settings: Settings, args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from stepstream.api.tokens import add_token, list_tokens, revoke_token

    path = Path(settings.tokens_file)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if args.token_command == "add":
        token, entry = add_token(path, args.company, args.scope, created=now)
        print(f"token {entry.id} added for company {entry.company} ({' '.join(entry.scopes)}) to {path}", file=sys.stderr)
        print(token)
        return 0
    if args.token_command == "list":
        print(f"{'ID':12}  {'COMPANY':20}  {'SCOPES':32}  {'CREATED':20}  REVOKED")
        for e in list_tokens(path):
            print(f"{e.id:12}  {e.company:20}  {','.join(e.scopes):32}  {e.created:20}  {e.revoked or '-'}")
        return 0
    if revoke_token(path, args.id, revoked=now):
        print(f"token {args.id} revoked", file=sys.stderr)
        return 0
    print(f"stepstream: no active token {args.id} in {path}", file=sys.stderr)
    return 1


def _settings(args: argparse.Namespace) -> Settings:
    keys = (
        "broker", "topic", "partitions", "log_level", "steps_sink", "deep_sink", "app_id",
        "web_port", "web_host", "max_event_bytes", "idle_flush_seconds", "max_hold_seconds", "max_open_runs",
        "batch_bytes",
        "store_retry_seconds", "stop_grace_seconds", "replication_factor", "tokens_file", "api_host", "api_port",
        "api_max_exports", "api_export_wait_seconds", "create_topics",
        "api_ingest", "ingest_max_body_bytes", "ingest_max_events", "ingest_rate_events", "ingest_burst_events",
        "ingest_timeout_seconds", "ingest_max_inflight_bytes", "ingest_max_requests", "ingest_transactions",
        "ingest_transactional_id",
        *KAFKA_OVERRIDES,
        "compactor_interval_seconds", "compactor_web_port", "deep_runs_per_company",
        "deep_ttl_seconds", "step_ttl_seconds", "abandon_after_seconds", "retention_file",
    )
    return load_settings({k: getattr(args, k, None) for k in keys})


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = _settings(args)
        logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        from stepstream.logscrub import add_secrets
        from stepstream.logscrub import install as scrub_logs

        add_secrets(settings.kafka.secrets())  # the Kafka password, wherever it would appear
        scrub_logs()  # no credential in any log line (core.redact.scrub)
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
            from stepstream import collector

            collector.tune()
            report = asyncio.run(
                ingest_file(
                    args.events,
                    settings.steps_sink,
                    settings.deep,
                    rejects=args.rejects,
                    max_event_bytes=settings.max_event_bytes,
                    batch_bytes=settings.batch_bytes,
                    progress=not args.no_progress,
                )
            )
            print(
                f"ingested {report.events} events from {report.lines} lines "
                f"({report.rejected} rejected) into {settings.steps_sink} / {settings.deep}",
                file=sys.stderr,
            )
            return 1 if report.rejected else 0
        if args.command == "api":
            from stepstream import collector
            from stepstream.api.server import run_api

            collector.tune()
            return run_api(settings)
        if args.command == "token":
            return _run_token(settings, args)
        if args.command == "compactor":
            from stepstream.compactor.service import run_compactor

            return asyncio.run(run_compactor(settings, once=args.once))
        if args.command == "export":
            return _run_export(settings, args)
        if args.command == "verify":
            return _run_verify(args)
        if args.command == "replay":
            return _run_replay(args)
        if args.command == "import":
            return _run_import(settings, args)
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
    except Exception as exc:
        if not type(exc).__module__.startswith("aiokafka"):
            raise
        # A Kafka error a command did not handle (a refused send, say): one line, not a traceback.
        from stepstream.logscrub import scrub_text

        print(f"stepstream: Kafka: {type(exc).__name__}: {scrub_text(str(exc), 500)}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
