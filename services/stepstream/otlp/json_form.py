"""``otlp_json``: an ``ExportTraceServiceRequest`` in OTLP JSON, decoded by msgspec, to
spans (:mod:`stepstream.otlp.decode` has the contract)."""

from __future__ import annotations

import base64
from typing import Any

import msgspec

from stepstream.errors import WireError
from stepstream.otlp.spans import Decoded, Rejected, Span, SpanBounds, SpanEvent, Values

__all__ = ["decode_json"]

# The protobuf JSON mapping as OTLP specifies it: lowerCamelCase names, ids as hex
# (not base64), 64-bit integers as strings or numbers, enums as integers.


class _AnyValue(msgspec.Struct, rename="camel"):
    string_value: str | None = None
    bool_value: bool | None = None
    int_value: int | str | None = None
    double_value: float | str | None = None
    array_value: _ArrayValue | None = None
    kvlist_value: _KvList | None = None
    bytes_value: str | None = None


class _KeyValue(msgspec.Struct):
    key: str = ""
    value: _AnyValue | None = None


class _ArrayValue(msgspec.Struct):
    values: list[_AnyValue] = []


class _KvList(msgspec.Struct):
    values: list[_KeyValue] = []


class _Status(msgspec.Struct):
    code: int = 0
    message: str = ""


class _Event(msgspec.Struct, rename="camel"):
    time_unix_nano: int | str = 0
    name: str = ""
    attributes: list[_KeyValue] = []


class _Span(msgspec.Struct, rename="camel"):
    trace_id: str = ""
    span_id: str = ""
    parent_span_id: str = ""
    name: str = ""
    kind: int = 0
    start_time_unix_nano: int | str = 0
    end_time_unix_nano: int | str = 0
    attributes: list[_KeyValue] = []
    events: list[_Event] = []
    status: _Status | None = None


class _Scope(msgspec.Struct):
    name: str = ""


class _ScopeSpans(msgspec.Struct, rename="camel"):
    scope: _Scope | None = None
    spans: list[_Span] = []


class _Resource(msgspec.Struct):
    attributes: list[_KeyValue] = []


class _ResourceSpans(msgspec.Struct, rename="camel"):
    resource: _Resource | None = None
    scope_spans: list[_ScopeSpans] = []


class _Request(msgspec.Struct, rename="camel"):
    resource_spans: list[_ResourceSpans] = []


_json_decoder = msgspec.json.Decoder(_Request)
_HEX = frozenset("0123456789abcdef")


def _integer(value: int | str) -> int:
    if type(value) is int:
        return value
    try:
        return int(value)
    except ValueError:
        raise WireError("bad_otlp", "an integer field of OTLP JSON is not an integer") from None


def _json_value(value: _AnyValue | None, values: Values, depth: int) -> Any:
    if value is None:
        return None
    if value.string_value is not None:
        return values.text(value.string_value)
    if value.int_value is not None:
        return _integer(value.int_value)
    if value.bool_value is not None:
        return value.bool_value
    if value.double_value is not None:
        double = value.double_value
        return double if type(double) is float else _double(double)
    present = value.array_value is not None or value.kvlist_value is not None or value.bytes_value is not None
    if depth >= values.bounds.depth:
        return values.too_deep() if present else None
    if value.array_value is not None:
        items = values.take(value.array_value.values, values.bounds.items)
        return [_json_value(item, values, depth + 1) for item in items]
    if value.kvlist_value is not None:
        pairs = values.take(value.kvlist_value.values, values.bounds.items)
        return {values.text(kv.key): _json_value(kv.value, values, depth + 1) for kv in pairs}
    if value.bytes_value is not None:
        try:
            return values.hex(base64.b64decode(value.bytes_value, validate=False))
        except ValueError:
            return values.text(value.bytes_value)
    return None


def _double(text: str) -> float | str:
    try:
        return float(text)  # "NaN", "Infinity", "-Infinity" as the JSON mapping spells them
    except ValueError:
        raise WireError("bad_otlp", "a double field of OTLP JSON is not a number") from None


def _json_attributes(attributes: list[_KeyValue], values: Values, limit: int) -> dict[str, Any]:
    pairs = values.take(attributes, limit)
    return {values.text(kv.key): _json_value(kv.value, values, 1) for kv in pairs}


def _hex_id(text: str, digits: int) -> str | None:
    text = text.lower()
    if len(text) != digits or not _HEX.issuperset(text) or text.count("0") == digits:
        return None
    return text


def decode_json(data: bytes, bounds: SpanBounds) -> Decoded:
    try:
        request = _json_decoder.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        kind = "the wrong shape" if isinstance(exc, msgspec.ValidationError) else "not JSON"
        raise WireError("bad_otlp", f"not an ExportTraceServiceRequest in OTLP JSON ({kind})") from None
    values = Values(bounds)
    spans: list[Span] = []
    rejected: list[Rejected] = []
    try:
        for resource_spans in request.resource_spans:
            resource_attributes = resource_spans.resource.attributes if resource_spans.resource else []
            resource = _json_attributes(resource_attributes, values, bounds.attributes)
            values.clipped = 0
            for scope_spans in resource_spans.scope_spans:
                scope = values.text(scope_spans.scope.name) if scope_spans.scope else ""
                for span in scope_spans.spans:
                    trace_id, span_id = _hex_id(span.trace_id, 32), _hex_id(span.span_id, 16)
                    if trace_id is None or span_id is None:
                        rejected.append(Rejected("no_trace_id", "a span without a valid trace id or span id"))
                        continue
                    status = span.status or _Status()
                    spans.append(
                        Span(
                            trace_id=trace_id,
                            span_id=span_id,
                            parent_span_id=_hex_id(span.parent_span_id, 16),
                            name=values.text(span.name),
                            kind=span.kind,
                            start_ns=_integer(span.start_time_unix_nano),
                            end_ns=_integer(span.end_time_unix_nano),
                            attributes=_json_attributes(span.attributes, values, bounds.attributes),
                            events=[
                                SpanEvent(
                                    values.text(event.name),
                                    _integer(event.time_unix_nano),
                                    _json_attributes(event.attributes, values, bounds.attributes),
                                )
                                for event in values.take(span.events, bounds.events)
                            ],
                            status_code=status.code,
                            status_message=values.text(status.message),
                            resource=resource,
                            scope=scope,
                            clipped=values.clipped,
                        )
                    )
                    values.clipped = 0
    except RecursionError:
        raise WireError("bad_otlp", "an OTLP JSON value nests too deep") from None
    return Decoded("otlp_json", spans, rejected)
