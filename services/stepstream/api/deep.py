"""The deep routes: raw bodies (scope ``deep:read``) and their purge (``deep:purge``).

Only this module of the API touches the deep store. Purges go through the
:class:`~stepstream.sinks.ports.RetentionStore` port, the same methods
``stepstream purge`` uses, and answer with the number of bodies destroyed;
steps and run records stay.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import msgspec
from litestar import Router, delete, get
from litestar.response import Stream

from stepstream.api.problems import GUARDED, NOT_FOUND, ProblemError, problem, problem_responses
from stepstream.api.steps import CompanyParam, RunIdParam
from stepstream.core.records import DeepRecord
from stepstream.sinks.ports import DeepStore, RetentionStore, StepStore


class DeepBody(msgspec.Struct, kw_only=True):
    """The unredacted companion of one step. ``arguments`` and ``output`` are the
    raw JSON values as the agent sent them; a clipped one (``clipped``) is instead a
    string, the head of its text ending with a visible clip marker. ``reasoning`` is
    the whole thinking text."""

    step_seq: int
    kind: Literal["thinking", "tool", "llm", "state", "error"]
    ts: str
    reasoning: str | None
    arguments: Any
    output: Any
    clipped: bool


class DeepBodies(msgspec.Struct, kw_only=True):
    """A run's deep companions in ordinal order (empty once purged or pruned)."""

    company_id: str
    run_id: str
    bodies: list[DeepBody]


class Purged(msgspec.Struct, kw_only=True):
    """How many deep bodies (rows) a purge destroyed; 0 when repeated."""

    purged: int


def body_view(record: DeepRecord) -> DeepBody:
    return DeepBody(
        step_seq=record.step_seq,
        kind=record.kind,
        ts=record.ts,
        reasoning=record.reasoning,
        arguments=record.arguments,
        output=record.output,
        clipped=record.clipped,
    )


def deep_router(deep: DeepStore, retention: RetentionStore, steps: StepStore, guards: list[object]) -> Router:
    """``GET``/``DELETE .../runs/{run_id}/deep`` and ``DELETE .../deep``. A run is
    known when it has bodies or a run record; an unknown run is 404."""

    @get(
        "/runs/{run_id:str}/deep",
        opt={"scope": "deep:read"},
        summary="A run's deep companions (raw bodies)",
        operation_id="getRunDeep",
        responses=problem_responses(400, *GUARDED),
    )
    async def get_deep(company: CompanyParam, run_id: RunIdParam) -> DeepBodies:
        """Raw reasoning, arguments and output of every step of the run, capped and
        clipped as stored. Holds secrets: only for ``deep:read`` tokens."""
        rows = await deep.get_deep(company, run_id)
        if not rows and await steps.get_run(company, run_id) is None:
            raise ProblemError(NOT_FOUND)
        return DeepBodies(company_id=company, run_id=run_id, bodies=[body_view(r) for r in rows])

    @delete(
        "/runs/{run_id:str}/deep",
        opt={"scope": "deep:purge"},
        status_code=200,
        summary="Purge one run's deep bodies (steps stay)",
        operation_id="purgeRunDeep",
        responses=problem_responses(400, *GUARDED),
    )
    async def purge_run(company: CompanyParam, run_id: RunIdParam) -> Purged:
        """Destroy the run's bodies; its steps and run record stay. Repeating it
        answers ``purged: 0``."""
        purged = await retention.purge_run(company, run_id)
        if purged == 0 and await steps.get_run(company, run_id) is None:
            raise ProblemError(NOT_FOUND)
        return Purged(purged=purged)

    @delete(
        "/deep",
        opt={"scope": "deep:purge"},
        status_code=200,
        summary="Purge every deep body of the company (steps stay)",
        operation_id="purgeCompanyDeep",
        responses=problem_responses(400, *GUARDED),
    )
    async def purge_company(company: CompanyParam) -> Purged:
        """Destroy every body of the company; steps and run records stay."""
        return Purged(purged=await retention.purge_company(company))

    @get(
        "/runs/{run_id:str}/trace.sftrace",
        opt={"scope": "deep:read"},
        summary="A run as a .sftrace bundle (a tar, streamed)",
        operation_id="getRunBundle",
        media_type="application/x-tar",
        responses=problem_responses(400, 410, *GUARDED),
    )
    async def get_bundle(company: CompanyParam, run_id: RunIdParam) -> Stream:
        """The run's ``.sftrace`` bundle (docs/bundle.md) as a tar of
        ``<run_id>.sftrace/``: payloads redacted, hashed, with ``integrity.json``.
        410 when the run's bodies were pruned or purged (a bundle would be incomplete)."""
        from stepstream.bundle.build import BundleRefused, build_bundle
        from stepstream.bundle.tarball import tar_chunks

        run = await steps.get_run(company, run_id)
        if run is None:
            raise ProblemError(NOT_FOUND)
        step_seqs = [s.step_seq for s in await steps.get_steps(company, run_id)]
        rows = await deep.get_deep(company, run_id)
        try:  # CPU-bound (redaction, hashing): off the event loop
            bundle = await asyncio.to_thread(build_bundle, run, rows, company_id=company, step_seqs=step_seqs)
        except BundleRefused as exc:  # pruned, purged (or no event time at all)
            raise ProblemError(problem(410, f"no complete bundle ({exc.reason})")) from None
        top = f"{run_id}.sftrace"
        return Stream(
            tar_chunks(bundle, top),
            media_type="application/x-tar",
            headers={"Content-Disposition": f'attachment; filename="{top}.tar"'},
        )

    return Router(
        "/v1/companies/{company:str}",
        route_handlers=[get_deep, purge_run, purge_company, get_bundle],
        guards=guards,  # type: ignore[arg-type]
        security=[{"bearer": []}],
        tags=["deep"],
    )
