"""OTLP decode and mapping, side by side in one run, over two corpora.

    python -m benchmarks.bench_otlp [--traces N] [--agent-traces N] [--rounds R] [--broker HOST:PORT]

Two corpora of export requests, each column of the report:

* ``fixtures``: the golden fixtures (tests/unit/otlp_fixtures: the three convention
  families, each trace copied with fresh trace ids, about 5 spans a trace), 50 traces
  (250 spans) per request as a Collector's batch holds them;
* ``agent``: agent traces of the same conventions, one root agent span, 10 inference
  spans and 10 tool spans a trace (copies of the fixtures' spans, their messages, tool
  arguments and results grown to a few hundred bytes: :func:`agent_corpus`), 12 traces
  (252 spans) per request.

Measured, spans per second of one core (best of ``--rounds``, process CPU time):

* decode alone: ``otlp_proto`` on the installed protobuf backend (upb), ``otlp_proto`` on
  the pure-Python backend (a subprocess with ``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python``,
  for the ratio; fixtures only), ``otlp_json``;
* decode + identity + mapping to checked wire events, numbered per run, as bytes (what
  the bridge stage computes per span), beside ``wire.decode_event`` of native events of
  the same runs (per event);
* with ``--broker``: ``stepstream worker`` into SQLite from the OTLP topic (``otlp_proto``
  batches; the worker bridges them to its raw topic and folds them), beside the same
  worker over the same events pre-loaded on the raw topic as native events (numbered,
  ``span:`` ids): spans/s, events/s and the ratios.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "unit" / "otlp_fixtures"
FAMILIES = ("genai", "openinference", "traceloop")


def corpus(traces: int, per_request: int = 50) -> tuple[list[bytes], list[bytes], int]:
    """``(proto requests, json requests, spans)``: the golden fixtures, each trace copied
    with a fresh trace id (about 5 spans a trace)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    sources = _fixtures()
    requests: list[Any] = []
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
            requests.append(request)
            request = ExportTraceServiceRequest()
    return [r.SerializeToString() for r in requests], [_collector_json(r) for r in requests], spans


# The agent corpus: the fixtures' texts grown to a few hundred bytes (plain words, so
# each stays valid at every level of JSON quoting the conventions use).
_FILLER = (
    "considering the forecast models, the recent observations from nearby stations, the humidity, the wind "
    "from the south west, the pressure trend over the last twelve hours and the chance of rain this evening"
)
_GROWN = {
    "You are a weather assistant.": f"You are a weather assistant. Answer briefly, {_FILLER}, and cite the station.",
    "What is the weather in Paris?": f"What is the weather in Paris? Please take into account {_FILLER}.",
    "It is 18 degrees and sunny in Paris.": f"It is 18 degrees and sunny in Paris, {_FILLER}.",
    "sunny": f"sunny, {_FILLER}",
    "The user wants the weather; I should call get_weather for Paris.":
        f"The user wants the weather; I should call get_weather for Paris, {_FILLER}.",
    "account lookup denied": f"account lookup denied, {_FILLER}",
}
_GROWN_PATTERN = re.compile("|".join(re.escape(short) for short in sorted(_GROWN, key=len, reverse=True)))
AGENT_LLM_SPANS = 10
AGENT_TOOL_SPANS = 10


def agent_corpus(traces: int, per_request: int = 12) -> tuple[list[bytes], list[bytes], int]:
    """``(proto requests, json requests, spans)``: agent traces as an agent loop makes them,
    one root agent span, ``AGENT_LLM_SPANS`` inference spans and ``AGENT_TOOL_SPANS`` tool
    spans (one of them failed) a trace, 12 traces (252 spans) a request. Every span is a
    copy of a fixture span of its family (so of its conventions: attributes, messages,
    usage, tool arguments and results), its texts grown by ``_GROWN``, with fresh ids,
    times one after the other and distinct tool call ids."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans

    from stepstream.otlp.decode import decode_request
    from stepstream.otlp.mapping import classify

    templates = []
    for source in _fixtures():
        kinds = iter(classify(span) for span in decode_request(source.SerializeToString()).spans)
        found: dict[str, list[tuple[Any, Any]]] = {"root": [], "llm": [], "tool": [], "failed": []}
        for resource_spans in source.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    kind = next(kinds)
                    if not span.parent_span_id:
                        kind = "root"
                    elif kind == "tool" and span.status.code == 2:
                        kind = "failed"
                    if kind in found:
                        found[kind].append((scope_spans.scope, _grown(span)))
        templates.append((source.resource_spans[0].resource, found))

    requests: list[Any] = []
    spans = 0
    request = ExportTraceServiceRequest()
    for n in range(traces):
        resource, found = templates[n % len(templates)]
        trace_id = (n + 1).to_bytes(16, "big")
        root_scope, root = found["root"][0]
        shape = [found["llm"][i % len(found["llm"])] for i in range(AGENT_LLM_SPANS)]
        shape += [found["tool"][0]] * (AGENT_TOOL_SPANS - 1) + [found["failed"][0]]
        resource_spans = request.resource_spans.add()
        resource_spans.resource.CopyFrom(resource)
        scopes: dict[str, ScopeSpans] = {}
        start = 1_764_633_600_000_000_000 + n * 1_000_000_000
        copies = [(root_scope, root, 0)] + [(scope, span, i + 1) for i, (scope, span) in enumerate(shape)]
        for scope, template, index in copies:
            if scope.name not in scopes:
                scopes[scope.name] = resource_spans.scope_spans.add()
                scopes[scope.name].scope.CopyFrom(scope)
            span = scopes[scope.name].spans.add()
            span.CopyFrom(template)
            span.trace_id = trace_id
            span.span_id = (n * 64 + index + 1).to_bytes(8, "big")
            if index:
                span.parent_span_id = (n * 64 + 1).to_bytes(8, "big")
                span.start_time_unix_nano = start + index * 20_000_000
                span.end_time_unix_nano = span.start_time_unix_nano + 15_000_000
            else:
                span.start_time_unix_nano = start
                span.end_time_unix_nano = start + (len(copies) + 1) * 20_000_000
            for attribute in span.attributes:
                if attribute.key in ("gen_ai.tool.call.id", "tool_call.id"):
                    attribute.value.string_value = f"call_{n}_{index}"
            spans += 1
        if (n + 1) % per_request == 0 or n == traces - 1:
            requests.append(request)
            request = ExportTraceServiceRequest()
    return [r.SerializeToString() for r in requests], [_collector_json(r) for r in requests], spans


def _grown(span: Any) -> Any:
    copy = type(span)()
    copy.CopyFrom(span)
    for attributes in [copy.attributes, *(event.attributes for event in copy.events)]:
        for attribute in attributes:
            if attribute.value.WhichOneof("value") == "string_value":
                attribute.value.string_value = _GROWN_PATTERN.sub(lambda m: _GROWN[m.group()], attribute.value.string_value)
    return copy


def _fixtures() -> list[Any]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    return [ExportTraceServiceRequest.FromString((FIXTURES / f"{f}.pb").read_bytes()) for f in FAMILIES]


def _collector_json(request: Any) -> bytes:
    """``otlp_json`` as the Collector's marshaler writes it: hex ids, integer enums."""
    import base64
    import json

    from google.protobuf.json_format import MessageToDict

    document = MessageToDict(request, use_integers_for_enums=True)
    for rs in document.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for field in ("traceId", "spanId", "parentSpanId"):
                    if field in span:
                        span[field] = base64.b64decode(span[field]).hex()
    return json.dumps(document).encode()


def _rate(work, items: int, rounds: int) -> float:
    """Items per second of CPU, best of ``rounds``. What is alive before (the corpora,
    the other measurements' events) is frozen out of the garbage collector's sight, so
    each measurement pays only for its own objects, as a worker would."""
    best = float("inf")
    for _ in range(rounds):
        gc.collect()
        gc.freeze()
        try:
            start = time.process_time()
            work()
            best = min(best, time.process_time() - start)
        finally:
            gc.unfreeze()
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


def _through_worker(broker: str, protos: list[bytes], events: list, spans: int) -> dict[str, Any] | None:
    """The worker from the OTLP topic and over the same events native (module docstring);
    ``None`` when a worker failed (printed)."""
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
                return None
            finally:
                worker.stop()
    per_span = len(events) / spans
    otlp, native_run = results["otlp"], results["native"]
    return {
        "otlp_spans": otlp.rate / per_span, "otlp_events": otlp.rate, "otlp_cpu": otlp.cpu_us_per_event * per_span,
        "native_events": native_run.rate, "native_cpu": native_run.cpu_us_per_event,
    }


def _bridge_bytes(mapped: Any) -> list[bytes]:
    """The raw topic's bytes of one request, as the bridge makes them (``encoded_runs``;
    encoding ``runs_of`` in a tree from before it, for a before/after)."""
    from stepstream.core import wire
    from stepstream.otlp import trace

    if hasattr(trace, "encoded_runs"):
        return [data for run in trace.encoded_runs(mapped).values() for data in run]
    return [wire.encode_event(event) for run in trace.runs_of(mapped.events).values() for event in run]


def _in_process(protos: list[bytes], jsons: list[bytes], spans: int, rounds: int) -> tuple[dict[str, float], list]:
    """Decode and mapping rates of one corpus (spans/s, native events/s), and its events
    in run order."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from stepstream.core import wire
    from stepstream.otlp.decode import decode_request
    from stepstream.otlp.identity import IdentityPolicy
    from stepstream.otlp.trace import map_spans, runs_of

    policy = IdentityPolicy(default_company="acme")

    def bridge() -> None:
        for data in protos:
            _bridge_bytes(map_spans(decode_request(data).spans, None, policy))

    events = [e for data in protos for e in map_spans(decode_request(data).spans, None, policy).events]
    ordered = [e for run in runs_of(events).values() for e in run]
    native = [wire.encode_event(e) for e in ordered]
    rates = {
        "parse": _rate(lambda: [ExportTraceServiceRequest.FromString(data) for data in protos], spans, rounds),
        "proto": _rate(lambda: [decode_request(data) for data in protos], spans, rounds),
        "json": _rate(lambda: [decode_request(data) for data in jsons], spans, rounds),
        "bridge": _rate(bridge, spans, rounds),
        "native": _rate(lambda: [wire.decode_event(data) for data in native], len(native), rounds),
        "events_per_span": len(native) / spans,
        "spans": spans,
        "requests": len(protos),
        "bytes_per_span": sum(map(len, protos)) / spans,
    }
    return rates, ordered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_otlp")
    parser.add_argument("--traces", type=int, default=2000, help="traces of the fixtures corpus (about 5 spans each)")
    parser.add_argument("--agent-traces", type=int, default=500, help="traces of the agent corpus (21 spans each)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--broker", default=None, help="also measure stepstream worker from the OTLP topic")
    parser.add_argument("--no-python-backend", action="store_true", help="skip the pure-Python protobuf decode")
    parser.add_argument("--only", choices=("fixtures", "agent"), default=None, help="measure one corpus")
    args = parser.parse_args(argv)

    from stepstream.otlp.decode import protobuf_backend

    backend = protobuf_backend()
    builders = {"fixtures": lambda: corpus(args.traces), "agent": lambda: agent_corpus(args.agent_traces)}
    corpora = {name: build() for name, build in builders.items() if args.only in (None, name)}
    measured = {name: _in_process(*built, args.rounds) for name, built in corpora.items()}
    python_rate = None if args.no_python_backend else _python_backend_rate(args.traces, max(args.rounds - 1, 1))

    names = list(corpora)
    print(f"protobuf backend {backend}; load average {os.getloadavg()[0]:.1f}; best of {args.rounds} rounds, CPU time of one core")
    print(f"{'':34}" + "".join(f"{name:>26}" for name in names))

    def row(label: str, cells: list[str]) -> None:
        print(f"{label:34}" + "".join(f"{cell:>26}" for cell in cells))

    row("corpus", [f"{m['spans']:,} spans, {m['requests']} requests" for m in (r for r, _ in measured.values())])
    row("wire events per span", [f"{r['events_per_span']:.2f}" for r, _ in measured.values()])
    row("otlp_proto bytes per span", [f"{r['bytes_per_span']:,.0f}" for r, _ in measured.values()])
    for key, label in (("parse", f"parse only ({backend})"), ("proto", f"decode otlp_proto ({backend})"),
                       ("json", "decode otlp_json (msgspec)"), ("bridge", "decode+map+encode otlp_proto")):  # fmt: skip
        row(label, [f"{r[key]:,.0f} spans/s {1e6 / r[key]:5.1f} us" for r, _ in measured.values()])
    row("native wire decode_event", [f"{r['native']:,.0f} ev/s {1e6 / r['native']:5.1f} us" for r, _ in measured.values()])
    if python_rate is not None and "fixtures" in measured:
        fixtures = measured["fixtures"][0]
        print(f"decode otlp_proto (python backend, fixtures): {python_rate:,.0f} spans/s {1e6 / python_rate:.1f} us/span"
              f" (upb is {fixtures['proto'] / python_rate:.1f}x)")  # fmt: skip
    if args.broker:
        worker = {name: _through_worker(args.broker, corpora[name][0], measured[name][1], corpora[name][2]) for name in names}
        if any(w is None for w in worker.values()):
            return 1
        ws = [worker[name] for name in names]
        row("worker from the OTLP topic", [f"{w['otlp_spans']:,.0f} spans/s" for w in ws])
        row("  (its events, CPU per span)", [f"{w['otlp_events']:,.0f} ev/s {w['otlp_cpu']:.0f} us" for w in ws])
        row("worker, same events native", [f"{w['native_events']:,.0f} ev/s {w['native_cpu']:.0f} us/ev" for w in ws])
        row("OTLP spans/s / native ev/s", [f"{w['otlp_spans'] / w['native_events']:.2f}" for w in ws])
        row("OTLP ev/s / native ev/s", [f"{w['otlp_events'] / w['native_events']:.2f}" for w in ws])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
