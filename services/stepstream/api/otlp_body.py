"""What a ``POST /v1/traces`` body holds (OTLP/HTTP), and the OTLP answers.

:func:`inflate` undoes ``Content-Encoding: gzip`` (or takes ``identity``) and refuses
to inflate past ``max_bytes`` (:class:`BodyRefused` ``too_large``, 413): the bound is on
what the body *becomes*, so a small gzip bomb costs at most ``max_bytes`` of memory.
:func:`read_request` decodes the request in the form its ``Content-Type`` names
(``application/x-protobuf`` or ``application/json``) with the worker's own decoders
(:mod:`stepstream.otlp`), and refuses, before anything is produced:

* ``bad_otlp`` (400): undecodable, or bytes the worker would read in the other form
  (:func:`stepstream.otlp.decode.detect` must agree with the declared type, since the
  OTLP topic carries no content type);
* ``too_many_spans`` (413): more than ``max_spans`` spans (kept and rejected together).

Spans the decoder rejects (``no_trace_id``) are not a refusal: the request is produced,
the worker dead-letters them as it would from the Collector, and the answer is OTLP's
partial success naming how many (:func:`response`).

:func:`response` is ``ExportTraceServiceResponse`` in the request's encoding: the
protobuf form written by hand (``partial_success`` is field 1, a message of
``rejected_spans`` = field 1 varint and ``error_message`` = field 2 string; the success
answer is the empty message), the JSON form ``{}`` or
``{"partialSuccess": {"rejectedSpans": n, "errorMessage": "..."}}``.
"""

from __future__ import annotations

import zlib

import msgspec

from stepstream.errors import WireError
from stepstream.otlp.decode import detect
from stepstream.otlp.json_form import decode_json
from stepstream.otlp.proto_form import decode_proto
from stepstream.otlp.spans import Decoded, SpanBounds

__all__ = ["JSON", "PROTOBUF", "BodyRefused", "inflate", "read_request", "response"]

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_FORM = {PROTOBUF: "otlp_proto", JSON: "otlp_json"}
_BOUNDS = SpanBounds()  # the worker's own: what it keeps is what is validated here


class BodyRefused(Exception):
    """The whole request is refused (``reason``: ``encoding``, ``too_large``,
    ``bad_gzip``, ``bad_otlp``, ``too_many_spans``); nothing of it is produced."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def inflate(body: bytes, encoding: str, max_bytes: int) -> bytes:
    """``body`` with its ``Content-Encoding`` (``""``, ``identity`` or ``gzip``) undone,
    at most ``max_bytes`` long; raises :class:`BodyRefused`."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        if len(body) > max_bytes:
            raise BodyRefused("too_large", f"the request is larger than {max_bytes} bytes")
        return body
    if encoding != "gzip":
        raise BodyRefused("encoding", "Content-Encoding must be gzip or identity")
    out: list[bytes] = []
    size = 0
    data = body
    while True:  # one gzip member after another (RFC 1952 allows several)
        inflater = zlib.decompressobj(wbits=31)
        try:
            chunk = inflater.decompress(data, max_bytes - size + 1)
        except zlib.error:
            raise BodyRefused("bad_gzip", "the body is not valid gzip") from None
        size += len(chunk)
        if size > max_bytes or inflater.unconsumed_tail:
            raise BodyRefused("too_large", f"the request inflates past {max_bytes} bytes")
        out.append(chunk)
        if not inflater.eof:
            raise BodyRefused("bad_gzip", "the gzip body is truncated")
        data = inflater.unused_data
        if not data:
            return b"".join(out)


def read_request(data: bytes, media_type: str, max_spans: int) -> Decoded:
    """The spans of ``data`` in the form of ``media_type`` (:data:`PROTOBUF` or
    :data:`JSON`); raises :class:`BodyRefused` (module docstring)."""
    form = _FORM[media_type]
    if data and detect(data) != form:
        raise BodyRefused("bad_otlp", f"the body is not an {form} export request")
    try:
        decoded = decode_proto(data, _BOUNDS) if form == "otlp_proto" else decode_json(data, _BOUNDS)
    except WireError as exc:
        raise BodyRefused("bad_otlp", f"the body is not an {form} export request ({exc.reason})") from None
    if len(decoded.spans) + len(decoded.rejected) > max_spans:
        raise BodyRefused("too_many_spans", f"more than {max_spans} spans in one request")
    return decoded


class _PartialSuccess(msgspec.Struct, rename="camel", omit_defaults=True):
    rejected_spans: int = 0
    error_message: str = ""


class _Response(msgspec.Struct, rename="camel", omit_defaults=True):
    partial_success: _PartialSuccess | None = None


_json = msgspec.json.Encoder()


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def response(media_type: str, rejected: int, message: str = "") -> bytes:
    """``ExportTraceServiceResponse`` in ``media_type``: success, or partial success
    with ``rejected`` spans and ``message`` (module docstring)."""
    if media_type == JSON:
        partial = _PartialSuccess(rejected, message) if rejected or message else None
        return _json.encode(_Response(partial))
    if not rejected and not message:
        return b""
    inner = b""
    if rejected:
        inner += b"\x08" + _varint(rejected)
    if message:
        text = message.encode()
        inner += b"\x12" + _varint(len(text)) + text
    return b"\x0a" + _varint(len(inner)) + inner

