"""``POST /v1/traces``: OTLP/HTTP trace export, produced to the OTLP topic under the token's company.

Mounted with the ingest route (``stepstream api --ingest``) when ``STEPSTREAM_OTLP_TOPIC``
is set; without it the path is not mounted (404, as every unknown path). It shares the
ingest route's token guard (``ingest`` scope; the company is the token's, there is none
in the path), its per-company token bucket (counted in spans), its concurrency slots and
its producer (:class:`~stepstream.api.kafka_log.KafkaEventLog`).

The request is produced *as received* (inflated) to the OTLP topic with no key, one
Kafka record per request, with the header ``stepstream-company`` set to the token's
company. The worker (``ingest/otlp_bridge.py``) trusts that header before any resource
attribute, so a request can never land spans in another company than its token's.

In this order, and nothing of a refused request is produced:

=====  ==========================  =============================================================
code   reason (metric ``outcome``)  when
=====  ==========================  =============================================================
415    ``otlp_media_type``          neither ``application/x-protobuf`` nor ``application/json``
415    ``otlp_encoding``            a ``Content-Encoding`` other than ``gzip`` / ``identity``
503    ``busy``                     ``max_requests`` ingest requests are being served (``Retry-After: 1``)
429    ``rate``                     the company's bucket is empty (``Retry-After``), before the body is read
413    ``body_too_large``           ``Content-Length`` or the bytes received pass ``max_body_bytes``
413    ``otlp_too_large``           the body inflates past ``max_event_bytes`` (one Kafka record)
400    ``otlp_bad_gzip``            not valid gzip
400    ``otlp_bad_otlp``            not an export request in the declared form
413    ``otlp_too_many_spans``      more than ``max_events`` spans
429    ``rate``                     the bucket holds fewer events than the request has spans
503    ``unavailable`` / ``full``   the broker is away, did not acknowledge in time, or the producer
       / ``timeout``                is full (``Retry-After``); the spans are given back to the bucket
200    ``otlp_accepted``            the broker acknowledged the record: ``ExportTraceServiceResponse``
                                    in the request's encoding, a partial success naming the spans
                                    the worker will dead-letter (``no_trace_id``)
=====  ==========================  =============================================================

Refusals are RFC 9457 problems (``application/problem+json``), as on every other
route; OTLP exporters act on the status code and ``Retry-After`` (429 and 503 are
retried, 400 and 413 are not). A request with no span is answered 200 and produces nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from litestar import Request, Response, Router, post
from litestar.openapi.spec import OpenAPIMediaType, Operation, RequestBody, Schema

from stepstream.api.ingest import Ingest
from stepstream.api.otlp_body import JSON, PROTOBUF, BodyRefused, inflate, read_request, response
from stepstream.api.problems import PROBLEM_MEDIA_TYPE, Problem, problem_responses
from stepstream.otlp.identity import COMPANY_HEADER

__all__ = ["otlp_router"]

def _own(description: str) -> object:
    from litestar.openapi.datastructures import ResponseSpec

    return ResponseSpec(data_container=Problem, media_type=PROBLEM_MEDIA_TYPE, description=description, generate_examples=False)


# The route's own problems (the guard's 404 cannot happen: the company is the token's).
_OWN_RESPONSES = {
    400: _own("Not valid gzip, or not an OTLP export request in the declared form"),
    413: _own("The body, its inflated size or its number of spans is over the route's bound"),
    415: _own("The body is neither application/x-protobuf nor application/json, or its Content-Encoding is not gzip"),
}

_STATUS = {"encoding": 415, "too_large": 413, "bad_gzip": 400, "bad_otlp": 400, "too_many_spans": 413}


@dataclass
class _Operation(Operation):
    request_body: Any = field(default=None)

    def __post_init__(self) -> None:
        request = Schema(type="object", description="an OTLP ExportTraceServiceRequest")  # type: ignore[arg-type]
        self.request_body = RequestBody(
            required=True,
            description="An OTLP trace export request (optionally Content-Encoding: gzip)",
            content={
                PROTOBUF: OpenAPIMediaType(schema=Schema(type="string", format="binary")),  # type: ignore[arg-type]
                JSON: OpenAPIMediaType(schema=request),  # type: ignore[arg-type]
            },
        )


def otlp_router(ingest: Ingest, topic: str, guards: list[object]) -> Router:
    """``POST /v1/traces`` over ``ingest``'s producer and buckets, to ``topic``."""
    event_log, limits, metrics, refused = ingest.event_log, ingest.limits, ingest.metrics, ingest.refused

    @post(
        "/traces",
        opt={"scope": "ingest", "company": "token", "query": ()},
        status_code=200,
        summary="Export OTLP traces (OTLP/HTTP)",
        operation_id="postTraces",
        request_max_body_size=limits.max_body_bytes,
        operation_class=_Operation,
        media_type=PROTOBUF,
        responses={**problem_responses(401, 403, 429, 503), **_OWN_RESPONSES},
    )
    async def post_traces(request: Request[Any, Any, Any]) -> Response[bytes]:
        """An OTLP ``ExportTraceServiceRequest`` (``application/x-protobuf`` or
        ``application/json``, optionally gzip), produced to the OTLP topic with the
        token's company as its ``stepstream-company`` header; 200 (an
        ``ExportTraceServiceResponse`` in the request's encoding) only once the broker
        acknowledged it."""
        company: str = request.state.company
        media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media not in (PROTOBUF, JSON):
            raise refused("otlp_media_type", 415, f"the body must be {PROTOBUF} or {JSON}")
        encoding = request.headers.get("content-encoding", "")
        if encoding.strip().lower() not in ("", "identity", "gzip"):
            raise refused("otlp_encoding", 415, "Content-Encoding must be gzip or identity")
        async with ingest.slot(company):
            body = await ingest.read_body(request)
            try:
                data = inflate(body, encoding, limits.max_event_bytes)
                decoded = read_request(data, media, limits.max_events)
            except BodyRefused as exc:
                raise refused("otlp_" + exc.reason, _STATUS[exc.reason], exc.detail) from None
            spans = len(decoded.spans) + len(decoded.rejected)
            if spans:
                headers = [(COMPANY_HEADER, company.encode())]
                await ingest.produce(company, spans, lambda: event_log.append([(None, data)], topic=topic, headers=headers))
                metrics.bytes.inc(len(data))
        metrics.requests.labels("otlp_accepted").inc()
        rejected = len(decoded.rejected)
        message = f"{rejected} span(s) without a valid trace or span id" if rejected else ""
        return Response(response(media, rejected, message), media_type=media, status_code=200)

    return Router("/v1", route_handlers=[post_traces], guards=guards, security=[{"bearer": []}], tags=["ingest"])  # type: ignore[arg-type]
