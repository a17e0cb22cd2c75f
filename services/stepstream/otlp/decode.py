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

from typing import Literal

from stepstream.errors import WireError
from stepstream.otlp.json_form import decode_json
from stepstream.otlp.proto_form import decode_proto, protobuf_backend
from stepstream.otlp.spans import Decoded, Rejected, SpanBounds

__all__ = ["Decoded", "Rejected", "decode_request", "detect", "protobuf_backend"]

Format = Literal["otlp_proto", "otlp_json"]
_WHITESPACE = b" \t\r\n"


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
        return decode_json(data, bounds)
    try:
        return decode_proto(data, bounds)
    except WireError:
        if data.lstrip(_WHITESPACE)[:1] == b"{":  # the 0x0A 0x7B ambiguity
            return decode_json(data, bounds)
        raise
