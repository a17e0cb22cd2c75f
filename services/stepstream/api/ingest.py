"""``POST /v1/companies/{company}/events``: wire events over HTTP, bound to the token's company.

The guard (``api/auth.py``) has already answered 401 (no, unknown or revoked token),
404 (a token of another company: the bytes of a missing run) and 403 (no ``ingest``
scope) before anything here runs. Then, in this order, and nothing of a refused
request is produced:

=====  ==========================  =============================================================
code   reason (metric ``outcome``)  when
=====  ==========================  =============================================================
415    ``media_type``               the body is neither ``application/x-ndjson`` nor ``application/json``
503    ``busy``                     ``max_requests`` ingest requests are being served (``Retry-After: 1``)
429    ``rate``                     the company's bucket is empty (``Retry-After``), before the body is read
413    ``body_too_large``           ``Content-Length`` or the bytes received pass ``max_body_bytes``: answered
                                    as soon as that is known, the rest of the body is never read
400    ``not_a_batch``              an ``application/json`` body that is not one JSON array
413    ``too_many_events``          more than ``max_events`` events
403    ``foreign_company``          an event's ``company_id`` is not the path's: the first such line is
                                    named, never the value
400    ``bad_lines``                lines that are not wire v1 events, each with its reason (the dead
                                    letters' names) in ``errors``, at most 100 listed
400    ``empty``                    no event at all
429    ``rate``                     the bucket holds fewer events than the request (``Retry-After``)
503    ``unavailable`` / ``full``   the broker is away, did not acknowledge in time, or the producer
       / ``timeout``                holds ``max_inflight_bytes`` (``Retry-After``); the events are given
                                    back to the bucket
202    ``accepted``                 the broker acknowledged every event (``acks=all``): ``{"accepted": n}``
=====  ==========================  =============================================================

A 503 after some records were sent may leave some of them in the log: the client
retries the same request, and the worker skips each run's ``seq`` it already applied,
so a request lands once downstream however often it is retried.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec
from litestar import Request, Router, post
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.openapi.spec import OpenAPIMediaType, Operation, RequestBody, Schema

from stepstream.api.event_log import EventLog, LogUnavailable
from stepstream.api.ingest_body import (
    JSON,
    NDJSON,
    ForeignCompany,
    LineError,
    LinesRefused,
    NotABatch,
    TooManyEvents,
    read_events,
)
from stepstream.api.problems import GUARDED, PREFIX, TITLES, ProblemError, problem, problem_responses
from stepstream.api.ratelimit import CompanyBuckets, retry_after
from stepstream.api.steps import CompanyParam
from stepstream.metrics import IngestMetrics

__all__ = ["Accepted", "Ingest", "IngestLimits", "LinesProblem", "ingest_router"]


@dataclass(frozen=True)
class IngestLimits:
    """Every bound of the route (``Settings.ingest_*``)."""

    max_body_bytes: int = 8 * 1024 * 1024
    max_events: int = 10_000
    max_event_bytes: int = 1_048_576
    max_requests: int = 32


@dataclass(frozen=True)
class Ingest:
    """What the route needs: where events go, the per-company buckets, the bounds, the metrics."""

    event_log: EventLog
    buckets: CompanyBuckets
    limits: IngestLimits
    metrics: IngestMetrics
    # With a topic, ``POST /v1/traces`` (api/otlp_http.py) produces OTLP to it.
    otlp_topic: str = ""
    # Ingest requests being served, both routes together (``limits.max_requests``).
    slots: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "slots", asyncio.Semaphore(self.limits.max_requests))

    # What both routes do alike (this one and ``POST /v1/traces``), in the order of the
    # module docstring's table.

    def refused(self, outcome: str, status: int, detail: str, headers: dict[str, str] | None = None) -> ProblemError:
        """The problem to raise, counted under ``outcome``."""
        self.metrics.requests.labels(outcome).inc()
        return ProblemError(problem(status, detail), headers)

    @asynccontextmanager
    async def slot(self, company: str) -> AsyncIterator[None]:
        """One of ``max_requests`` (503 ``busy`` when none is free), then 429 ``rate``
        when the company's bucket is already empty, before the body is read."""
        if self.slots.locked():
            raise self.refused("busy", 503, "too many ingest requests at once", {"Retry-After": "1"})
        async with self.slots:
            self._rate(self.buckets.wait_for(company))
            yield

    async def read_body(self, request: Request[Any, Any, Any]) -> bytes:
        """The whole body, or 413 ``body_too_large`` as soon as it passes ``max_body_bytes``."""
        chunks: list[bytes] = []
        try:
            async for chunk in request.stream():
                chunks.append(chunk)
        except RequestEntityTooLarge:
            raise self.refused("body_too_large", 413, f"the body is larger than {self.limits.max_body_bytes} bytes") from None
        return b"".join(chunks)

    async def produce(self, company: str, count: int, append: Callable[[], Awaitable[None]]) -> None:
        """Take ``count`` from the company's bucket (429 ``rate`` when it holds fewer),
        then ``append``; a 503 when the log is unavailable gives them back."""
        self._rate(self.buckets.take(company, count))
        try:
            await append()
        except LogUnavailable as exc:
            self.buckets.give_back(company, count)
            raise self.refused(
                exc.cause, 503, "the event log is unavailable", {"Retry-After": retry_after(exc.retry_after)}
            ) from None

    def _rate(self, wait: float) -> None:
        if wait > 0:
            raise self.refused("rate", 429, "the company's event rate is exhausted", {"Retry-After": retry_after(wait)})


class Accepted(msgspec.Struct, kw_only=True):
    """The broker acknowledged every event of the request."""

    accepted: int


class LinesProblem(msgspec.Struct, kw_only=True):
    """A 400 problem naming the refused lines (RFC 9457 with one extension, ``errors``)."""

    type: str
    title: str
    status: int
    detail: str
    errors: list[LineError]
    count: int


_lines_encoder = msgspec.json.Encoder()


@dataclass
class _Operation(Operation):
    """The route's OpenAPI operation with its request body (the handler reads the
    body itself, so Litestar cannot derive it)."""

    request_body: Any = field(default=None)

    def __post_init__(self) -> None:
        event = Schema(type="object", description="a wire v1 event (schemas/wire-v1.schema.json)")  # type: ignore[arg-type]
        self.request_body = RequestBody(
            required=True,
            description="Wire v1 events of the path's company: one per line, or one JSON array",
            content={
                NDJSON: OpenAPIMediaType(schema=Schema(type="string", description="one wire v1 event per line")),  # type: ignore[arg-type]
                JSON: OpenAPIMediaType(schema=Schema(type="array", items=event)),  # type: ignore[arg-type]
            },
        )


def ingest_router(ingest: Ingest, guards: list[object]) -> Router:
    """The route over ``ingest`` (module docstring), behind ``guards``."""
    event_log, limits, metrics, refused = ingest.event_log, ingest.limits, ingest.metrics, ingest.refused

    @post(
        "/events",
        opt={"scope": "ingest", "query": ()},
        status_code=202,
        summary="Write wire events of the company",
        operation_id="postEvents",
        request_max_body_size=limits.max_body_bytes,
        operation_class=_Operation,
        responses={
            **problem_responses(400, 413, 415, 429, *GUARDED),
        },
    )
    async def post_events(company: CompanyParam, request: Request[Any, Any, Any]) -> Accepted:
        """Wire v1 events (``application/x-ndjson``: one per line; ``application/json``:
        an array) of the path's company, produced to the raw topic keyed
        ``{company_id}/{run_id}``. 202 only once the broker acknowledged every event;
        every event's ``company_id`` must be the path's (else 403, nothing produced)."""
        media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media not in (NDJSON, JSON):
            raise refused("media_type", 415, f"the body must be {NDJSON} or {JSON}")
        async with ingest.slot(company):
            body = await ingest.read_body(request)
            try:
                records = read_events(
                    body, media, company, max_event_bytes=limits.max_event_bytes, max_events=limits.max_events
                )
            except NotABatch as exc:
                raise refused("not_a_batch", 400, f"the body is not a JSON array of events ({exc.reason})") from None
            except TooManyEvents:
                raise refused("too_many_events", 413, f"more than {limits.max_events} events in one request") from None
            except ForeignCompany as exc:
                raise refused("foreign_company", 403, str(exc)) from None
            except LinesRefused as exc:
                metrics.requests.labels("bad_lines").inc()
                for error in exc.errors:
                    metrics.rejected_lines.labels(error.reason).inc()
                if exc.count > len(exc.errors):
                    metrics.rejected_lines.labels("unlisted").inc(exc.count - len(exc.errors))
                raise _lines_problem(exc) from None
            if not records:
                raise refused("empty", 400, "the body holds no event")
            await ingest.produce(company, len(records), lambda: event_log.append(records))
        metrics.requests.labels("accepted").inc()
        metrics.events.inc(len(records))
        metrics.bytes.inc(sum(len(value) for _, value in records))
        return Accepted(accepted=len(records))

    return Router(
        "/v1/companies/{company:str}",
        route_handlers=[post_events],
        guards=guards,  # type: ignore[arg-type]
        security=[{"bearer": []}],
        tags=["ingest"],
    )


def _lines_problem(exc: LinesRefused) -> ProblemError:
    name, title = TITLES[400]
    body = problem(400, f"{exc.count} line(s) are not valid wire v1 events")
    content = _lines_encoder.encode(
        LinesProblem(type=PREFIX + name, title=title, status=400, detail=body.detail, errors=exc.errors, count=exc.count)
    )
    return ProblemError(body, content=content)
