"""``POST /v1/traces`` on the real broker: the SDK's OTLP/HTTP exporter -> the API (served
by uvicorn on a real port) -> the OTLP topic -> ``stepstream worker`` -> SQLite equals
``ingest-file`` of the mapping of the exported spans (test_otlp_worker.py's oracle).

The three instrumented agents of ``tests/unit/otlp_fixtures/record.py`` export with an
``acme`` token while their resource claims ``stepstream.company_id=globex`` and the worker
trusts resource companies: the token's header wins, every span lands in ``acme``. A
``globex`` token posting a request whose resource claims ``acme`` lands in ``globex``
only. No token and a token without the ``ingest`` scope are refused, and nothing of theirs
reaches the topic."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import msgspec
import pytest
import uvicorn
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from harness import Scenario, dump, first_difference, free_port, golden_dump, read_topic, wait_caught_up
from stepstream.api.app import create_app
from stepstream.api.ingest import Ingest, IngestLimits
from stepstream.api.kafka_log import KafkaEventLog
from stepstream.api.ratelimit import CompanyBuckets
from stepstream.api.tokens import TokenRegistry, add_token
from stepstream.kafka.connection import KafkaConnection
from stepstream.metrics import ApiMetrics, IngestMetrics
from stepstream.otlp.decode import decode_request
from stepstream.otlp.identity import IdentityPolicy, header_company
from stepstream.otlp.trace import map_spans, runs_of
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "tests" / "unit" / "otlp_fixtures" / "record.py"
FAMILIES = ("genai", "openinference", "traceloop")
TRUSTING = IdentityPolicy(trust_resource_company=True)  # the worker's policy here: the header still wins


class ServedApi:
    """The API with the ingest routes, on uvicorn in its own thread and loop."""

    def __init__(self, broker: str, raw_topic: str, otlp_topic: str, tokens: Path) -> None:
        self.port = free_port()
        metrics = ApiMetrics()
        ingest_metrics = IngestMetrics(metrics.registry)
        self.log = KafkaEventLog(KafkaConnection.plaintext(broker), raw_topic, ingest_metrics)
        ingest = Ingest(self.log, CompanyBuckets(0, 0), IngestLimits(), ingest_metrics, otlp_topic=otlp_topic)
        app = create_app(MemoryStepStore(), MemoryDeepStore(), TokenRegistry(tokens), metrics, ingest=ingest)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"))
        self.ready = threading.Event()
        self.failed: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def _run(self) -> None:
        async def main() -> None:
            await self.log.start()
            try:
                deadline = time.monotonic() + 30
                while not self.log.connected:
                    if time.monotonic() > deadline:
                        raise AssertionError("the ingest producer did not connect")
                    await asyncio.sleep(0.05)
                serving = asyncio.create_task(self.server.serve())
                while not self.server.started and not serving.done():
                    await asyncio.sleep(0.02)
                self.ready.set()
                await serving
            finally:
                await self.log.close()

        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self.failed = exc
            self.ready.set()

    def start(self) -> ServedApi:
        self.thread.start()
        self.ready.wait(60)
        if self.failed is not None or not self.server.started:
            raise AssertionError(f"the API did not start: {self.failed!r}")
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(20)


def _native(events: list) -> list:
    """The mapping's events as native ones numbered in bridge order (test_otlp_worker.py)."""
    seqs: dict = {}
    native = []
    for event in events:
        key = (event.company_id, event.run_id)
        seqs[key] = seqs.get(key, -1) + 1
        native.append(msgspec.structs.replace(event, event_id="span:" + event.event_id.removeprefix("otlp:"), seq=seqs[key]))
    return native


def _with_resource_company(raw: bytes, company: str) -> bytes:
    request = ExportTraceServiceRequest.FromString(raw)
    for resource_spans in request.resource_spans:
        for attribute in resource_spans.resource.attributes:
            if attribute.key == "stepstream.company_id":
                attribute.value.string_value = company
    return request.SerializeToString()


@pytest.fixture
async def scenario(kafka_bootstrap, tmp_path, kafka_topic_factory):
    s = Scenario(kafka_bootstrap, tmp_path, 2)
    s.otlp_topic = await kafka_topic_factory(2, prefix="otlp-http")
    await s.create_topics()
    yield s
    s.stop_all()


async def test_sdk_exporter_through_the_api_lands_in_the_tokens_company_only(scenario, tmp_path) -> None:
    tokens = tmp_path / "tokens.json"
    acme = add_token(tokens, "acme", ["ingest"], created="2026-12-01T12:00:00Z")[0]
    globex = add_token(tokens, "globex", ["ingest"], created="2026-12-01T12:00:00Z")[0]
    reader = add_token(tokens, "acme", ["steps:read"], created="2026-12-01T12:00:00Z")[0]
    api = ServedApi(scenario.broker, scenario.topic, scenario.otlp_topic, tokens)
    await asyncio.to_thread(api.start)
    worker = scenario.start_worker(name="w", STEPSTREAM_OTLP_TOPIC=scenario.otlp_topic, STEPSTREAM_OTLP_TRUST_RESOURCE_COMPANY="1")
    try:
        recorded = tmp_path / "recorded"
        recorded.mkdir()
        env = {
            **os.environ,
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"authorization=Bearer%20{acme}",
            "OTEL_RESOURCE_ATTRIBUTES": "stepstream.company_id=globex",
        }
        await asyncio.to_thread(
            subprocess.run, [sys.executable, str(RECORD), "--out", str(recorded), "--otlp-http", api.url], check=True, env=env
        )
        requests = [(recorded / f"{family}.pb").read_bytes() for family in FAMILIES]
        assert all(
            span.resource.get("stepstream.company_id") == "globex" for r in requests for span in decode_request(r).spans
        )
        # A globex token whose request claims acme; no token; a token without the ingest scope.
        forged = _with_resource_company(requests[0], "acme")
        async with httpx.AsyncClient() as client:
            proto = {"content-type": "application/x-protobuf"}
            got = await client.post(api.url, content=forged, headers={**proto, "authorization": f"Bearer {globex}"})
            assert got.status_code == 200, got.text
            assert (await client.post(api.url, content=forged, headers=proto)).status_code == 401
            got = await client.post(api.url, content=forged, headers={**proto, "authorization": f"Bearer {reader}"})
            assert got.status_code == 403

        on_topic = await read_topic(scenario.broker, scenario.otlp_topic)
        assert sorted(dict(r.headers)["stepstream-company"] for r in on_topic) == [b"acme"] * 3 + [b"globex"]
        assert sorted(r.value for r in on_topic) == sorted([*requests, forged])  # the bytes as exported

        await asyncio.to_thread(worker.wait_web)
        await wait_caught_up(scenario.broker, scenario.group, scenario.otlp_topic, [worker], timeout=120)
        await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [worker], timeout=120)
        assert worker.stop(timeout=20) == 0, worker.tail()
    finally:
        api.stop()

    events = []
    by_company = {b"acme": [], b"globex": []}
    for record in on_topic:
        by_company[dict(record.headers)["stepstream-company"]].append(record)
    for record in [*by_company[b"acme"], *by_company[b"globex"]]:
        mapped = map_spans(decode_request(record.value).spans, header_company(record.headers), TRUSTING)
        assert not mapped.rejected
        for run in runs_of(mapped.events).values():
            events.extend(run)
    assert {e.company_id for e in events} == {"acme", "globex"}
    companies = ["acme", "globex"]
    (tmp_path / "golden").mkdir()
    expected = await golden_dump(_native(events), tmp_path / "golden", companies)
    expected = json.loads(json.dumps(expected).replace('"span:', '"otlp:'))
    got = await dump(scenario.steps_url, scenario.deep_url, companies)
    assert got == expected, first_difference(expected, got)
    letters = await read_topic(scenario.broker, scenario.settings().dlq)
    assert letters == []
