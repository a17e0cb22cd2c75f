"""The operator routes: runs and steps, read from the step store alone.

This module is isolated from the deep store by construction: it receives a
:class:`~stepstream.sinks.ports.StepStore` and nothing else, and it imports no
deep store type, backend or route (``tests/unit/test_api_isolation.py`` scans
its imports), so no code path here can reach a raw body.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Annotated, Literal

from litestar import Router, get
from litestar.params import Parameter

from stepstream.api.problems import GUARDED, NOT_FOUND, ProblemError, problem, problem_responses
from stepstream.api.views import RunDetail, RunsPage, run_view, step_view
from stepstream.core.timefmt import TS_MAX, TS_MIN, format_ts
from stepstream.core.wire import END, CompanyId, RunId
from stepstream.sinks.ports import InvalidCursor, RunFilter, StepStore

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

AGENT_MAX_CHARS = 256  # the wire's agent_name bound
TIME_MAX_CHARS = 64
RunStatus = Literal["running", "completed", "failed", "abandoned"]
FILTER_QUERY = ("status", "agent", "since", "until", "problems")


def window_time(name: str, value: datetime | str | None) -> str | None:
    """A time of the query as stored (``core.timefmt``); a time without an offset is
    UTC. A time outside the event window is clamped to it (no run lies outside it);
    text that is not an RFC 3339 time is a 400."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            if "t" not in value.lower():  # a date, a number: not a date-time
                raise ValueError(name)
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ProblemError(problem(400, f"{name} is not an RFC 3339 time")) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    try:
        value = min(max(value, TS_MIN), TS_MAX)
    except OverflowError:  # an offset that moves a time past year 1 or 9999: outside the window
        value = TS_MIN if value.year < 5000 else TS_MAX
    return format_ts(value)


def run_filter(
    status: str | None, agent: str | None, since: datetime | str | None, until: datetime | str | None, problems: bool
) -> RunFilter:
    """The store filter of a runs listing (``/v1`` and the viewer parse the same way)."""
    return RunFilter(
        status=status,
        agent=agent,
        since=window_time("since", since),
        until=window_time("until", until),
        problems=problems,
    )


CompanyParam = Annotated[str, Parameter(description="Company id", pattern=COMPANY_PATTERN)]
RunIdParam = Annotated[str, Parameter(description="Run id (unique within the company)", pattern=RUN_PATTERN)]


def steps_router(store: StepStore, guards: list[object]) -> Router:
    """``GET /v1/companies/{company}/runs`` and ``.../runs/{run_id}`` (scope ``steps:read``)."""

    @get(
        "/runs",
        opt={"scope": "steps:read", "query": ("limit", "before", *FILTER_QUERY)},
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
        status: Annotated[RunStatus | None, Parameter(description="Only runs with this status")] = None,
        agent: Annotated[
            str | None, Parameter(min_length=1, max_length=AGENT_MAX_CHARS, description="Only runs of this agent_name")
        ] = None,
        since: Annotated[
            str | None,
            Parameter(
                schema_extra={"format": "date-time"},
                max_length=TIME_MAX_CHARS,
                description="Only runs that started (else last had an event) at or after this RFC 3339 time",
            ),
        ] = None,
        until: Annotated[
            str | None,
            Parameter(
                schema_extra={"format": "date-time"},
                max_length=TIME_MAX_CHARS,
                description="Only runs that started (else last had an event) before this RFC 3339 time",
            ),
        ] = None,
        problems: Annotated[
            bool,
            Parameter(
                description="Only runs with a problem: seq_gaps, late_events or dropped_steps above 0, "
                "truncated, or status failed or abandoned"
            ),
        ] = False,
    ) -> RunsPage:
        """Runs of the company, most recent first (by start time, then run id), with
        an opaque cursor for the next page. The filters are applied by the store's
        query, so a page is full whenever enough runs match; a cursor belongs to the
        filters it was made with."""
        where = run_filter(status, agent, since, until, problems)
        try:
            page = await store.list_runs_page(company, limit=limit, before=before, where=where)
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
