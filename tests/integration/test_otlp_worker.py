"""OpenTelemetry in, on the real broker: export requests produced to the OTLP topic as
the Collector's Kafka exporter writes them (``otlp_proto`` batches without a key,
``otlp_json`` per trace keyed by the hex trace id as ``partition_traces_by_id`` does, and
single spans, leaves first and root last, with redeliveries), bridged by `stepstream
worker` to the raw topic and folded into SQLite: the rows equal ``ingest-file`` of the
mapping, also after SIGKILLs at random instants."""

from __future__ import annotations

import asyncio
import base64
import json
import random
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from aiokafka import AIOKafkaProducer
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from harness import KILLED_SESSION, Scenario, dump, first_difference, golden_dump, read_topic, wait_caught_up
from stepstream.otlp.decode import decode_request
from stepstream.otlp.identity import IdentityPolicy, header_company
from stepstream.otlp.trace import map_spans, runs_of

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "unit" / "otlp_fixtures"
FAMILIES = ("genai", "openinference", "traceloop")
OTLP_PARTITIONS = 2
COPIES = 8  # traces per family
POLICY = IdentityPolicy(default_company="acme")


def _json(request: ExportTraceServiceRequest) -> bytes:
    """The request as the Collector's otlp_json marshaler writes it (hex ids, integer enums)."""
    document = MessageToDict(request, use_integers_for_enums=True)
    for resource_spans in document.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for field in ("traceId", "spanId", "parentSpanId"):
                    if field in span:
                        span[field] = base64.b64decode(span[field]).hex()
    return json.dumps(document).encode()


def _request(pieces) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    for resource, scope, span in pieces:
        resource_spans = request.resource_spans.add()
        resource_spans.resource.CopyFrom(resource)
        scope_spans = resource_spans.scope_spans.add()
        scope_spans.scope.CopyFrom(scope)
        scope_spans.spans.add().CopyFrom(span)
    return request


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> list[ExportTraceServiceRequest]:
    """One trace per family, recorded now by the real libraries through the SDK's OTLP
    encoder (tests/unit/otlp_fixtures/record.py)."""
    out = tmp_path_factory.mktemp("recorded")
    subprocess.run([sys.executable, str(FIXTURES / "record.py"), "--out", str(out)], check=True)
    return [ExportTraceServiceRequest.FromString((out / f"{family}.pb").read_bytes()) for family in FAMILIES]


@pytest.fixture(scope="module")
def messages(recorded):
    """``(partition, key, headers, value)`` in produce order, and the OTLP-level extras."""
    rng = random.Random(23)
    traces = []  # per trace: its (resource, scope, span) in end order (root last)
    for n in range(COPIES * len(FAMILIES)):
        source = recorded[n % len(FAMILIES)]
        trace_id = (n + 1).to_bytes(16, "big")
        pieces = []
        for resource_spans in source.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    copy = type(span)()
                    copy.CopyFrom(span)
                    copy.trace_id = trace_id
                    pieces.append((resource_spans.resource, scope_spans.scope, copy))
        pieces.sort(key=lambda piece: (piece[2].end_time_unix_nano, not piece[2].parent_span_id))
        traces.append(pieces)
    out = []
    batch: list = []
    for n, pieces in enumerate(traces):
        trace_hex = pieces[0][2].trace_id.hex()
        partition = n % OTLP_PARTITIONS
        mode = n % 3
        if mode == 0:  # otlp_proto, several traces per batch, no key
            batch.extend(pieces)
            if len(batch) >= 3 * len(pieces):
                out.append((partition, None, [], _request(batch).SerializeToString()))
                batch = []
        elif mode == 1:  # otlp_json, one trace per message keyed by its hex id
            headers = [("stepstream-company", b"globex")] if n % 4 == 1 else []
            out.append((partition, trace_hex.encode(), headers, _json(_request(pieces))))
        else:  # single spans, leaves first, root last; a redelivery of one of them later
            for piece in pieces:
                out.append((partition, trace_hex.encode(), [], _request([piece]).SerializeToString()))
            again = rng.randrange(len(pieces))
            out.append((partition, trace_hex.encode(), [], _request([pieces[again]]).SerializeToString()))
    if batch:
        out.append((0, None, [], _request(batch).SerializeToString()))
    # A Collector retry of a whole batch, and bad input (counted, dead-lettered, never wedging).
    first_batch = next(m for m in out if m[1] is None)
    out.append(first_batch)
    out.append((1, None, [], b"\x0a\xff\xffnot protobuf"))
    bad_span = _request([traces[0][0]])
    bad_span.resource_spans[0].scope_spans[0].spans[0].trace_id = b""
    out.append((0, None, [], bad_span.SerializeToString()))
    return out


def _expected_events(messages) -> list:
    """The events the bridge makes, per OTLP partition in offset order (what the raw
    topic holds, duplicates included: the fold skips them)."""
    events = []
    for partition in range(OTLP_PARTITIONS):
        for p, _key, headers, value in messages:
            if p != partition:
                continue
            try:
                decoded = decode_request(value)
            except Exception:  # noqa: BLE001 - the bad message: dead-lettered
                continue
            mapped = map_spans(decoded.spans, header_company(headers), POLICY)
            for run in runs_of(mapped.events).values():
                events.extend(run)
    seen, unique = set(), []
    for event in events:  # ingest-file folds them too; a duplicate there is skipped the same way
        if event.event_id not in seen:
            seen.add(event.event_id)
            unique.append(event)
    return unique


@pytest.fixture(scope="module")
def golden(messages, tmp_path_factory):
    """``ingest-file`` of the mapping as *native* events: each run's events numbered 0, 1,
    ... in bridge order under ids without the ``otlp:`` prefix, so the oracle does not
    lean on the fold's rule for unsequenced events (ids put back for the comparison)."""
    events = _expected_events(messages)
    companies = sorted({e.company_id for e in events})
    assert companies == ["acme", "globex"]
    seqs: dict = {}
    native = []
    for event in events:
        key = (event.company_id, event.run_id)
        seqs[key] = seqs.get(key, -1) + 1
        native.append(msgspec.structs.replace(event, event_id="span:" + event.event_id.removeprefix("otlp:"), seq=seqs[key]))
    data = asyncio.run(golden_dump(native, tmp_path_factory.mktemp("golden"), companies))
    assert len(data) == COPIES * len(FAMILIES)
    return json.loads(json.dumps(data).replace('"span:', '"otlp:')), companies


async def _produce(broker: str, topic: str, messages) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all", max_request_size=16 * 1024 * 1024)
    await producer.start()
    try:
        for partition, key, headers, value in messages:
            await producer.send_and_wait(topic, value, key=key, partition=partition, headers=headers)
    finally:
        await producer.stop()


@pytest.fixture
async def scenario(kafka_bootstrap, tmp_path, kafka_topic_factory):
    s = Scenario(kafka_bootstrap, tmp_path, 2)
    s.otlp_topic = await kafka_topic_factory(OTLP_PARTITIONS, prefix="otlp")
    await s.create_topics()
    yield s
    s.stop_all()


def _worker(scenario, name: str, **env: str):
    return scenario.start_worker(
        name=name, STEPSTREAM_OTLP_TOPIC=scenario.otlp_topic, STEPSTREAM_OTLP_COMPANY="acme", **env
    )


async def _caught_up(scenario, worker, timeout: float = 180.0) -> None:
    await wait_caught_up(scenario.broker, scenario.group, scenario.otlp_topic, [worker], timeout=timeout)
    await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [worker], timeout=timeout)


async def test_otlp_topic_through_the_worker_equals_the_mapping(scenario, messages, golden):
    expected, companies = golden
    worker = _worker(scenario, "w")
    await _produce(scenario.broker, scenario.otlp_topic, messages)
    await asyncio.to_thread(worker.wait_web)
    await _caught_up(scenario, worker)
    spans = worker.metric_sum("stepstream_otlp_total")
    assert spans > 0
    assert worker.stop(timeout=20) == 0, worker.tail()
    got = await dump(scenario.steps_url, scenario.deep_url, companies)
    assert got == expected, first_difference(expected, got)
    letters = await read_topic(scenario.broker, scenario.settings().dlq)
    reasons = sorted(dict(r.headers)["stepstream-reason"].decode() for r in letters)
    assert reasons == ["bad_otlp", "no_trace_id"]
    bad = next(r for r in letters if dict(r.headers)["stepstream-reason"] == b"bad_otlp")
    assert bad.value == b"\x0a\xff\xffnot protobuf"  # the original bytes
    assert dict(bad.headers)["stepstream-source"].decode().startswith(scenario.otlp_topic + "/")


async def test_sigkill_mid_trace_converges(scenario, messages, golden):
    expected, companies = golden
    rng = random.Random(7)
    chunk = len(messages) // 6 + 1
    kills = 0
    worker = _worker(scenario, "k0", **KILLED_SESSION)
    for i in range(0, len(messages), chunk):
        await _produce(scenario.broker, scenario.otlp_topic, messages[i : i + chunk])
        await asyncio.to_thread(worker.wait_web)  # up: the kill lands while it bridges and folds
        await asyncio.sleep(rng.uniform(0.2, 2.0))
        worker.kill()
        kills += 1
        worker = _worker(scenario, f"k{kills}", **KILLED_SESSION)
    await _caught_up(scenario, worker, timeout=240)
    worker.stop()
    assert kills >= 5
    # Some kills landed after the bridge produced and before its offsets were committed:
    # the raw topic holds duplicates the fold skipped (without them this test proves little).
    raw = await read_topic(scenario.broker, scenario.topic)
    assert len(raw) > len({r.value for r in raw}), "no kill re-bridged a record"
    got = await dump(scenario.steps_url, scenario.deep_url, companies)
    assert got == expected, first_difference(expected, got)
