"""``POST /v1/traces`` (api/otlp_http.py, api/otlp_body.py) over an in-memory event log:
decoding, bounds, the OTLP answers, the company header, refusals producing nothing."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from stepstream.api.app import create_app
from stepstream.api.event_log import MemoryEventLog
from stepstream.api.ingest import Ingest, IngestLimits
from stepstream.api.otlp_body import JSON, PROTOBUF, BodyRefused, inflate, read_request, response
from stepstream.api.ratelimit import CompanyBuckets
from stepstream.api.tokens import TokenRegistry, add_token
from stepstream.metrics import ApiMetrics, IngestMetrics
from stepstream.otlp.decode import decode_request
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore

FIXTURES = Path(__file__).resolve().parent / "otlp_fixtures"
TOPIC = "stepstream.otlp.test"


def _proto(name: str = "genai") -> bytes:
    return (FIXTURES / f"{name}.pb").read_bytes()


def _json_body(name: str = "genai") -> bytes:
    return (FIXTURES / f"{name}.json").read_bytes()


class Env:
    def __init__(self, tmp: Path, *, limits: IngestLimits | None = None, rate: float = 0, burst: int = 0, topic: str = TOPIC) -> None:
        tokens = tmp / "tokens.json"
        self.acme = add_token(tokens, "acme", ["ingest"], created="2026-12-01T12:00:00Z")[0]
        self.globex = add_token(tokens, "globex", ["ingest"], created="2026-12-01T12:00:00Z")[0]
        self.reader = add_token(tokens, "acme", ["steps:read"], created="2026-12-01T12:00:00Z")[0]
        self.log = MemoryEventLog()
        metrics = ApiMetrics()
        self.metrics = metrics
        ingest = Ingest(self.log, CompanyBuckets(rate, burst), limits or IngestLimits(), IngestMetrics(metrics.registry), otlp_topic=topic)
        app = create_app(MemoryStepStore(), MemoryDeepStore(), TokenRegistry(tokens), metrics, ingest=ingest)
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api.test")

    async def post(self, body: bytes, token: str | None, media: str = PROTOBUF, **headers: str) -> httpx.Response:
        all_headers = {"content-type": media, **{k.replace("_", "-"): v for k, v in headers.items()}}
        if token is not None:
            all_headers["authorization"] = f"Bearer {token}"
        return await self.client.post("/v1/traces", content=body, headers=all_headers)


@pytest.fixture
async def env(tmp_path):
    e = Env(tmp_path)
    yield e
    await e.client.aclose()


async def test_protobuf_is_produced_as_received_with_the_tokens_company(env) -> None:
    body = _proto()
    got = await env.post(body, env.acme)
    assert got.status_code == 200, got.text
    assert got.headers["content-type"].startswith(PROTOBUF)
    assert ExportTraceServiceResponse.FromString(got.content) == ExportTraceServiceResponse()
    assert env.log.sent == [(TOPIC, (("stepstream-company", b"acme"),), (None, body))]
    assert env.log.records == []  # nothing on the raw topic


async def test_json_and_gzip_answer_in_the_requests_encoding(env) -> None:
    body = _json_body("openinference")
    got = await env.post(gzip.compress(body), env.globex, JSON, content_encoding="gzip")
    assert got.status_code == 200, got.text
    assert got.headers["content-type"].startswith(JSON)
    assert got.json() == {}
    assert env.log.sent == [(TOPIC, (("stepstream-company", b"globex"),), (None, body))]


async def test_the_resource_company_never_overrides_the_token(env) -> None:
    request = ExportTraceServiceRequest.FromString(_proto())
    attribute = request.resource_spans[0].resource.attributes.add()
    attribute.key = "stepstream.company_id"
    attribute.value.string_value = "globex"
    got = await env.post(request.SerializeToString(), env.acme)
    assert got.status_code == 200
    [(_, headers, _)] = env.log.sent
    assert headers == (("stepstream-company", b"acme"),)


async def test_spans_without_ids_are_a_partial_success_in_both_encodings(env) -> None:
    request = ExportTraceServiceRequest.FromString(_proto())
    spans = request.resource_spans[0].scope_spans[0].spans
    spans[0].trace_id = b""
    total = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
    got = await env.post(request.SerializeToString(), env.acme)
    assert got.status_code == 200
    answer = ExportTraceServiceResponse.FromString(got.content)
    assert answer.partial_success.rejected_spans == 1
    assert "trace" in answer.partial_success.error_message
    assert len(decode_request(env.log.sent[0][2][1]).spans) == total - 1
    as_json = json.loads(_json_body())
    as_json["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] = ""
    got = await env.post(json.dumps(as_json).encode(), env.acme, JSON)
    assert got.status_code == 200
    assert got.json()["partialSuccess"]["rejectedSpans"] == 1


@pytest.mark.parametrize(
    ("case", "status"),
    [("none", 401), ("reader", 403), ("bad", 401)],
)
async def test_no_token_or_wrong_scope_is_refused_and_nothing_produced(env, case, status) -> None:
    token = {"none": None, "reader": env.reader, "bad": "sst_0123456789ab_" + "A" * 43}[case]
    got = await env.post(_proto(), token)
    assert got.status_code == status
    assert env.log.sent == []


@pytest.mark.parametrize(
    ("body", "media", "headers", "status"),
    [
        (b"\x0a\xff\xffnot protobuf", PROTOBUF, {}, 400),
        (b"{not json", JSON, {}, 400),
        (_json_body(), PROTOBUF, {}, 400),  # JSON bytes declared protobuf: the worker would read JSON
        (_proto(), JSON, {}, 400),
        (b"\x1f\x8b garbage", PROTOBUF, {"content_encoding": "gzip"}, 400),
        (gzip.compress(_proto())[:-12], PROTOBUF, {"content_encoding": "gzip"}, 400),  # truncated
        (_proto(), PROTOBUF, {"content_encoding": "br"}, 415),
        (_proto(), "text/plain", {}, 415),
    ],
)
async def test_undecodable_bodies_are_refused_before_producing(env, body, media, headers, status) -> None:
    got = await env.post(body, env.acme, media, **headers)
    assert got.status_code == status, got.text
    assert got.headers["content-type"] == "application/problem+json"
    assert env.log.sent == []


async def test_an_empty_request_is_a_success_that_produces_nothing(env) -> None:
    got = await env.post(b"", env.acme)
    assert got.status_code == 200 and got.content == b""
    assert (await env.post(b"{}", env.acme, JSON)).json() == {}
    assert env.log.sent == []


async def test_bounds_inflated_size_spans_and_the_bucket(tmp_path) -> None:
    body = _proto()
    spans = len(decode_request(body).spans)
    e = Env(tmp_path, limits=IngestLimits(max_events=spans - 1), rate=1e-9, burst=spans)
    try:
        assert (await e.post(body, e.acme)).status_code == 413  # too many spans
        bomb = gzip.compress(b"\x00" * (IngestLimits().max_event_bytes + 1))
        assert (await e.post(bomb, e.acme, content_encoding="gzip")).status_code == 413
        assert e.log.sent == []
    finally:
        await e.client.aclose()
    e = Env(tmp_path / "b", rate=1e-9, burst=spans)
    try:
        assert (await e.post(body, e.acme)).status_code == 200
        got = await e.post(body, e.acme)
        assert got.status_code == 429 and "retry-after" in got.headers
        assert (await e.post(body, e.globex)).status_code == 200  # per company
    finally:
        await e.client.aclose()


async def test_the_broker_away_is_503_with_retry_after(env) -> None:
    env.log.unavailable = True
    got = await env.post(_proto(), env.acme)
    assert got.status_code == 503 and got.headers["retry-after"]


async def test_without_an_otlp_topic_the_route_is_not_mounted(tmp_path) -> None:
    e = Env(tmp_path, topic="")
    try:
        assert (await e.post(_proto(), e.acme)).status_code == 404
    finally:
        await e.client.aclose()


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=4096), st.integers(min_value=1, max_value=8192))
def test_inflate_never_returns_more_than_the_bound(data, bound) -> None:
    packed = gzip.compress(data)
    try:
        out = inflate(packed, "gzip", bound)
    except BodyRefused as exc:
        assert exc.reason == "too_large" and len(data) > bound
    else:
        assert out == data
    assert inflate(packed + gzip.compress(b"x"), "gzip", 1 << 20) == data + b"x"  # several members


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=0, max_value=1 << 40), st.text(max_size=300))
def test_the_partial_success_protobuf_is_what_the_proto_library_reads(rejected, message) -> None:
    answer = ExportTraceServiceResponse.FromString(response(PROTOBUF, rejected, message))
    assert answer.partial_success.rejected_spans == rejected
    assert answer.partial_success.error_message == message
    expected = ExportTraceServiceResponse()
    if rejected or message:
        expected.partial_success.rejected_spans = rejected
        expected.partial_success.error_message = message
    assert answer.SerializeToString() == response(PROTOBUF, rejected, message)


def test_read_request_agrees_with_the_workers_decoder() -> None:
    for name in ("genai", "openinference", "traceloop"):
        assert read_request(_proto(name), PROTOBUF, 10_000).spans == decode_request(_proto(name)).spans
        assert read_request(_json_body(name), JSON, 10_000).spans == decode_request(_json_body(name)).spans
