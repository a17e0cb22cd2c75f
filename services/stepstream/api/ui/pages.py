"""The viewer's operator pages: a company's runs, one run, two runs compared.

Like ``api/steps.py`` this module gets the step store and nothing else, and imports
no deep store type, backend or route (``tests/unit/test_api_isolation.py`` scans
it): no code path of these pages can reach a raw body. A page shows the operator
view (labels, redacted arguments, shapes); a ``deep:read`` token gets a "show raw"
button per step, which fetches that one body from ``api/ui/raw.py``.

Every page names its JSON twin under ``/v1`` and the ``curl`` line for it (the
token left as ``$STEPSTREAM_TOKEN``). Query values are bounded and parsed here, as
``/v1`` parses them (``api.steps.run_filter``); a path id that is not a valid id is
the same 404 page as a missing run.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlencode

import msgspec
from litestar import Request, Router, get
from litestar.params import FromPath
from litestar.response import Template

from stepstream.api.problems import ProblemError, problem
from stepstream.api.steps import COMPANY_PATTERN, MAX_LIMIT, RUN_PATTERN, run_filter
from stepstream.api.ui import present
from stepstream.api.ui.session import PageNotFound, principal_of
from stepstream.api.views import Run, Step, run_view, step_view
from stepstream.sinks.ports import InvalidCursor, RunFilter, StepStore

RUNS_PER_PAGE = MAX_LIMIT  # 200 runs at most on a page
STEPS_PER_PAGE = 500  # a run page shows at most this many steps; the rest on the next pages
COMPARE_STEPS = 2000  # the steps of each side a comparison reads, at most
QUERY_MAX_CHARS = 256
STATUSES = ("running", "completed", "failed", "abandoned")
RUN_ICONS = {"running": "\u25b6", "completed": "\u2713", "failed": "\u2716", "abandoned": "\u2205"}
RUNS_QUERY = ("status", "agent", "since", "until", "problems", "before")
_COMPANY = re.compile(COMPANY_PATTERN)
_RUN = re.compile(RUN_PATTERN)
_SEQ = re.compile(r"^(0|[1-9][0-9]{0,15})$")


def check_ids(company: str, run_id: str | None = None) -> None:
    """A path id that no run can have answers like a missing run."""
    if not _COMPANY.fullmatch(company) or (run_id is not None and not _RUN.fullmatch(run_id)):
        raise PageNotFound()


def query_value(request: Request[Any, Any, Any], name: str) -> str | None:
    """A query value, ``None`` when absent or empty; one over the bound is a 400."""
    value = request.query_params.get(name)
    if value is None or value == "":
        return None
    if len(value) > QUERY_MAX_CHARS:
        raise ProblemError(problem(400, f"{name} is too long"))
    return value


def form_time(text: str | None) -> str | None:
    """A form's time: a bare date means its midnight (the /v1 route wants a date-time)."""
    if text is not None and "t" not in text.lower():
        return f"{text}T00:00"
    return text


def shell(request: Request[Any, Any, Any], json_path: str, extra: list[str] | None = None) -> dict[str, Any]:
    base = str(request.base_url).rstrip("/")
    return {
        "json_path": json_path,
        "curl": f"curl -H \"Authorization: Bearer $STEPSTREAM_TOKEN\" '{base}{json_path}'",
        "extra_commands": extra or [],
    }


def ended_by_last_event(run: Run) -> str | None:
    """A finished run without ``ended_at`` (abandoned) lasted until its last event."""
    return run.last_event_at if run.status != "running" else None


def step_row(step: Step) -> dict[str, Any]:
    row = msgspec.structs.asdict(step)
    row["took"] = present.duration(step.started_at, step.ended_at)
    row["pretty"], row["pretty_chars"] = present.pretty(step.arguments)
    row["preview_chars"] = present.PREVIEW_CHARS
    return row


def pages_router(steps: StepStore, guards: list[Any]) -> Router:
    """``/ui/companies/{company}/...``: runs, a run, a comparison (scope ``steps:read``)."""

    @get("/runs", opt={"scope": "steps:read", "query": RUNS_QUERY})
    async def runs_page(request: Request[Any, Any, Any], company: FromPath[str]) -> Template:
        check_ids(company)
        form = {name: query_value(request, name) for name in RUNS_QUERY}
        error, status_code = None, 200
        where = RunFilter()
        try:
            if form["status"] is not None and form["status"] not in STATUSES:
                raise ProblemError(problem(400, "status is not a run status"))
            since, until = form_time(form["since"]), form_time(form["until"])
            where = run_filter(form["status"], form["agent"], since, until, form["problems"] == "true")
            page = await steps.list_runs_page(company, limit=RUNS_PER_PAGE, before=form["before"], where=where)
        except ProblemError as exc:
            error, status_code, page = exc.body.detail, 400, None
        except InvalidCursor:
            error, status_code, page = "That page link is not one this viewer made.", 400, None
        runs = [run_view(r) for r in page.runs] if page is not None else []
        kept = {k: v for k, v in form.items() if v is not None and k != "before"}
        next_page = None
        if page is not None and page.next_cursor is not None:
            next_page = f"/ui/companies/{company}/runs?{urlencode({**kept, 'before': page.next_cursor})}"
        json_query = urlencode({**kept, **({"problems": "true"} if where.problems else {})})
        json_path = f"/v1/companies/{company}/runs" + (f"?{json_query}" if json_query else "")
        return Template(
            template_name="runs.html",
            status_code=status_code,
            context={
                "company": principal_of(request).company,
                "statuses": STATUSES,
                "where": where,
                "form": {"since": form["since"] or "", "until": form["until"] or ""},
                "error": error,
                "runs": [
                    {
                        "run": r,
                        "status_icon": RUN_ICONS[r.status],
                        "duration": present.duration(r.started_at, r.ended_at or ended_by_last_event(r)),
                        "integrity": present.integrity_summary(r),
                    }
                    for r in runs
                ],
                "next_page": next_page,
                **shell(request, json_path),
            },
        )

    @get("/runs/{run_id:str}", opt={"scope": "steps:read", "query": ("after",)})
    async def run_page(request: Request[Any, Any, Any], company: FromPath[str], run_id: FromPath[str]) -> Template:
        check_ids(company, run_id)
        after_text = query_value(request, "after")
        if after_text is not None and not _SEQ.fullmatch(after_text):
            raise PageNotFound()
        record = await steps.get_run(company, run_id)
        if record is None:
            raise PageNotFound()
        after = None if after_text is None else int(after_text)
        rows = await steps.get_steps(company, run_id, after=after, limit=STEPS_PER_PAGE + 1)
        page_steps = [step_view(s) for s in rows[:STEPS_PER_PAGE]]
        run = run_view(record)
        state = (await steps.load_states(company, [run_id])).get(run_id)
        axis, bars = present.timeline(run, page_steps)
        principal = principal_of(request)
        can_raw = "deep:read" in principal.scopes
        next_page = None
        if len(rows) > STEPS_PER_PAGE:
            next_page = f"/ui/companies/{company}/runs/{run_id}?after={page_steps[-1].step_seq}"
        extra = [
            f"stepstream export --company {company} --run {run_id} -o out/",
            f"stepstream verify out/{run_id}.sftrace",
            f"stepstream replay out/{run_id}.sftrace --against NEW_RUN_EVENTS.jsonl",
        ]
        if can_raw:
            base = str(request.base_url).rstrip("/")
            extra.append(
                f"curl -OJ -H \"Authorization: Bearer $STEPSTREAM_TOKEN\" "
                f"'{base}/v1/companies/{company}/runs/{run_id}/trace.sftrace'"
            )
        linked: dict[str, list[int]] = {}
        for s in page_steps:
            if s.call_id is not None:
                linked.setdefault(s.call_id, []).append(s.step_seq)
        return Template(
            template_name="run.html",
            context={
                "company": principal.company,
                "run": run,
                "status_icon": RUN_ICONS[run.status],
                "findings": present.integrity(run, state.skipped_seqs if state is not None else ()),
                "axis": axis,
                "bars": bars,
                "steps": [step_row(s) for s in page_steps],
                "icons": present.KIND_ICONS,
                "statuses": present.STATUS_WORDS,
                "linked": linked,
                "can_raw": can_raw,
                "live_path": f"/ui/companies/{company}/runs/{run_id}/live" if run.status == "running" else None,
                "next_page": next_page,
                **shell(request, f"/v1/companies/{company}/runs/{run_id}", extra),
            },
        )

    @get("/compare", opt={"scope": "steps:read", "query": ("a", "b")})
    async def compare_page(request: Request[Any, Any, Any], company: FromPath[str]) -> Template:
        check_ids(company)
        a, b = query_value(request, "a"), query_value(request, "b")
        context: dict[str, Any] = {"company": principal_of(request).company, "a": a, "b": b, "error": None}
        status_code = 200
        if a is not None and b is not None:
            found: list[tuple[Run, list[Step]] | None] = []
            for run_id in (a, b):
                record = await steps.get_run(company, run_id) if _RUN.fullmatch(run_id) else None
                if record is None:
                    found.append(None)
                    continue
                rows = await steps.get_steps(company, run_id, limit=COMPARE_STEPS)
                found.append((run_view(record), [step_view(s) for s in rows]))
            missing = [run_id for run_id, f in zip((a, b), found) if f is None]
            if missing:
                context["error"] = f"No run {' and no run '.join(missing)} in this company."
                status_code = 404
            else:
                assert found[0] is not None and found[1] is not None
                comparison = present.compare(found[0][1], found[1][1])
                context["comparison"] = comparison
                context["verdict"] = present.divergence_words(comparison)
        json_path = f"/v1/companies/{company}/runs/{a or 'RUN_A'}"
        context.update(shell(request, json_path))
        return Template(template_name="compare.html", context=context, status_code=status_code)

    return Router(
        "/ui/companies/{company:str}",
        route_handlers=[runs_page, run_page, compare_page],
        guards=guards,
        include_in_schema=False,
    )
