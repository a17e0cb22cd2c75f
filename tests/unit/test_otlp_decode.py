"""The OTLP decoder: both forms of the golden fixtures, detection, bounds, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepstream.core.caps import CLIP_MARKER
from stepstream.errors import WireError
from stepstream.otlp.decode import decode_request, detect, protobuf_backend
from stepstream.otlp.spans import STATUS_ERROR, SpanBounds

FIXTURES = Path(__file__).parent / "otlp_fixtures"
FAMILIES = ("genai", "openinference", "traceloop")


def _json_request(spans: list[dict], resource: list[dict] | None = None) -> bytes:
    return json.dumps(
        {"resourceSpans": [{"resource": {"attributes": resource or []}, "scopeSpans": [{"scope": {"name": "t"}, "spans": spans}]}]}
    ).encode()


def _span(**over) -> dict:
    span = {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": "eee19b7ec3c1b174",
        "name": "chat m",
        "kind": 3,
        "startTimeUnixNano": "1764633600000000000",
        "endTimeUnixNano": 1764633601000000000,
        "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}],
    }
    span.update(over)
    return span


@pytest.mark.parametrize("family", FAMILIES)
def test_proto_and_json_fixtures_decode_to_the_same_spans(family):
    proto = decode_request((FIXTURES / f"{family}.pb").read_bytes())
    as_json = decode_request((FIXTURES / f"{family}.json").read_bytes())
    assert (proto.format, as_json.format) == ("otlp_proto", "otlp_json")
    assert proto.spans == as_json.spans
    assert len(proto.spans) == 5 and not proto.rejected
    roots = [span for span in proto.spans if span.parent_span_id is None]
    assert len(roots) == 1
    assert {span.trace_id for span in proto.spans} == {roots[0].trace_id}
    assert any(span.status_code == STATUS_ERROR for span in proto.spans)  # the failing tool
    assert all(span.resource["service.name"] == f"weather-agent-{family}" for span in proto.spans)


def test_the_fast_protobuf_backend_is_installed():
    assert protobuf_backend() == "upb"


def test_detect_needs_no_content_type():
    assert detect(b'{"resourceSpans": []}') == "otlp_json"
    assert detect(b' \r\n\t{"resourceSpans": []}') == "otlp_json"
    assert detect(b"") == "otlp_proto"
    assert detect((FIXTURES / "genai.pb").read_bytes()) == "otlp_proto"
    assert decode_request(b"").spans == []
    assert decode_request(b"\n {}").spans == []  # JSON after a newline: protobuf refuses it, JSON reads it


def test_a_protobuf_request_that_starts_like_json_after_a_newline():
    # Field 1 of length 123 is b"\n{": detect() must not take it for JSON.
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    attribute = resource.resource.attributes.add()
    attribute.key = "service.name"
    attribute.value.string_value = ""
    size = resource.ByteSize()
    attribute.value.string_value = "x" * (123 - size)
    data = request.SerializeToString()
    assert data[:2] == b"\n{"
    decoded = decode_request(data)
    assert decoded.format == "otlp_proto" and decoded.spans == []


@pytest.mark.parametrize(
    "data",
    [b"\x0a\xff\xff\xff", b"garbage", b"{not json", b"[]", b'{"resourceSpans": 3}', b"\xff\xfe{",
     _json_request([_span(startTimeUnixNano="soon")])],
)
def test_undecodable_requests_are_bad_otlp(data):
    with pytest.raises(WireError) as info:
        decode_request(data)
    assert info.value.reason == "bad_otlp"


def test_a_span_without_ids_is_rejected_and_the_others_kept():
    data = _json_request([_span(), _span(traceId=""), _span(spanId="00" * 8), _span(traceId="zz" * 16), _span(spanId="abc")])
    decoded = decode_request(data)
    assert len(decoded.spans) == 1
    assert [r.reason for r in decoded.rejected] == ["no_trace_id"] * 4


def test_json_fields_the_collector_writes():
    span = _span(
        parentSpanId="",
        status={"code": 2, "message": "boom"},
        events=[{"timeUnixNano": "5", "name": "exception", "attributes": [{"key": "exception.type", "value": {"stringValue": "E"}}]}],
        attributes=[
            {"key": "i", "value": {"intValue": "-7"}},
            {"key": "d", "value": {"doubleValue": 1.5}},
            {"key": "n", "value": {"doubleValue": "NaN"}},
            {"key": "b", "value": {"boolValue": True}},
            {"key": "a", "value": {"arrayValue": {"values": [{"stringValue": "x"}, {"intValue": 2}]}}},
            {"key": "k", "value": {"kvlistValue": {"values": [{"key": "y", "value": {"boolValue": False}}]}}},
            {"key": "raw", "value": {"bytesValue": "AQI="}},
            {"key": "empty", "value": {}},
        ],
    )
    (decoded,) = decode_request(_json_request([span])).spans
    assert decoded.parent_span_id is None
    assert decoded.status_code == 2 and decoded.status_message == "boom"
    assert decoded.events[0].time_ns == 5 and decoded.events[0].attributes == {"exception.type": "E"}
    attributes = decoded.attributes
    assert attributes["i"] == -7 and attributes["d"] == 1.5 and attributes["n"] != attributes["n"]
    assert attributes["a"] == ["x", 2] and attributes["k"] == {"y": False} and attributes["raw"] == "0102"
    assert attributes["b"] is True and attributes["empty"] is None
    assert decoded.start_ns == 1764633600000000000 and decoded.end_ns == 1764633601000000000


def test_values_are_clipped_never_refused():
    bounds = SpanBounds()
    huge = "é" * (bounds.string_chars + 10)
    deep: dict = {"stringValue": "bottom"}
    for _ in range(bounds.depth + 5):
        deep = {"arrayValue": {"values": [deep]}}
    many = [{"key": f"a{i}", "value": {"intValue": i}} for i in range(bounds.attributes + 3)]
    data = _json_request(
        [
            _span(attributes=[{"key": "big", "value": {"stringValue": huge}}, {"key": "deep", "value": deep}]),
            _span(spanId="eee19b7ec3c1b175", attributes=many),
        ]
    )
    first, second = decode_request(data).spans
    big = first.attributes["big"]
    assert len(big) == bounds.string_chars and big.endswith(CLIP_MARKER)
    node = first.attributes["deep"]
    for _ in range(bounds.depth - 1):
        (node,) = node
    assert node == CLIP_MARKER
    assert first.clipped == 2
    assert len(second.attributes) == bounds.attributes and second.clipped == 1


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_any_bytes_decode_or_are_bad_otlp(data):
    try:
        decoded = decode_request(data)
    except WireError as exc:
        assert exc.reason == "bad_otlp"
    else:
        assert all(len(span.trace_id) == 32 and len(span.span_id) == 16 for span in decoded.spans)


@settings(max_examples=200)
@given(st.binary(max_size=40))
def test_any_bytes_after_a_brace_decode_or_are_bad_otlp(tail):
    try:
        decode_request(b'{"resourceSpans":[' + tail)
    except WireError as exc:
        assert exc.reason == "bad_otlp"
