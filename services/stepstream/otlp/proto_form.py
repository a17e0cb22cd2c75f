"""``otlp_proto``: an ``ExportTraceServiceRequest`` in protobuf, parsed by
``opentelemetry-proto`` on protobuf's upb backend (the ``otlp`` extra), to spans
(:mod:`stepstream.otlp.decode` has the contract)."""

from __future__ import annotations

from typing import Any

from stepstream.errors import WireError
from stepstream.otlp.spans import Decoded, Rejected, Span, SpanBounds, SpanEvent, Values

__all__ = ["decode_proto", "protobuf_backend"]

_request_type: Any = None


def _proto_request() -> Any:
    global _request_type
    if _request_type is None:
        try:
            from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
        except ImportError as exc:  # pragma: no cover - the otlp extra is missing
            raise ImportError(
                "decoding otlp_proto needs the otlp extra: pip install 'stepstream[otlp]'"
            ) from exc
        _request_type = trace_service_pb2.ExportTraceServiceRequest
    return _request_type


def protobuf_backend() -> str:
    """``upb``, ``cpp`` or ``python``: which protobuf implementation decodes here."""
    _proto_request()
    from google.protobuf.internal import api_implementation

    return api_implementation.Type()


def _proto_value(value: Any, values: Values, depth: int) -> Any:
    which = value.WhichOneof("value")
    if which == "string_value":
        text = value.string_value
        return text if len(text) <= values.bounds.string_chars else values.text(text)
    if which == "int_value":
        return value.int_value
    if which == "bool_value":
        return value.bool_value
    if which == "double_value":
        return value.double_value
    if depth >= values.bounds.depth:
        return values.too_deep() if which else None
    if which == "array_value":
        items = values.take(list(value.array_value.values), values.bounds.items)
        return [_proto_value(item, values, depth + 1) for item in items]
    if which == "kvlist_value":
        pairs = values.take(list(value.kvlist_value.values), values.bounds.items)
        return {values.text(kv.key): _proto_value(kv.value, values, depth + 1) for kv in pairs}
    if which == "bytes_value":
        return values.hex(value.bytes_value)
    return None


def _proto_attributes(attributes: Any, values: Values, limit: int) -> dict[str, Any]:
    pairs = attributes if len(attributes) <= limit else values.take(list(attributes), limit)
    chars = values.bounds.string_chars
    out: dict[str, Any] = {}
    for kv in pairs:
        key = kv.key
        if len(key) > chars:
            key = values.text(key)
        value = kv.value
        text = value.string_value
        if text:  # the common case, inline: only a string value has a non-empty one
            out[key] = text if len(text) <= chars else values.text(text)
        else:
            out[key] = _proto_value(value, values, 1)
    return out


def decode_proto(data: bytes, bounds: SpanBounds) -> Decoded:
    request = _proto_request()()
    try:
        request.ParseFromString(data)
    except Exception as exc:  # google.protobuf.message.DecodeError, RecursionError in the python backend
        raise WireError("bad_otlp", f"not an ExportTraceServiceRequest in protobuf ({type(exc).__name__})") from None
    values = Values(bounds)
    spans: list[Span] = []
    rejected: list[Rejected] = []
    for resource_spans in request.resource_spans:
        resource = _proto_attributes(resource_spans.resource.attributes, values, bounds.attributes)
        values.clipped = 0  # counted on the resource, not on its first span
        for scope_spans in resource_spans.scope_spans:
            scope = values.text(scope_spans.scope.name)
            for span in scope_spans.spans:
                trace_id, span_id = span.trace_id, span.span_id
                if len(trace_id) != 16 or len(span_id) != 8 or not any(trace_id) or not any(span_id):
                    rejected.append(Rejected("no_trace_id", "a span without a valid trace id or span id"))
                    continue
                parent = span.parent_span_id
                events = span.events if len(span.events) <= bounds.events else values.take(list(span.events), bounds.events)
                spans.append(
                    Span(
                        trace_id=trace_id.hex(),
                        span_id=span_id.hex(),
                        parent_span_id=parent.hex() if len(parent) == 8 and any(parent) else None,
                        name=values.text(span.name),
                        kind=span.kind,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=_proto_attributes(span.attributes, values, bounds.attributes),
                        events=[
                            SpanEvent(
                                values.text(event.name),
                                event.time_unix_nano,
                                _proto_attributes(event.attributes, values, bounds.attributes),
                            )
                            for event in events
                        ],
                        status_code=span.status.code,
                        status_message=values.text(span.status.message),
                        resource=resource,
                        scope=scope,
                        clipped=values.clipped,
                    )
                )
                values.clipped = 0
    return Decoded("otlp_proto", spans, rejected)
