"""The operator routes: runs and steps, read from the step store alone.

This module is isolated from the deep store by construction: it receives a
:class:`~stepstream.sinks.ports.StepStore` and nothing else, and it imports no
deep store type, backend or route (``tests/unit/test_api_isolation.py`` scans
its imports), so no code path here can reach a raw body.
"""

from __future__ import annotations

import re
from typing import Annotated

from litestar import Router, get
from litestar.params import Parameter

from stepstream.api.problems import GUARDED, NOT_FOUND, ProblemError, problem, problem_responses
from stepstream.api.views import RunDetail, RunsPage, run_view, step_view
from stepstream.core.wire import END, CompanyId, RunId
from stepstream.sinks.ports import InvalidCursor, StepStore

MAX_LIMIT = 200
DEFAULT_LIMIT = 50
CURSOR_MAX_CHARS = 1024
# A run's steps, a page at a time: at most 200 steps of at most the argument cap each.
MAX_STEPS_LIMIT = 200
DEFAULT_STEPS_LIMIT = 100
STEP_CURSOR_PATTERN = r"^(0|[1-9][0-9]{0,15})$"  # a step_seq, in decimal
_STEP_CURSOR = re.compile(STEP_CURSOR_PATTERN.strip("^$"))
COMPANY_PATTERN = CompanyId.__metadata__[0].pattern
RUN_PATTERN = RunId.__metadata__[0].pattern

CompanyParam = Annotated[str, Parameter(description="Company id", pattern=COMPANY_PATTERN)]
RunIdParam = Annotated[str, Parameter(description="Run id (unique within the company)", pattern=RUN_PATTERN)]


def steps_router(store: StepStore, guards: list[object]) -> Router:
    """``GET /v1/companies/{company}/runs`` and ``.../runs/{run_id}`` (scope ``steps:read``)."""

    @get(
        "/runs",
        opt={"scope": "steps:read", "query": ("limit", "before")},
        summary="List runs, most recent first",
        operation_id="listRuns",
        responses=problem_responses(400, *GUARDED),
    )
    async def list_runs(
        company: CompanyParam,
        limit: Annotated[int, Parameter(ge=1, le=MAX_LIMIT, description=f"Page size, 1..{MAX_LIMIT}")] = DEFAULT_LIMIT,
        before: Annotated[
            str | None,
            Parameter(
                max_length=CURSOR_MAX_CHARS,
                pattern=r"^[A-Za-z0-9_-]+" + END,
                description="The next_cursor of the previous page (opaque; one the API did not make is a 400)",
            ),
        ] = None,
    ) -> RunsPage:
        """Runs of the company, most recent first (by start time, then run id), with
        an opaque cursor for the next page."""
        try:
            page = await store.list_runs_page(company, limit=limit, before=before)
        except InvalidCursor:
            raise ProblemError(problem(400, "before is not a cursor this API made")) from None
        return RunsPage(runs=[run_view(r) for r in page.runs], next_cursor=page.next_cursor)

    @get(
        "/runs/{run_id:str}",
        opt={"scope": "steps:read", "query": ("limit", "after")},
        summary="A run record and a page of its steps",
        operation_id="getRun",
        responses=problem_responses(400, *GUARDED),
    )
    async def get_run(
        company: CompanyParam,
        run_id: RunIdParam,
        limit: Annotated[
            int, Parameter(ge=1, le=MAX_STEPS_LIMIT, description=f"Steps per page, 1..{MAX_STEPS_LIMIT}")
        ] = DEFAULT_STEPS_LIMIT,
        after: Annotated[
            str | None,
            Parameter(
                max_length=16,
                pattern=STEP_CURSOR_PATTERN,
                description="The next_cursor of the previous page: the page starts after this step_seq",
            ),
        ] = None,
    ) -> RunDetail:
        """The run record and a page of its steps in ordinal order: redacted
        arguments and shapes, never raw reasoning, arguments or output. The page
        holds the steps after ``after`` (from the first when absent), at most
        ``limit``; ``next_cursor`` is set when more follow."""
        if after is not None and not _STEP_CURSOR.fullmatch(after):
            raise ProblemError(problem(400, "after is not a cursor this API made"))
        record = await store.get_run(company, run_id)
        if record is None:
            raise ProblemError(NOT_FOUND)
        # One more than the page: whether a next page exists, without a count.
        steps = await store.get_steps(company, run_id, after=None if after is None else int(after), limit=limit + 1)
        next_cursor = str(steps[limit - 1].step_seq) if len(steps) > limit else None
        return RunDetail(run=run_view(record), steps=[step_view(s) for s in steps[:limit]], next_cursor=next_cursor)

    return Router(
        "/v1/companies/{company:str}",
        route_handlers=[list_runs, get_run],
        guards=guards,  # type: ignore[arg-type]
        security=[{"bearer": []}],
        tags=["runs"],
    )
