"""The deep routes: raw bodies (scope ``deep:read``), one run's or one step's, and their
purge (``deep:purge``).

Only this module of the API touches the deep store. Purges go through the
:class:`~stepstream.sinks.ports.RetentionStore` port, the same methods
``stepstream purge`` uses, and answer with the number of bodies destroyed;
steps and run records stay.

**Streaming.** The deep route writes its JSON body a page of rows at a time
(``DeepStore.get_deep`` ranges of ``bundle.export.PAGE_ROWS`` rows), and the bundle route
builds the bundle a page at a time into spooled temporary files (in memory up to
:data:`SPOOL_BYTES` each, then on disk) and streams their tar. Either holds about
one page of bodies in memory, and at most ``ExportSlots.limit`` of them run at
once (``api.exports``). Pages are read one after the other, not as one snapshot: a
body written meanwhile may or may not be included, a purge meanwhile ends the list
early. A store failure after the first byte is sent cannot become a problem
response: the connection is closed before the body is complete, so a client sees
a truncated body, never a wrong one.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from typing import IO, Annotated, Any, Literal

import msgspec
from litestar import Request, Router, delete, get
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import Parameter
from litestar.response import Stream

from stepstream.api.exports import ExportSlots, Held, Slot
from stepstream.api.problems import GUARDED, NOT_FOUND, ProblemError, problem, problem_responses
from stepstream.api.steps import CompanyParam, RunIdParam
from stepstream.bundle.build import FILE_ORDER, BundleRefused
from stepstream.bundle.export import PAGE_ROWS, write_from_stores
from stepstream.bundle.tarball import tar_chunks
from stepstream.core.records import DeepRecord
from stepstream.sinks.ports import DeepStore, RetentionStore, StepStore

# The largest step_seq a path may name: exact as a JSON number (a float), so the
# OpenAPI bound means what it says to every client.
MAX_STEP_SEQ = 2**53 - 1
SPOOL_BYTES = 1 << 20  # a bundle file above this goes to a temporary file on disk
_encoder = msgspec.json.Encoder()


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


class DeepStep(msgspec.Struct, kw_only=True):
    """The raw body of one step: ``present`` with its ``body``; ``pruned`` when retention
    dropped the run's bodies; ``absent`` when there is none (purged, or a step that never
    had one). ``body`` is ``null`` unless ``present``."""

    state: Literal["present", "pruned", "absent"]
    body: DeepBody | None


async def step_body(deep: DeepStore, steps: StepStore, company: str, run_id: str, step_seq: int) -> DeepStep | None:
    """One step's raw body (one row read); ``None`` when the run is unknown (a 404)."""
    rows = await deep.get_deep(company, run_id, after=step_seq - 1 if step_seq > 0 else None, limit=1)
    if rows and rows[0].step_seq == step_seq:
        return DeepStep(state="present", body=body_view(rows[0]))
    record = await steps.get_run(company, run_id)
    if record is None:
        return None
    return DeepStep(state="pruned" if record.deep_pruned_at else "absent", body=None)


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


async def _deep_chunks(
    deep: DeepStore, company: str, run_id: str, first: list[DeepRecord]
) -> AsyncIterator[bytes]:
    """The :class:`DeepBodies` JSON of the run, a page of bodies per chunk."""
    yield b'{"company_id":' + _encoder.encode(company) + b',"run_id":' + _encoder.encode(run_id) + b',"bodies":['
    rows, separator = first, b""
    while rows:
        yield separator + b",".join(_encoder.encode(body_view(r)) for r in rows)
        separator = b","
        if len(rows) < PAGE_ROWS:
            break
        rows = await deep.get_deep(company, run_id, after=rows[-1].step_seq, limit=PAGE_ROWS)
    yield b"]}"


async def _spooled_chunks(entries: list[tuple[str, int, IO[bytes]]], top: str) -> AsyncIterator[bytes]:
    for _, _, fh in entries:
        fh.seek(0)
    chunks = tar_chunks(entries, top)
    while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:  # file reads: off the loop
        yield chunk


async def take_slot(request: Request[Any, Any, Any], slots: ExportSlots) -> Slot:
    """A slot of ``slots`` (503 with ``Retry-After`` when none frees up in time), given
    back by the app when the request's ASGI call ends."""
    slot = await slots.take()
    info = request.scope.get("stepstream")
    if info is not None:
        info.slots.append(slot)
    return slot


async def bundle_stream(
    request: Request[Any, Any, Any], steps: StepStore, deep: DeepStore, slots: ExportSlots, company: str, run_id: str
) -> Stream:
    """The run's ``.sftrace`` bundle as a streamed tar (the ``/v1`` route and the viewer's
    download): 404 unknown, 410 pruned or purged; holds a slot of ``slots`` until sent."""
    slot = await take_slot(request, slots)
    spooled: dict[str, IO[bytes]] = {}
    slot.on_release(lambda: [fh.close() for fh in spooled.values()])

    def open_file(name: str) -> IO[bytes]:
        spooled[name] = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES, prefix="stepstream-bundle-")
        return spooled[name]

    try:
        stats = await write_from_stores(steps, deep, company, run_id, open_file, page=PAGE_ROWS)
    except BundleRefused as exc:  # unknown, pruned, purged (or no event time at all)
        slot.release()
        if exc.reason == "unknown":
            raise ProblemError(NOT_FOUND) from None
        raise ProblemError(problem(410, f"no complete bundle ({exc.reason})")) from None
    except BaseException:
        slot.release()
        raise
    top = f"{run_id}.sftrace"
    entries = [(name, stats.sizes[name], spooled[name]) for name in FILE_ORDER]
    return Stream(
        Held(_spooled_chunks(entries, top), slot),
        media_type="application/x-tar",
        headers={"Content-Disposition": f'attachment; filename="{top}.tar"'},
    )


def deep_router(
    deep: DeepStore, retention: RetentionStore, steps: StepStore, guards: list[object], slots: ExportSlots
) -> Router:
    """``GET``/``DELETE .../runs/{run_id}/deep`` and ``DELETE .../deep``. A run is
    known when it has bodies or a run record; an unknown run is 404. The deep read
    and the bundle take a slot of ``slots`` (503 with ``Retry-After`` when none frees
    up in time) and hold it until their body is sent."""

    async def take(request: Request[Any, Any, Any]) -> Slot:
        return await take_slot(request, slots)

    @get(
        "/runs/{run_id:str}/deep",
        opt={"scope": "deep:read"},
        summary="A run's deep companions (raw bodies), streamed",
        operation_id="getRunDeep",
        media_type="application/json",
        responses={
            200: ResponseSpec(
                data_container=DeepBodies, description="The run's bodies, streamed a page at a time",
                generate_examples=False,
            ),
            **problem_responses(400, *GUARDED),
        },  # fmt: skip
    )
    async def get_deep(request: Request[Any, Any, Any], company: CompanyParam, run_id: RunIdParam) -> Stream:
        """Raw reasoning, arguments and output of every step of the run, capped and
        clipped as stored, in ordinal order. Holds secrets: only for ``deep:read``
        tokens. Streamed a page of bodies at a time; 503 with ``Retry-After`` while
        the process is at its bound of exports in progress."""
        slot = await take(request)
        try:
            first = await deep.get_deep(company, run_id, limit=PAGE_ROWS)
            if not first and await steps.get_run(company, run_id) is None:
                raise ProblemError(NOT_FOUND)
        except BaseException:
            slot.release()
            raise
        return Stream(Held(_deep_chunks(deep, company, run_id, first), slot), media_type="application/json")

    @get(
        "/runs/{run_id:str}/deep/{step_seq:int}",
        opt={"scope": "deep:read"},
        summary="One step's deep companion (raw body)",
        operation_id="getStepDeep",
        responses=problem_responses(400, *GUARDED),
    )
    async def get_step_deep(
        company: CompanyParam,
        run_id: RunIdParam,
        step_seq: Annotated[int, Parameter(ge=0, le=MAX_STEP_SEQ, description="The step's ordinal (step_seq)")],
    ) -> DeepStep:
        """Raw reasoning, arguments and output of one step, capped and clipped as
        stored, with the state of the run's bodies (pruned by retention, or absent).
        Holds secrets: only for ``deep:read`` tokens. 404 for an unknown run."""
        found = await step_body(deep, steps, company, run_id, step_seq)
        if found is None:
            raise ProblemError(NOT_FOUND)
        return found

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
    async def get_bundle(request: Request[Any, Any, Any], company: CompanyParam, run_id: RunIdParam) -> Stream:
        """The run's ``.sftrace`` bundle (docs/bundle.md) as a tar of
        ``<run_id>.sftrace/``: payloads redacted, hashed, with ``integrity.json``.
        410 when the run's bodies were pruned or purged (a bundle would be incomplete);
        503 with ``Retry-After`` while the process is at its bound of exports. Built a
        page of bodies at a time into spooled files, then streamed."""
        return await bundle_stream(request, steps, deep, slots, company, run_id)

    return Router(
        "/v1/companies/{company:str}",
        route_handlers=[get_deep, get_step_deep, purge_run, purge_company, get_bundle],
        guards=guards,  # type: ignore[arg-type]
        security=[{"bearer": []}],
        tags=["deep"],
    )
