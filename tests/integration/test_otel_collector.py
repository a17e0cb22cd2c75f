"""A real OpenTelemetry Collector in front of the OTLP topic, on the real broker.

The Collector is the one `deploy/otel/builder.yaml` describes (OTLP receiver, batch
processor, contrib kafkaexporter), built once from the Go module proxy by
``deploy/tools/tools.sh path otelcol`` (a build that fails fails this test, loudly). It
runs with ``deploy/otel/collector.yaml`` as shipped plus an overlay that fans the same
traces out to three topics, one per way the exporter writes them: ``otlp_proto`` batches
(no key), ``otlp_json`` batches, and ``otlp_proto`` with ``partition_traces_by_id`` (one
trace per message keyed by its hex id). The three instrumented agents of
``tests/unit/otlp_fixtures/record.py`` send their spans with the SDK's OTLP/HTTP
exporter to the Collector; for each topic a `stepstream worker` consumes it (company from
the ``stepstream-company`` header the Collector's ``record_headers`` set, no topic
default) and the rows in SQLite equal ``ingest-file`` of the mapping of the recorded
spans."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgspec
import pytest
import yaml
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from harness import Scenario, dump, first_difference, free_port, golden_dump, read_topic, wait_caught_up
from stepstream.otlp.decode import decode_request
from stepstream.otlp.identity import IdentityPolicy, header_company
from stepstream.otlp.trace import map_spans, runs_of

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "tests" / "unit" / "otlp_fixtures" / "record.py"
FAMILIES = ("genai", "openinference", "traceloop")
COMPANY = "initech"
PARTITIONS = 2
# encoding -> the overlay's exporter settings (the shipped `kafka` exporter is otlp_proto)
WAYS = {
    "otlp_proto": None,
    "otlp_json": {"traces": {"encoding": "otlp_json"}},
    "partition_traces_by_id": {"partition_traces_by_id": True},
}


def _otelcol() -> str:
    proc = subprocess.run([str(ROOT / "deploy" / "tools" / "tools.sh"), "path", "otelcol"], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"deploy/tools/tools.sh could not build the Collector:\n{proc.stderr[-4000:]}", pytrace=False)
    return proc.stdout.strip()


async def _topics(broker: str, names: list[str], delete: bool = False) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=broker, client_id="stepstream-tests")
    await admin.start()
    try:
        if delete:
            await admin.delete_topics(names)
            return
        response = await admin.create_topics([NewTopic(n, num_partitions=PARTITIONS, replication_factor=1) for n in names])
        errors = [e for e in response.topic_errors if e[1] != 0]
        assert not errors, errors
    finally:
        await admin.close()


def _overlay(topics: dict[str, str]) -> dict:
    """Beside the shipped pipeline (`kafka`, to the otlp_proto topic), one exporter and
    pipeline per other way, same receiver; the Collector's own metrics endpoint off (it
    would take port 8888)."""
    exporters, pipelines = {}, {}
    for way, settings in WAYS.items():
        if settings is None:
            continue
        exporter = {
            "brokers": ["${env:STEPSTREAM_KAFKA_BROKERS}"],
            "traces": {"topic": topics[way], **settings.get("traces", {})},
            "record_headers": [{"name": "stepstream-company", "value": "${env:STEPSTREAM_COMPANY}"}],
            "producer": {"required_acks": -1},
            **{k: v for k, v in settings.items() if k != "traces"},
        }
        exporters[f"kafka/{way}"] = exporter
        pipelines[f"traces/{way}"] = {"receivers": ["otlp"], "processors": ["batch"], "exporters": [f"kafka/{way}"]}
    return {"exporters": exporters, "service": {"pipelines": pipelines, "telemetry": {"metrics": {"level": "none"}}}}


def _die_with_parent() -> None:
    """In the Collector's process: SIGKILL it when the test process dies, even by SIGKILL
    (Linux's PR_SET_PDEATHSIG), so no run leaves a Collector behind."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def _wait_listening(port: int, proc: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the Collector exited with {proc.returncode}:\n{log.read_text()[-4000:]}", pytrace=False)
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    pytest.fail(f"the Collector did not listen on {port} in {timeout}s:\n{log.read_text()[-4000:]}", pytrace=False)


def _span_count(records) -> int:
    return sum(len(decode_request(r.value).spans) for r in records)


@pytest.fixture(scope="module")
def exported(kafka_bootstrap, tmp_path_factory):
    """Run the Collector, record the three agents through it, wait until every span is on
    every topic; the Collector is stopped (killed if it lingers) whatever happens."""
    binary = _otelcol()
    base = tmp_path_factory.mktemp("otelcol")
    tag = uuid.uuid4().hex[:12]
    topics = {way: f"stepstream.test.otelcol-{way.replace('_', '-')}.{tag}" for way in WAYS}
    asyncio.run(_topics(kafka_bootstrap, list(topics.values())))
    (base / "overlay.yaml").write_text(yaml.safe_dump(_overlay(topics)))
    http_port = free_port()
    env = {
        **os.environ,
        "STEPSTREAM_KAFKA_BROKERS": kafka_bootstrap,
        "STEPSTREAM_OTLP_TOPIC": topics["otlp_proto"],
        "STEPSTREAM_COMPANY": COMPANY,
        "OTLP_GRPC_ENDPOINT": f"127.0.0.1:{free_port()}",
        "OTLP_HTTP_ENDPOINT": f"127.0.0.1:{http_port}",
    }
    log = base / "otelcol.log"
    command = [binary, f"--config={ROOT / 'deploy' / 'otel' / 'collector.yaml'}", f"--config={base / 'overlay.yaml'}"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
    try:
        _wait_listening(http_port, proc, log)
        recorded = base / "recorded"
        recorded.mkdir()
        subprocess.run(
            [sys.executable, str(RECORD), "--out", str(recorded), "--otlp-http", f"http://127.0.0.1:{http_port}/v1/traces"],
            check=True,
        )
        requests = [(recorded / f"{family}.pb").read_bytes() for family in FAMILIES]
        spans = sum(len(decode_request(r).spans) for r in requests)
        records = {}
        deadline = time.monotonic() + 30
        for way, topic in topics.items():
            while True:
                got = asyncio.run(read_topic(kafka_bootstrap, topic))
                if _span_count(got) >= spans or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert _span_count(got) == spans, f"{way}: {_span_count(got)} of {spans} spans on {topic}\n{log.read_text()[-3000:]}"
            records[way] = got
        yield {"topics": topics, "records": records, "requests": requests}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        asyncio.run(_topics(kafka_bootstrap, list(topics.values()), delete=True))


def _golden(requests: list[bytes], base: Path) -> dict:
    """``ingest-file`` of the mapping of ``requests`` (each mapped on its own, in order, as
    the bridge does), as native events numbered in bridge order (test_otlp_worker.py's
    oracle)."""
    headers = [("stepstream-company", COMPANY.encode())]
    events = []
    for request in requests:
        mapped = map_spans(decode_request(request).spans, header_company(headers), IdentityPolicy())
        assert not mapped.rejected
        for run in runs_of(mapped.events).values():
            events.extend(run)
    seqs: dict = {}
    native = []
    for event in events:
        key = (event.company_id, event.run_id)
        seqs[key] = seqs.get(key, -1) + 1
        native.append(msgspec.structs.replace(event, event_id="span:" + event.event_id.removeprefix("otlp:"), seq=seqs[key]))
    data = asyncio.run(golden_dump(native, base, [COMPANY]))
    assert len(data) == len(FAMILIES)
    return json.loads(json.dumps(data).replace('"span:', '"otlp:'))


def _check_shape(way: str, records) -> None:
    """What the exporter wrote, as docs/otel.md says it does."""
    for r in records:
        assert dict(r.headers).get("stepstream-company") == COMPANY.encode(), r.headers
        first = r.value[:1]
        assert first == (b"{" if way == "otlp_json" else b"\x0a"), (way, r.value[:40])
        if way == "partition_traces_by_id":
            trace_ids = {s.trace_id for s in decode_request(r.value).spans}
            assert len(trace_ids) == 1 and r.key is not None
            assert r.key.decode() == next(iter(trace_ids)), (r.key, trace_ids)
        else:
            assert r.key is None



def _split_groups(requests: list[bytes]) -> int:
    """How many messages ``partition_traces_by_id`` makes of ``requests``: one per
    resource, instrumentation scope and trace (the exporter's batchpersignal.SplitTraces),
    so a trace whose spans come from two scopes is two messages with the same key."""
    groups = 0
    for raw in requests:
        request = ExportTraceServiceRequest.FromString(raw)
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                groups += len({span.trace_id for span in scope_spans.spans})
    return groups


def _span_ids(values) -> list[tuple[str, str]]:
    return sorted((span.trace_id, span.span_id) for value in values for span in decode_request(value).spans)


@pytest.fixture(scope="module")
def golden(exported, tmp_path_factory) -> dict:
    """Per way: the rows of the recorded requests, each one whole trace (what the Collector
    sends as a batch, ``otlp_proto`` or ``otlp_json``, whatever it merges), and for
    ``partition_traces_by_id`` the rows of the messages as the exporter split them (per
    scope: the ordering rule numbers a run's events in the order its messages arrive),
    after checking that the split holds exactly the recorded spans."""
    requests = exported["requests"]
    whole = _golden(requests, tmp_path_factory.mktemp("golden"))
    split = exported["records"]["partition_traces_by_id"]
    assert len(split) == _split_groups(requests) > len(FAMILIES)
    assert _span_ids(r.value for r in split) == _span_ids(requests)
    by_id = _golden([r.value for r in split], tmp_path_factory.mktemp("golden-split"))
    return {"otlp_proto": whole, "otlp_json": whole, "partition_traces_by_id": by_id}


@pytest.mark.parametrize("way", list(WAYS))
async def test_sdk_to_collector_to_worker_equals_the_mapping(way, exported, golden, kafka_bootstrap, tmp_path):
    topic = exported["topics"][way]
    _check_shape(way, exported["records"][way])
    scenario = Scenario(kafka_bootstrap, tmp_path, 2)
    await scenario.create_topics()
    try:
        worker = scenario.start_worker(name=way, STEPSTREAM_OTLP_TOPIC=topic)
        await asyncio.to_thread(worker.wait_web)
        for t in (topic, scenario.topic):
            await wait_caught_up(scenario.broker, scenario.group, t, [worker], timeout=120)
        assert worker.metric_sum("stepstream_otlp_total") > 0
        assert worker.stop(timeout=20) == 0, worker.tail()
    finally:
        scenario.stop_all()
    letters = await read_topic(scenario.broker, scenario.settings().dlq)
    assert letters == [], [dict(r.headers) for r in letters]
    got = await dump(scenario.steps_url, scenario.deep_url, [COMPANY])
    assert got == golden[way], first_difference(golden[way], got)
