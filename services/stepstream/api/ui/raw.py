"""The viewer's deep routes: a step's raw body, for the "show raw" button, and the
run's ``.sftrace`` download.

The only viewer module that touches the deep store (the operator pages cannot: see
``api/ui/pages.py``). It answers what ``GET /v1/.../runs/{run_id}/deep/{step_seq}``
answers (:func:`stepstream.api.deep.step_body`), to the viewer's guard (the sign-in
cookie), only for a ``deep:read`` token, one step per request. The page renders the
body as text (``textContent`` in a ``<pre>``), never as HTML. The download is the
``/v1`` bundle route's answer (:func:`stepstream.api.deep.bundle_stream`, same bounds),
so a link on the page can fetch it with the cookie.
"""

from __future__ import annotations

import re
from typing import Any

from litestar import Request, Router, get
from litestar.response import Stream
from litestar.params import FromPath

from stepstream.api.deep import MAX_STEP_SEQ, DeepStep, bundle_stream, step_body
from stepstream.api.exports import ExportSlots
from stepstream.api.ui.pages import check_ids
from stepstream.api.ui.session import PageNotFound
from stepstream.sinks.ports import DeepStore, StepStore

_SEQ = re.compile(r"^(0|[1-9][0-9]{0,17})$")

def raw_router(deep: DeepStore, steps: StepStore, guards: list[Any], slots: ExportSlots) -> Router:
    """``GET /ui/companies/{company}/runs/{run_id}/raw/{step_seq}`` and
    ``.../runs/{run_id}/trace.sftrace`` (scope ``deep:read``)."""

    @get("/runs/{run_id:str}/raw/{step_seq:str}", opt={"scope": "deep:read", "query": ()})
    async def raw_body(company: FromPath[str], run_id: FromPath[str], step_seq: FromPath[str]) -> DeepStep:
        check_ids(company, run_id)
        if not _SEQ.fullmatch(step_seq) or int(step_seq) > MAX_STEP_SEQ:
            raise PageNotFound()
        found = await step_body(deep, steps, company, run_id, int(step_seq))
        if found is None:
            raise PageNotFound()
        return found

    @get("/runs/{run_id:str}/trace.sftrace", opt={"scope": "deep:read", "query": ()})
    async def download(request: Request[Any, Any, Any], company: FromPath[str], run_id: FromPath[str]) -> Stream:
        check_ids(company, run_id)
        return await bundle_stream(request, steps, deep, slots, company, run_id)

    return Router(
        "/ui/companies/{company:str}", route_handlers=[raw_body, download], guards=guards, include_in_schema=False
    )
