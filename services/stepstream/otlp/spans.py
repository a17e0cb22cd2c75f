"""Plain spans: what an OTLP ``ExportTraceServiceRequest`` holds that the mapping reads.

Both decoders (``otlp_proto`` and ``otlp_json``, :mod:`stepstream.otlp.decode`) build
these Structs, so the mapping (:mod:`stepstream.otlp.mapping`) never sees protobuf or
OTLP JSON.

**Bounds** (:class:`SpanBounds`; clip, never refuse): every string value, at any depth
of an attribute, is clipped to ``Limits.output_chars`` (the largest deep cap, 65,536
characters) with the clip marker of :mod:`stepstream.core.caps`; a span keeps at most
``attributes`` attributes and ``events`` events, an array or key-value list at most
``items`` items, and values nest at most ``depth`` levels (deeper values become the clip
marker). Bytes values become lowercase hex (clipped like a string). What was cut is
counted in ``Span.clipped``.

Ids: ``trace_id`` is 32 lowercase hex digits, ``span_id`` 16, ``parent_span_id`` 16 or
``None`` (a root span); a span whose trace or span id is missing, all zeros or of the
wrong length is not a ``Span`` (the decoder rejects it as ``no_trace_id``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from stepstream.core.caps import CLIP_MARKER, clip
from stepstream.core.limits import Limits

__all__ = ["SPAN_KINDS", "STATUS_ERROR", "STATUS_OK", "STATUS_UNSET", "Decoded", "Rejected", "Span", "SpanBounds", "SpanEvent", "Values"]

STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2
SPAN_KINDS = ("unspecified", "internal", "server", "client", "producer", "consumer")


class SpanBounds(msgspec.Struct, frozen=True):
    """How much of a span is kept (module docstring)."""

    string_chars: int = Limits().output_chars
    attributes: int = 512
    events: int = 128
    items: int = 1024
    depth: int = 16


class SpanEvent(msgspec.Struct, frozen=True):
    name: str
    time_ns: int
    attributes: dict[str, Any]


class Span(msgspec.Struct, kw_only=True):
    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: int = 0
    start_ns: int = 0
    end_ns: int = 0
    attributes: dict[str, Any] = {}
    events: list[SpanEvent] = []
    status_code: int = STATUS_UNSET
    status_message: str = ""
    # The resource's attributes (one dict shared by the spans of a resource) and the
    # instrumentation scope's name.
    resource: dict[str, Any] = {}
    scope: str = ""
    # How many values the bounds cut or dropped while decoding this span.
    clipped: int = 0


class Rejected(msgspec.Struct, frozen=True):
    """A span of the request that is not used, and why (a named reason, no value)."""

    reason: str
    detail: str


class Decoded(msgspec.Struct):
    """What one export request held: its form, the spans kept, the spans refused."""

    format: str
    spans: list[Span]
    rejected: list[Rejected]



class Values:
    """Clips decoded attribute values to :class:`SpanBounds` and counts what it cut.

    One per decode call; ``clipped`` is read and reset per span."""

    __slots__ = ("bounds", "clipped")

    def __init__(self, bounds: SpanBounds) -> None:
        self.bounds = bounds
        self.clipped = 0

    def text(self, value: str) -> str:
        if len(value) <= self.bounds.string_chars:
            return value
        self.clipped += 1
        return clip(value, self.bounds.string_chars)[0]

    def too_deep(self) -> str:
        self.clipped += 1
        return CLIP_MARKER

    def take(self, items: list, limit: int) -> list:
        if len(items) <= limit:
            return items
        self.clipped += 1
        return items[:limit]

    def hex(self, value: bytes) -> str:
        return self.text(value[: self.bounds.string_chars].hex())
