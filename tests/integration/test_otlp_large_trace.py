"""A trace of 10,000 spans on the real broker, within the worker's memory bound
(docs/worker.md, "Memory"): once as one message carrying all its spans (otlp_proto, as a
Collector's batch of one trace), once split over 20 messages with the root last. The
spans are copies of the recorded golden fixtures' children (real bodies: messages, tool
arguments and results) under one root. The rows equal ``ingest-file`` of the mapping, and
the worker and its writer processes peak under 1 GiB together."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import msgspec
import pytest
from aiokafka import AIOKafkaProducer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from harness import Scenario, dump, first_difference, golden_dump, wait_caught_up
from stepstream.otlp.decode import decode_request
from stepstream.otlp.identity import IdentityPolicy
from stepstream.otlp.trace import map_spans, runs_of

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "unit" / "otlp_fixtures"
SPANS = 10_000
MESSAGE_BYTES = 16 * 1024 * 1024  # the OTLP topic's max.message.bytes here; the trace is ~8 MB
MEMORY_BOUND_MIB = 1024  # docs/worker.md, "Memory"
POLICY = IdentityPolicy(default_company="acme")


def _trace(family: str, trace_number: int) -> list:
    """(resource, scope, span) of one trace of SPANS spans: copies of the fixture's
    children in end order, then the root."""
    source = ExportTraceServiceRequest.FromString((FIXTURES / f"{family}.pb").read_bytes())
    trace_id = (0xA0 + trace_number).to_bytes(16, "big")
    pieces = [(rs.resource, ss.scope, span) for rs in source.resource_spans for ss in rs.scope_spans for span in ss.spans]
    (root,) = [p for p in pieces if not p[2].parent_span_id]
    children = [p for p in pieces if p[2].parent_span_id]
    out = []
    step = root[2].end_time_unix_nano - root[2].start_time_unix_nano
    for n in range(SPANS - 1):
        resource, scope, template = children[n % len(children)]
        span = type(template)()
        span.CopyFrom(template)
        span.trace_id = trace_id
        span.span_id = (n + 1).to_bytes(8, "big")
        span.parent_span_id = root[2].span_id
        shift = (n // len(children)) * step  # each round of the template's children after the last
        span.start_time_unix_nano += shift
        span.end_time_unix_nano += shift
        out.append((resource, scope, span))
    top = type(root[2])()
    top.CopyFrom(root[2])
    top.trace_id = trace_id
    top.end_time_unix_nano = max(p[2].end_time_unix_nano for p in out) + 1
    out.append((root[0], root[1], top))
    return out


def _request(pieces) -> bytes:
    """One export request, the spans of each resource and scope together (as the SDK's
    encoder and the Collector's batch processor group them)."""
    request = ExportTraceServiceRequest()
    groups: dict = {}
    for resource, scope, span in pieces:
        key = (id(resource), id(scope))
        if key not in groups:
            resource_spans = request.resource_spans.add()
            resource_spans.resource.CopyFrom(resource)
            groups[key] = resource_spans.scope_spans.add()
            groups[key].scope.CopyFrom(scope)
        groups[key].spans.add().CopyFrom(span)
    return request.SerializeToString()


@pytest.fixture(scope="module")
def messages() -> list[bytes]:
    whole = _request(_trace("genai", 1))  # one message carrying the whole trace
    split = _trace("openinference", 2)
    chunk = SPANS // 20
    return [whole] + [_request(split[i : i + chunk]) for i in range(0, SPANS, chunk)]


def _tree_hwm_mib(pid: int) -> float:
    """Peak RSS of ``pid`` plus each of its children (the SQLite writers), each its VmHWM."""
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        # A process that is exiting (a zombie) has no memory lines left: it adds nothing.
        hwm = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
        total += hwm / 1024
        todo.extend(int(c) for c in children)
    return total


@pytest.fixture
async def scenario(kafka_bootstrap, tmp_path, kafka_topic_factory):
    s = Scenario(kafka_bootstrap, tmp_path, 2)
    s.otlp_topic = await kafka_topic_factory(1, prefix="otlp", config={"max.message.bytes": str(MESSAGE_BYTES)})
    await s.create_topics()
    yield s
    s.stop_all()


async def test_a_trace_of_10000_spans_within_the_memory_bound(scenario, messages, tmp_path):
    assert 1_000_000 < len(messages[0]) < 8_388_608  # above the broker's default, below the worker's bound
    events = []
    for value in messages:
        mapped = map_spans(decode_request(value).spans, None, POLICY)
        assert not mapped.rejected
        for run in runs_of(mapped.events).values():
            events.extend(run)
    assert len({e.run_id for e in events}) == 2 and sum(1 for e in events if type(e).__name__ == "RunEnd") == 2
    seqs: dict = {}
    native = []
    for event in events:  # the oracle: native events numbered in bridge order (test_otlp_worker.py)
        key = (event.company_id, event.run_id)
        seqs[key] = seqs.get(key, -1) + 1
        native.append(msgspec.structs.replace(event, event_id="span:" + event.event_id.removeprefix("otlp:"), seq=seqs[key]))
    expected = json.loads(json.dumps(await golden_dump(native, tmp_path / "golden", ["acme"])).replace('"span:', '"otlp:'))

    producer = AIOKafkaProducer(bootstrap_servers=scenario.broker, acks="all", max_request_size=MESSAGE_BYTES)
    await producer.start()
    try:
        for value in messages:
            await producer.send_and_wait(scenario.otlp_topic, value, partition=0)
    finally:
        await producer.stop()
    worker = scenario.start_worker(name="w", STEPSTREAM_OTLP_TOPIC=scenario.otlp_topic, STEPSTREAM_OTLP_COMPANY="acme")
    peak = [0.0]
    done = threading.Event()

    def sample() -> None:  # the writers' VmHWM is gone once they exit: read it while they run
        while not done.wait(0.05):
            peak[0] = max(peak[0], _tree_hwm_mib(worker.proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        await asyncio.to_thread(worker.wait_web)
        await wait_caught_up(scenario.broker, scenario.group, scenario.otlp_topic, [worker], timeout=240)
        await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [worker], timeout=240)
        assert worker.metric_sum("stepstream_otlp_total") > 0
    finally:
        done.set()
        sampler.join()
    print(f"peak RSS of the worker and its writers: {peak[0]:.0f} MiB for {len(events)} events of {2 * SPANS} spans")
    assert 0 < peak[0] < MEMORY_BOUND_MIB, f"{peak[0]:.0f} MiB"
    assert worker.stop(timeout=20) == 0, worker.tail()
    got = await dump(scenario.steps_url, scenario.deep_url, ["acme"])
    assert got == expected, first_difference(expected, got)
    for data in got.values():  # the runs are truncated at the step cap, not lost
        assert data["run"]["status"] == "completed" and data["run"]["dropped_steps"] > 0
