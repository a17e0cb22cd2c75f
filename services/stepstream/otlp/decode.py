"""OTLP trace export requests, bytes to :class:`~stepstream.otlp.spans.Span`.

The Collector's Kafka exporter writes ``ExportTraceServiceRequest`` messages as
``otlp_proto`` (the default) or ``otlp_json`` and sets no content-type header, so
:func:`detect` tells them apart by their first byte: the JSON form is an object (``{``,
after optional whitespace), the protobuf form of a non-empty request starts with field 1
(``resource_spans``, length-delimited: byte ``0x0A``), and the empty request is empty.
``{`` (``0x7B``) opens no valid field of the protobuf message (field 15, wire type 3),
so the only ambiguity is a protobuf request whose first resource is 123 bytes long
(``0x0A 0x7B``) against JSON that starts with a newline: it is tried as protobuf first.

:func:`decode_request` never raises anything but :class:`~stepstream.errors.WireError`
with reason ``bad_otlp`` (the message as a whole cannot be read); spans it cannot use
are returned beside the good ones as :class:`Rejected` (``no_trace_id``), so one bad
span never costs the others. Values are bounded by :class:`SpanBounds`.

The protobuf side needs the ``opentelemetry-proto`` and ``protobuf`` packages (the
``otlp`` extra); its upb backend (the default in protobuf's wheels) decodes about
ten times faster than the pure-Python one (``benchmarks/bench_otlp.py`` measures both
forms). The JSON side is msgspec only.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import msgspec

from stepstream.errors import WireError
from stepstream.otlp.spans import Span, SpanBounds, SpanEvent, Values

__all__ = ["Decoded", "Rejected", "decode_request", "detect", "protobuf_backend"]

Format = Literal["otlp_proto", "otlp_json"]
_WHITESPACE = b" \t\r\n"


class Rejected(msgspec.Struct, frozen=True):
    """A span of the request that is not used, and why (a named reason, no value)."""

    reason: str
    detail: str


class Decoded(msgspec.Struct):
    format: str
    spans: list[Span]
    rejected: list[Rejected]


def detect(data: bytes) -> Format:
    """``otlp_json`` when ``data`` is a JSON object, else ``otlp_proto`` (module docstring)."""
    head = data[:1]
    if head == b"{":
        return "otlp_json"
    if head != b"\n" and data.lstrip(_WHITESPACE)[:1] == b"{":
        return "otlp_json"
    return "otlp_proto"


def decode_request(data: bytes, bounds: SpanBounds = SpanBounds()) -> Decoded:
    """Decode one export request in either form (module docstring)."""
    data = bytes(data)
    if detect(data) == "otlp_json":
        return _decode_json(data, bounds)
    try:
        return _decode_proto(data, bounds)
    except WireError:
        if data.lstrip(_WHITESPACE)[:1] == b"{":  # the 0x0A 0x7B ambiguity
            return _decode_json(data, bounds)
        raise


# ---------------------------------------------------------------- protobuf


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
        value = kv.value
        if value.WhichOneof("value") == "string_value":  # the common case, inline
            text = value.string_value
            out[key if len(key) <= chars else values.text(key)] = text if len(text) <= chars else values.text(text)
        else:
            out[key if len(key) <= chars else values.text(key)] = _proto_value(value, values, 1)
    return out


def _decode_proto(data: bytes, bounds: SpanBounds) -> Decoded:
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


# ---------------------------------------------------------------- OTLP JSON
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


def _decode_json(data: bytes, bounds: SpanBounds) -> Decoded:
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
