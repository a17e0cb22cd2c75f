"""The store ports: what the engine, the compactor and the read API need from a sink.

Three small Protocols, each satisfied by every backend (``memory``, ``files``,
``sqlite``, ``mongodb``):

* :class:`StepStore` holds the operator view: steps, run records and the per-run
  fold state (:class:`~stepstream.core.records.RunState`).
* :class:`DeepStore` holds the unredacted bodies (it holds secrets, by design).
* :class:`RetentionStore` is the part of the deep store that retention and purge
  use; every ``DeepStore`` backend satisfies it too. Its retention index
  (:class:`DeepRun`) ranks runs for the compactor, and its prune marks are what
  make a pass that dies midway converge on the next one.

**Company scope.** Every read and every purge takes ``company_id`` and never
returns or touches a row of another company, also when two companies use the
same ``run_id``. An unknown run reads empty (``None`` / ``[]`` / ``{}``), exactly
like another company's run.

**Write semantics** are those of ``core.records``: a write replaces on its key
``(company_id, run_id, step_seq)`` field by field (``None`` keeps the stored
value); ``DeepRecord.clipped`` is sticky; ``DeepRecord.reasoning`` is
positional: a chunk overwrites its own span and never shortens the text
(``stored[:offset] + written + stored[offset + len(written):]``). Run records
and run states replace whole on ``(company_id, run_id)``. Records of one
``write`` call apply in the order given, so two writes to one key in a batch
behave like two calls. Writing the same batch twice gives the same rows
(idempotent).

**Runs never move backwards.** ``StepStore.write`` applies a run's steps, run
records and state only when its state in the batch is ahead of the stored one
(``last_seq`` greater, or nothing stored); otherwise it skips all of that run's
rows and returns the run among the skipped. A former partition owner that wakes
up late therefore cannot overwrite what the new owner wrote.

**Durability and order.** ``StepStore.write`` is one transaction where the
backend has them (SQLite): the steps, run records and states of a batch become
durable together or not at all. Where it has none (MongoDB/FerretDB, files) the
states are written last, so a crash leaves rows that a replay rewrites
identically, never a state that claims more than is stored. The engine writes a
batch's deep records *before* the step batch that carries its states. Every
store is durable by default (SQLite ``synchronous=FULL``, an fsync per file
batch, MongoDB ``w=majority, j=true``; each URL can opt out) and names what it
does in ``durability``, e.g. ``"synchronous=FULL"``.

**Errors.** A store method raises only :class:`~stepstream.errors.SinkError`
for a driver or I/O failure: :class:`~stepstream.errors.SinkUnavailable`
(retriable: the same call may succeed later) for a busy or locked database, a
lost connection, a timeout, a full disk or an I/O error; a plain ``SinkError``
(not retriable) for everything else, including a value the backend cannot hold
(an integer beyond 64 bits, a lone surrogate), whose message names the table and
the exception type but never the value.

**Bounds.** ``DeepStore.write`` clips every body to the caps before any backend
sees it (``core.caps``), so no backend can store more than the caps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import msgspec

from stepstream.core.records import DeepRecord, RunRecord, RunState, StepRecord
from stepstream.errors import SinkError


class Capabilities(msgspec.Struct, frozen=True, kw_only=True):
    """What a backend can and cannot do; the conformance suite turns a ``False``
    into a strict ``xfail`` of the behaviour it names, never an ``isinstance``.

    ``atomic_batch``: a write call is all-or-nothing (one transaction).
    ``shared_storage``: two store instances opened on the same URL (also from two
    processes) see each other's writes.
    ``monotonic_states``: the stale-run check and the state write are atomic
    against every other writer, so even two writers racing on one run can never
    move its stored state backwards (FerretDB 1.x cannot: its conditional update
    reads outside the transaction that writes).
    ``atomic_reasoning``: a positional reasoning write and the stored text it is
    merged onto are atomic against every other writer of the row, so even two
    writers racing on one row never lose a chunk (FerretDB 1.x cannot, for the
    same reason; a write that comes after the other writer's still merges onto it).
    """

    atomic_batch: bool
    shared_storage: bool
    monotonic_states: bool = True
    atomic_reasoning: bool = True


class RunsPage(msgspec.Struct, frozen=True):
    """One page of :meth:`StepStore.list_runs_page`: runs most recent first, and
    the cursor for the next (older) page, ``None`` when this is the last one."""

    runs: list[RunRecord]
    next_cursor: str | None


class RunFilter(msgspec.Struct, frozen=True, kw_only=True):
    """Which runs :meth:`StepStore.list_runs_page` returns; every field set narrows it.

    ``status`` and ``agent`` (``agent_name``) match exactly; ``since`` (inclusive) and
    ``until`` (exclusive) bound the run's recency (``started_at``, else
    ``last_event_at``), stored timestamps (``core.timefmt``); ``problems`` keeps the
    runs with an integrity problem or a bad end: :data:`PROBLEM_COUNTERS` above zero,
    ``truncated``, or status ``failed`` / ``abandoned``. Each backend applies it in its
    query, so a page is full whenever enough runs match (never "this page only")."""

    status: str | None = None
    agent: str | None = None
    since: str | None = None
    until: str | None = None
    problems: bool = False


NO_FILTER = RunFilter()
PROBLEM_COUNTERS = ("seq_gaps", "late_events", "dropped_steps")
PROBLEM_STATUSES = ("failed", "abandoned")


class InvalidCursor(SinkError, ValueError):
    """A ``before`` cursor this store did not make (a client error, not a fault)."""


@runtime_checkable
class StepStore(Protocol):
    """Steps, run records and run states.

    Runs are ordered most recent first by ``(started_at or last_event_at, run_id)``;
    a run with neither sorts last. Cursors are opaque strings, stable across
    backends and store instances."""

    capabilities: Capabilities
    durability: str

    async def write(
        self,
        steps: Sequence[StepRecord],
        runs: Sequence[RunRecord] = (),
        states: Sequence[RunState] = (),
    ) -> list[tuple[str, str]]:
        """Upsert a batch: steps field by field, run records and states whole.
        Atomic where ``capabilities.atomic_batch``; otherwise states go last.

        A run with a state in the batch is written only if its stored state's
        ``last_seq`` is lower than the batch state's (the last one of the run in
        ``states``), or it has none; otherwise none of its steps, run records or
        states are written and ``(company_id, run_id)`` is returned among the
        skipped runs (in ``states`` order). A run that already holds exactly this
        ``last_seq`` (a batch replayed after it landed) is skipped too: its rows
        are there. Rows of runs without a state in the batch are always written.
        Returns ``[]`` when nothing was skipped."""
        ...

    async def load_states(self, company_id: str, run_ids: Sequence[str]) -> dict[str, RunState]:
        """The stored states of those runs of this company; unknown runs are absent."""
        ...

    async def get_run(self, company_id: str, run_id: str) -> RunRecord | None: ...

    async def list_runs(self, company_id: str, *, limit: int = 50, before: str | None = None) -> list[RunRecord]:
        """At most ``limit`` (>= 1) runs, most recent first, older than cursor ``before``."""
        ...

    async def list_runs_page(
        self, company_id: str, *, limit: int = 50, before: str | None = None, where: RunFilter = NO_FILTER
    ) -> RunsPage:
        """:meth:`list_runs` of the runs that match ``where``, plus the cursor of the
        next page. Raises :class:`InvalidCursor` for a cursor that no store made."""
        ...

    async def get_steps(
        self, company_id: str, run_id: str, *, after: int | None = None, limit: int | None = None
    ) -> list[StepRecord]:
        """The run's steps in ordinal (``step_seq``) order, whatever the write order:
        only those with ``step_seq > after`` (all when ``None``), at most ``limit``
        (>= 1; all when ``None``). The backend reads only that range (a page of a
        500-step run is not the whole run, sliced)."""
        ...

    # -- the compactor's calls (issue 11) ---------------------------------------

    async def list_companies(self) -> list[str]:
        """Every company with a run record, sorted."""
        ...

    async def mark_deep_pruned(self, company_id: str, run_ids: Sequence[str], at: str) -> int:
        """Set ``RunRecord.deep_pruned_at`` to ``at`` on those runs' records where it
        is not set yet; returns how many records changed. Run records written later
        keep it (a record written with ``deep_pruned_at=None`` keeps the stored one);
        a run without a record is skipped."""
        ...

    async def delete_runs(self, company_id: str, run_ids: Sequence[str]) -> int:
        """Delete those runs whole from this store: steps, run record and state
        (step retention); returns how many runs had a run record."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class RetentionStore(Protocol):
    """What retention and purge need: runs by recency, whole-run deletion.

    A run's recency is the largest ``ts`` among its deep rows. Deleting bodies never
    touches a step, a run record or a state (those live in the :class:`StepStore`)."""

    async def list_deep_runs(self, company_id: str) -> list[tuple[str, str]]:
        """``(run_id, last ts)`` of every run holding bodies, newest first
        (ties: larger ``run_id`` first)."""
        ...

    async def purge_run(self, company_id: str, run_id: str) -> int:
        """Delete one run's bodies; returns how many rows went (0 when repeated).
        Steps, run records and states are never touched. The run's index entry goes
        too unless it is marked pruned (a pruned run keeps refusing bodies); an
        unpruned run that is written again later holds the new bodies only.
        ``stepstream purge`` and the read API's purge routes call this."""
        ...

    async def purge_company(self, company_id: str) -> int:
        """Delete every body of the company; returns how many rows went. Same rules
        as :meth:`purge_run`, for each run of the company."""
        ...

    async def prune(self, company_id: str, keep: int) -> list[str]:
        """Drop the bodies of all but the ``keep`` runs of the company ranked
        newest by :attr:`DeepRun.rank`, whole runs only: :meth:`mark_pruned` then
        :meth:`delete_pruned` (the compactor makes the same two calls, with the run
        record marked in between). Returns the run ids dropped, newest first."""
        ...

    # -- the compactor's calls (issue 11); ``purge_run`` / ``purge_company`` above are
    # -- also what ``stepstream purge`` and the read API's purge routes call.

    async def list_companies(self) -> list[str]:
        """Every company with a run in the retention index or a body, sorted."""
        ...

    async def retention_index(self, company_id: str) -> list[DeepRun]:
        """Every run of the company holding bodies or pruned, highest ``rank`` first
        (ties: larger ``run_id`` first). A run holding bodies written before the
        index existed is listed with ``rank`` = ``last_ts`` and ``version`` 0."""
        ...

    async def mark_pruned(self, company_id: str, runs: Sequence[tuple[str, int]], at: str) -> list[str]:
        """Mark each ``(run_id, version)`` pruned at ``at``, only if its index entry
        still has that ``version`` (no write since it was ranked) and is not marked
        yet; version 0 marks a run with no entry. From the mark on, ``get_deep`` of
        the run is empty and ``write`` drops its bodies. Returns the runs marked by
        this call, in the order given. Atomic per run."""
        ...

    async def delete_pruned(self, company_id: str, run_ids: Sequence[str]) -> int:
        """Delete the bodies of those runs that are marked pruned (others are left
        alone); returns how many rows went. Repeating it is harmless: this is how a
        pass killed between the mark and the delete is finished."""
        ...


class DeepRun(msgspec.Struct, frozen=True, kw_only=True):
    """One run in the deep store's retention index (:meth:`RetentionStore.retention_index`).

    ``rank`` is what retention orders runs by: the largest ``min(row ts, received)``
    over the writes that stored bodies for it, where *received* is the store's clock
    at that write. An agent clock running ahead cannot lift a run above the time its
    bodies arrived, and a backfill of old runs keeps their own (older) order.
    ``version`` grows with every write that stored bodies for the run (0: a run
    whose bodies predate the index), so a conditional prune can tell that the run
    moved since it was ranked. ``pruned_at`` is set once retention dropped its
    bodies: from then on the run holds none (``get_deep`` is empty, later bodies are
    refused). ``bodies`` counts the rows held now; a pruned run holding some was
    caught mid-pass and is finished by :meth:`RetentionStore.delete_pruned`."""

    run_id: str
    rank: str
    last_ts: str
    received_at: str
    version: int
    bodies: int
    pruned_at: str | None = None


@runtime_checkable
class DeepStore(RetentionStore, Protocol):
    """The unredacted companions. Company-scoped like every port; clipped at the port."""

    capabilities: Capabilities
    durability: str

    async def write(self, deeps: Sequence[DeepRecord]) -> None:
        """Clip to the caps, then upsert with the deep merge (positional reasoning
        that never shortens the text, sticky ``clipped``). Atomic where
        ``capabilities.atomic_batch``."""
        ...

    async def get_deep(
        self, company_id: str, run_id: str, *, after: int | None = None, limit: int | None = None
    ) -> list[DeepRecord]:
        """The merged rows of the run in ordinal order, each with ``reasoning_offset`` 0;
        the range as in :meth:`StepStore.get_steps` (``step_seq > after``, at most
        ``limit``), read as a range, so a reader can page through a run's bodies."""
        ...

    async def close(self) -> None: ...
