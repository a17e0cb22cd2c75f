"""OTLP decode and mapping, side by side in one run.

    python -m benchmarks.bench_otlp [--traces N] [--rounds R]

A corpus of export requests made from the golden fixtures (tests/unit/otlp_fixtures: the
three convention families, each trace copied with fresh trace ids), 50 traces (250
spans) per request as a Collector's batch holds them. Measured, spans per second of one
core:

* decode alone: ``otlp_proto`` on the installed protobuf backend (upb), ``otlp_proto`` on
  the pure-Python backend (a subprocess with ``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python``,
  for the ratio), ``otlp_json``;
* decode + identity + mapping to checked wire events (what a bridge stage costs per span),
  beside ``wire.decode_event`` of native events of the same runs (per event);
* with ``--broker``: ``stepstream worker`` into SQLite from the OTLP topic (``otlp_proto``
  batches; the worker bridges them to its raw topic and folds them), beside the same
  worker over the same events pre-loaded on the raw topic as native events (numbered,
  ``span:`` ids): spans/s and the ratio.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "unit" / "otlp_fixtures"
FAMILIES = ("genai", "openinference", "traceloop")


def corpus(traces: int, per_request: int = 50) -> tuple[list[bytes], list[bytes], int]:
    """``(proto requests, json requests, spans)``."""
    import base64
    import json

    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    sources = [ExportTraceServiceRequest.FromString((FIXTURES / f"{f}.pb").read_bytes()) for f in FAMILIES]
    protos: list[bytes] = []
    jsons: list[bytes] = []
    spans = 0
    request = ExportTraceServiceRequest()
    for n in range(traces):
        source = sources[n % len(sources)]
        trace_id = n.to_bytes(16, "big")
        for resource_spans in source.resource_spans:
            copy = request.resource_spans.add()
            copy.CopyFrom(resource_spans)
            for scope_spans in copy.scope_spans:
                for span in scope_spans.spans:
                    span.trace_id = trace_id
                    spans += 1
        if (n + 1) % per_request == 0 or n == traces - 1:
            protos.append(request.SerializeToString())
            document = MessageToDict(request, use_integers_for_enums=True)
            for rs in document.get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    for span in ss.get("spans", []):
                        for field in ("traceId", "spanId", "parentSpanId"):
                            if field in span:
                                span[field] = base64.b64decode(span[field]).hex()
            jsons.append(json.dumps(document).encode())
            request = ExportTraceServiceRequest()
    return protos, jsons, spans


def _rate(work, items: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        work()
        best = min(best, time.process_time() - start)
    return items / best if best > 0 else float("inf")


def _python_backend_rate(traces: int, rounds: int) -> float | None:
    env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}
    code = (
        "import sys; from benchmarks.bench_otlp import _proto_only; "
        f"print(_proto_only({max(traces // 10, 30)}, {rounds}))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
        return None
    return float(done.stdout.strip().splitlines()[-1])


def _proto_only(traces: int, rounds: int) -> float:
    from stepstream.otlp.decode import decode_request, protobuf_backend

    assert protobuf_backend() == "python", protobuf_backend()
    protos, _, spans = corpus(traces)
    return _rate(lambda: [decode_request(data) for data in protos], spans, rounds)


def _through_worker(broker: str, protos: list[bytes], events: list, spans: int) -> None:
    import asyncio
    import tempfile
    import uuid

    import msgspec

    from benchmarks.bench_worker import PARTITIONS, preload
    from benchmarks.worker_process import Worker, WorkerFailed
    from stepstream.config import load_settings
    from stepstream.core import wire
    from stepstream.kafka.topics import ensure_topics

    def topics(otlp: str = "") -> str:
        raw = f"otlp-bench-{uuid.uuid4().hex[:6]}"
        settings = load_settings({"broker": broker, "topic": raw, "partitions": PARTITIONS, "otlp_topic": otlp}, environ={})
        asyncio.run(ensure_topics(settings))
        return raw

    seqs: dict = {}
    native = []
    for event in events:
        key = (event.company_id, event.run_id)
        seqs[key] = seqs.get(key, -1) + 1
        copy = msgspec.structs.replace(event, event_id="span:" + event.event_id[5:], seq=seqs[key])
        native.append((wire.partition_key(*key), wire.encode_event(copy)))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("otlp", "native"):
            otlp = f"otlp-in-{uuid.uuid4().hex[:6]}" if name == "otlp" else ""
            raw = topics(otlp)
            if otlp:
                asyncio.run(preload(broker, otlp, [(None, data) for data in protos]))  # type: ignore[misc]
            else:
                asyncio.run(preload(broker, raw, native))
            env = {"STEPSTREAM_OTLP_TOPIC": otlp, "STEPSTREAM_OTLP_COMPANY": "acme"} if otlp else {}
            worker = Worker(broker, raw, Path(tmp), name, steps_sink=f"sqlite:///{tmp}/{name}.db", partitions=PARTITIONS, env=env)
            try:
                worker.wait_up()
                results[name] = worker.measure(len(events), budget=60.0, timeout=400.0)
            except WorkerFailed as exc:
                print(f"worker ({name}): n/a: {exc}")
                return
            finally:
                worker.stop()
    per_span = len(events) / spans
    otlp_rate, native_rate = results["otlp"].rate / per_span, results["native"].rate / per_span
    print(f"worker from the OTLP topic:  {otlp_rate:>10,.0f} spans/s ({results['otlp'].rate:,.0f} events/s,"
          f" {results['otlp'].cpu_us_per_event:.0f} us CPU/event)")  # fmt: skip
    print(f"worker, same events native:  {native_rate:>10,.0f} spans/s ({results['native'].rate:,.0f} events/s,"
          f" {results['native'].cpu_us_per_event:.0f} us CPU/event)")  # fmt: skip
    print(f"OTLP / native (same events): {otlp_rate / native_rate:.2f};"
          f" OTLP spans/s / native events/s: {otlp_rate / results['native'].rate:.2f}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_otlp")
    parser.add_argument("--traces", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--broker", default=None, help="also measure stepstream worker from the OTLP topic")
    args = parser.parse_args(argv)

    from stepstream.core import wire
    from stepstream.otlp.decode import decode_request, protobuf_backend
    from stepstream.otlp.identity import IdentityPolicy
    from stepstream.otlp.trace import map_spans, runs_of

    protos, jsons, spans = corpus(args.traces)
    policy = IdentityPolicy(default_company="acme")
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    parse_rate = _rate(lambda: [ExportTraceServiceRequest.FromString(data) for data in protos], spans, args.rounds)
    proto_rate = _rate(lambda: [decode_request(data) for data in protos], spans, args.rounds)
    json_rate = _rate(lambda: [decode_request(data) for data in jsons], spans, args.rounds)
    python_rate = _python_backend_rate(args.traces, max(args.rounds - 1, 1))

    def bridge() -> None:
        for data in protos:
            map_spans(decode_request(data).spans, None, policy)

    bridge_rate = _rate(bridge, spans, args.rounds)
    events = [e for data in protos for e in map_spans(decode_request(data).spans, None, policy).events]
    native = [wire.encode_event(e) for run in runs_of(events).values() for e in run]
    native_rate = _rate(lambda: [wire.decode_event(data) for data in native], len(native), args.rounds)

    print(f"corpus: {spans} spans in {len(protos)} requests; {len(native)} wire events; protobuf backend {protobuf_backend()};"
          f" load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"parse only ({protobuf_backend()}, no spans):{parse_rate:>10,.0f} spans/s  {1e6 / parse_rate:6.1f} us/span")
    print(f"decode otlp_proto ({protobuf_backend()}):  {proto_rate:>10,.0f} spans/s  {1e6 / proto_rate:6.1f} us/span")
    if python_rate is not None:
        print(f"decode otlp_proto (python): {python_rate:>10,.0f} spans/s  {1e6 / python_rate:6.1f} us/span"
              f"  (upb is {proto_rate / python_rate:.1f}x)")  # fmt: skip
    print(f"decode otlp_json (msgspec): {json_rate:>10,.0f} spans/s  {1e6 / json_rate:6.1f} us/span"
          f"  ({json_rate / proto_rate:.2f}x proto)")  # fmt: skip
    print(f"decode+map otlp_proto:      {bridge_rate:>10,.0f} spans/s  {1e6 / bridge_rate:6.1f} us/span"
          f"  ({len(native) / spans:.2f} events/span)")  # fmt: skip
    print(f"native wire decode_event:   {native_rate:>10,.0f} events/s {1e6 / native_rate:6.1f} us/event"
          f"  (decode+map per event is {native_rate * len(native) / spans / bridge_rate:.1f}x native decode)")  # fmt: skip
    if args.broker:
        ordered = [e for run in runs_of(events).values() for e in run]
        _through_worker(args.broker, protos, ordered, spans)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
