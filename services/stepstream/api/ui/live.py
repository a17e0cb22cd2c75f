"""The live tail of a running run: Server-Sent Events from the step store.

``GET /ui/companies/{company}/runs/{run_id}/live`` (scope ``steps:read``, the viewer's
guard: the sign-in cookie counts, since ``EventSource`` cannot send a header). The
stream polls the step store every ``tick_seconds`` and sends:

* ``snapshot`` first: ``{"run": Run, "steps": [Step, ...]}``, the whole run (at most
  :data:`STREAM_STEPS` steps);
* ``steps``: the run record and the steps that changed since the last event; steps
  are updated in place (a result, a late event), not only appended, so a step is sent
  again whenever any of its fields changes;
* ``end``: the run is no longer running (its last state), the token stopped being
  valid (revoked, or its scope gone), or the run is gone; the page stops listening;
* a ``: keepalive`` comment after ``keepalive_seconds`` without an event.

**Bounds.** The token is checked on every tick (a revoked token ends an open stream
within one tick); a stream lives at most ``stream_seconds``, then closes and the
browser's ``EventSource`` reconnects (and gets a fresh snapshot); at most
``max_streams`` streams are open per process, past that the route answers 503 with
``Retry-After``. Like the operator pages, this module never sees the deep store.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar import Request, Router, get
from litestar.params import FromPath
from litestar.response import Stream

from stepstream.api.tokens import TokenRegistry, TokensUnavailable
from stepstream.api.ui.pages import check_ids
from stepstream.api.ui.session import PageNotFound, PageUnavailable
from stepstream.api.views import run_view, step_view
from stepstream.sinks.ports import StepStore

STREAM_STEPS = 2000
_encode = msgspec.json.Encoder().encode


class LiveSettings(msgspec.Struct, frozen=True, kw_only=True):
    tick_seconds: float = 0.5
    keepalive_seconds: float = 15.0
    stream_seconds: float = 600.0
    max_streams: int = 64


def event(name: str, data: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _encode(data) + b"\n\n"


class Streams:
    """How many live streams are open (one owner: this counter)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0


async def tail(
    steps: StepStore, registry: TokenRegistry, token: str, company: str, run_id: str, settings: LiveSettings
) -> AsyncIterator[bytes]:
    """The event stream of one run (module docstring)."""
    sent_steps: dict[int, bytes] = {}
    sent_run = b""
    started = last_sent = time.monotonic()
    yield b"retry: 2000\n\n"
    first = True
    while True:
        try:
            principal = registry.authenticate(token)
        except TokensUnavailable:
            principal = None  # fail closed: the stream ends, the page shows it
        if principal is None or principal.company != company or "steps:read" not in principal.scopes:
            yield event("end", {"reason": "signed_out", "run": None, "steps": []})
            return
        record = await steps.get_run(company, run_id)
        if record is None:
            yield event("end", {"reason": "gone", "run": None, "steps": []})
            return
        run = run_view(record)
        changed = []
        for row in await steps.get_steps(company, run_id, limit=STREAM_STEPS):
            view = step_view(row)
            encoded = _encode(view)
            if sent_steps.get(view.step_seq) != encoded:
                sent_steps[view.step_seq] = encoded
                changed.append(view)
        encoded_run = _encode(run)
        now = time.monotonic()
        if first or changed or encoded_run != sent_run:
            yield event("snapshot" if first else "steps", {"run": run, "steps": changed})
            first, sent_run, last_sent = False, encoded_run, now
        elif now - last_sent >= settings.keepalive_seconds:
            yield b": keepalive\n\n"
            last_sent = now
        if run.status != "running":
            yield event("end", {"reason": run.status, "run": run, "steps": []})
            return
        if now - started >= settings.stream_seconds:
            return  # the browser reconnects and gets a fresh snapshot
        await asyncio.sleep(settings.tick_seconds)


async def counted(streams: Streams, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        streams.open -= 1


def live_router(steps: StepStore, registry: TokenRegistry, guards: list[Any], settings: LiveSettings) -> Router:
    streams = Streams(settings.max_streams)

    @get("/runs/{run_id:str}/live", opt={"scope": "steps:read", "query": ()})
    async def live(request: Request[Any, Any, Any], company: FromPath[str], run_id: FromPath[str]) -> Stream:
        check_ids(company, run_id)
        if await steps.get_run(company, run_id) is None:
            raise PageNotFound()
        if streams.open >= streams.limit:
            raise PageUnavailable()
        streams.open += 1
        chunks = tail(steps, registry, request.scope["stepstream_token"], company, run_id, settings)
        return Stream(
            counted(streams, chunks),
            media_type="text/event-stream",
            headers={"X-Accel-Buffering": "no"},
        )

    return Router("/ui/companies/{company:str}", route_handlers=[live], guards=guards, include_in_schema=False)
