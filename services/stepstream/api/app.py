"""The read API's composition: routes, problem handling, metrics, access log.

:func:`create_app` takes open stores, a :class:`TokenRegistry` and an
:class:`~stepstream.metrics.ApiMetrics` and returns an ASGI app (served by
uvicorn in ``stepstream api``, called in process by the tests). The operator
routes get the step store only (:mod:`stepstream.api.steps`); the deep routes
get the deep store (:mod:`stepstream.api.deep`).

Error policy, by class: :class:`ProblemError` is answered as it says; Litestar's
own client errors (no route, wrong method, invalid parameter) become the problem
of their status, an invalid parameter naming the parameter but never its value;
:class:`SinkUnavailable` is 503 with ``Retry-After``; any other exception is 500,
logged with its traceback, and its text never reaches the client.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from litestar import Litestar, Request, Response, get
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from stepstream.api.auth import make_guard
from stepstream.api.deep import deep_router
from stepstream.api.ingest import Ingest, ingest_router
from stepstream.api.otlp_http import otlp_router
from stepstream.api.exports import DEFAULT_MAX_EXPORTS, DEFAULT_WAIT_SECONDS, ExportSlots, Slot
from stepstream.api.problems import NOT_FOUND, PROBLEM_MEDIA_TYPE, Problem, ProblemError, encode, problem
from stepstream.api.steps import steps_router
from stepstream.api.tokens import TokenRegistry
from stepstream.api.ui import viewer
from stepstream.api.ui.live import LiveSettings
from stepstream.api.views import Health
from stepstream.errors import SinkUnavailable
from stepstream.metrics import ApiMetrics
from stepstream.sinks.ports import DeepStore, StepStore

log = logging.getLogger("stepstream.api")
access_log = logging.getLogger("stepstream.api.access")

API_VERSION = "1"


def problem_response(body: Problem, headers: dict[str, str] | None = None) -> Response[bytes]:
    return Response(content=encode(body), status_code=body.status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


def _on_problem(_: Request[Any, Any, Any], exc: ProblemError) -> Response[bytes]:
    if exc.content is not None:
        return Response(content=exc.content, status_code=exc.body.status, media_type=PROBLEM_MEDIA_TYPE, headers=exc.headers)
    return problem_response(exc.body, exc.headers)


def _on_http(_: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    if exc.status_code == 404:
        return problem_response(NOT_FOUND)
    if isinstance(exc, ValidationException):
        names = sorted({str(e.get("key")) for e in (exc.extra or []) if isinstance(e, dict) and e.get("key")})
        return problem_response(problem(400, f"invalid parameter: {', '.join(names) or 'request'}"))
    status = exc.status_code if 400 <= exc.status_code < 600 else 500
    if status >= 500:
        log.error("HTTP error %d", status, exc_info=exc)
        return problem_response(problem(500, "internal error"))
    detail = "method not allowed" if status == 405 else "request refused"
    allow = {k: v for k, v in (exc.headers or {}).items() if k.lower() == "allow"}
    return problem_response(problem(status, detail), allow)


def _on_unavailable(_: Request[Any, Any, Any], exc: SinkUnavailable) -> Response[bytes]:
    log.warning("store unavailable: %s", exc)
    return problem_response(problem(503, "a store is unavailable"), {"Retry-After": "1"})


def _on_error(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    log.error("unhandled error on %s %s", request.method, request.scope.get("path_template", "?"), exc_info=exc)
    return problem_response(problem(500, "internal error"))


async def _send_not_found(send: Any) -> None:
    """The 404 problem, sent before Litestar sees the request (same bytes as its own)."""
    body = encode(NOT_FOUND)
    headers = [(b"content-type", PROBLEM_MEDIA_TYPE.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 404, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def reject_unknown_query(request: Request[Any, Any, Any]) -> None:
    """A query parameter the route does not declare (its ``opt["query"]``) is a 400,
    so that a typo (``?limt=5``) is an error, not a silently ignored wish."""
    unknown = set(request.query_params) - set(request.route_handler.opt.get("query", ()))
    if unknown:
        raise ProblemError(problem(400, "unknown query parameter"))


# On every response (pages, JSON, streams): no inline script or style, Trusted Types
# required for every DOM sink, never framed; no Referer (run ids are in URLs).
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'; "
    "require-trusted-types-for 'script'; trusted-types 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"referrer-policy", b"no-referrer"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
]

# Every label value must come from a fixed set: h11 accepts any token as a method,
# and a label per distinct method would grow /metrics (and the heap) for ever.
METHOD_LABELS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"})


def method_label(method: str) -> str:
    """The request's method as a metric label: one of :data:`METHOD_LABELS`, else ``other``."""
    return method if method in METHOD_LABELS else "other"


def status_label(status: int) -> str:
    """The response status as a metric label: an HTTP status code (100..599), else ``other``."""
    return str(status) if 100 <= status <= 599 else "other"


class RequestInfo:
    """Filled while a request is served: the token id (for the access log) and the
    export slots the request holds (given back when its ASGI call ends, whether
    the body was sent whole or the client went away)."""

    __slots__ = ("token_id", "slots")

    def __init__(self) -> None:
        self.token_id: str | None = None
        self.slots: list[Slot] = []


class ApiApp:
    """The ASGI app: Litestar inside, request metrics and the access log around it.

    Labels are route templates; a path that matches no route is ``unmatched``; a
    method outside :data:`METHOD_LABELS` is ``other``; a status is its code.
    Every response carries ``Cache-Control: no-store``.
    An encoded slash (``%2F``) in the path is refused as 404 before routing: no
    valid id contains one, and decoding it would route to another handler."""

    def __init__(self, litestar: Litestar, metrics: ApiMetrics, exports: ExportSlots | None = None) -> None:
        self.litestar = litestar
        self.metrics = metrics
        self.exports = exports if exports is not None else ExportSlots()  # deep reads and bundles in progress
        # Litestar's automatic OPTIONS answer lists the methods its route held when
        # the first handler of a path was added; the route's final set is this.
        self.allow: dict[str, bytes] = {
            route.path_format: ", ".join(sorted(route.methods)).encode() for route in litestar.routes
        }

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.litestar(scope, receive, send)
            return
        started = time.perf_counter()
        info = RequestInfo()
        scope["stepstream"] = info
        status = 500

        async def send_and_watch(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                if scope.get("method") == "OPTIONS" and scope.get("path_template") in self.allow:
                    headers = [(k, v) for k, v in headers if k.lower() != b"allow"]
                    headers.append((b"allow", self.allow[scope["path_template"]]))
                # Tenant data (and deep bodies, secrets by design) never sit in a shared cache.
                headers.append((b"cache-control", b"no-store"))
                headers.extend(SECURITY_HEADERS)
                message = {**message, "headers": headers}
            await send(message)

        try:
            if b"%2f" in (scope.get("raw_path") or b"").lower():
                await _send_not_found(send_and_watch)
            else:
                await self.litestar(scope, receive, send_and_watch)
        finally:
            for slot in info.slots:
                slot.release()
            elapsed = time.perf_counter() - started
            # Litestar's route template (a fixed set), never the raw path.
            route = scope.get("path_template") or "unmatched"
            method = method_label(scope.get("method", ""))
            self.metrics.requests.labels(method, route, status_label(status)).inc()
            self.metrics.latency.labels(method, route).observe(elapsed)
            access_log.info(
                "%s %s %d %.1fms caller=%s", method, route, status, elapsed * 1000, info.token_id or "-"
            )


def create_app(
    steps: StepStore,
    deep: DeepStore,
    tokens: TokenRegistry,
    metrics: ApiMetrics,
    *,
    max_exports: int = DEFAULT_MAX_EXPORTS,
    export_wait_seconds: float = DEFAULT_WAIT_SECONDS,
    live: LiveSettings | None = None,
    ingest: Ingest | None = None,
) -> ApiApp:
    """The API over open stores. The stores stay the caller's to close. At most
    ``max_exports`` deep reads and bundle builds run at once (``api.exports``); a
    request waits up to ``export_wait_seconds`` for a slot, then gets 503. The run
    viewer (``api.ui``) is served under ``/ui``; ``live`` bounds its live streams. With
    ``ingest``, ``POST /v1/companies/{company}/events`` writes events (``api.ingest``);
    its event log stays the caller's to start and close; with its ``otlp_topic`` too,
    ``POST /v1/traces`` exports OTLP to that topic (``api.otlp_http``)."""
    guards = [make_guard(tokens)]
    slots = ExportSlots(max_exports, export_wait_seconds, metrics)
    pages = viewer(steps, deep, tokens, slots, live)

    @get("/healthz", summary="Liveness", operation_id="healthz", tags=["ops"])
    async def healthz() -> Health:
        """200 while the process serves requests."""
        return Health()

    @get("/metrics", summary="Prometheus metrics", operation_id="metrics", media_type=CONTENT_TYPE_LATEST, tags=["ops"])
    async def metrics_text() -> str:
        """Request counts by route template and status, latency histogram."""
        return generate_latest(metrics.registry).decode("utf-8")

    handlers: list[Any] = [healthz, metrics_text, steps_router(steps, guards), deep_router(deep, deep, steps, guards, slots)]
    if ingest is not None:
        handlers.append(ingest_router(ingest, guards))
        if ingest.otlp_topic:
            handlers.append(otlp_router(ingest, ingest.otlp_topic, guards))
    litestar = Litestar(
        route_handlers=[*handlers, pages.router],
        template_config=pages.template_config,
        exception_handlers={
            ProblemError: _on_problem,
            HTTPException: _on_http,
            SinkUnavailable: _on_unavailable,
            Exception: _on_error,
        },
        openapi_config=OpenAPIConfig(
            title="stepstream read API",
            version=API_VERSION,
            path="/openapi.json",
            render_plugins=[JsonRenderPlugin(path="/")],
            components=Components(
                security_schemes={
                    "bearer": SecurityScheme(type="http", scheme="bearer", description="stepstream API token (sst_...)")
                }
            ),
            use_handler_docstrings=True,
        ),
        logging_config=None,
        before_request=reject_unknown_query,
        debug=False,
    )
    return ApiApp(litestar, metrics, slots)


