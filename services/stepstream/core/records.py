"""What the engine makes and the sinks store (CONTRACT.md sections 2 and 3).

Three record types, all keyed by company first so no read can cross tenants:

* :class:`StepRecord`, the operator view, keyed ``(company_id, run_id, step_seq)``.
  Never holds raw output, thinking text or an unredacted argument.
* :class:`DeepRecord`, the unredacted companion of one step, same key.
* :class:`RunRecord`, one per ``(company_id, run_id)``.

and :class:`RunState`, the small durable fold state per run that the worker
writes in the same transaction as the rows it describes (DESIGN-NOTES.md).

**Write semantics (every backend).** A write replaces on its key *field by
field*: a field written as ``None`` keeps the stored value, any other value
replaces it. That is how a ``tool_result`` completes the row its ``tool_call``
wrote without the engine holding the call's arguments in memory. Three fields
merge differently:

* ``DeepRecord.clipped`` is sticky: stored ``clipped = stored or written``.
* ``DeepRecord.ts`` keeps the latest: stored ``ts = max(stored, written)``.
* ``DeepRecord.reasoning`` is positional: a write carries the text *from
  character* ``reasoning_offset`` on and overwrites its own span, so the stored
  text becomes ``stored[:offset] + written + stored[offset + len(written):]``
  (``core.merge.apply_reasoning``). Writing the same chunk twice gives the same
  row, which is what makes a replay after a crash converge, and a late (stale)
  chunk never shortens the text.

Timestamps are RFC 3339 strings in UTC with a ``Z`` suffix and microseconds,
so they sort as text in every backend.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

StepKind = Literal["thinking", "tool", "llm", "state", "error"]
# "abandoned": a step or run the compactor closed after the run went silent (``run_close``).
StepStatus = Literal["running", "ok", "error", "abandoned"]
RunStatus = Literal["running", "completed", "failed", "abandoned"]


class StepRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One step as an operator may see it. ``None`` fields keep stored values."""

    company_id: str
    run_id: str
    step_seq: int
    kind: StepKind
    label: str | None = None
    status: StepStatus | None = None
    call_id: str | None = None
    # Redacted arguments (tool arguments, LLM params, a state value); never raw.
    arguments: Any | None = None
    input_shape: str | None = None
    output_shape: str | None = None
    started_at: str | None = None
    ended_at: str | None = None


class DeepRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The unredacted companion of one step. Bodies are capped in characters of what
    a reader sees: ``reasoning`` 65,536, ``output`` 65,536, ``arguments`` 32,768
    (``core.caps``). ``arguments`` and ``output`` are JSON *values*: the raw string,
    object, array or number as the event carried it, or, once over the cap, a string
    holding the head of its text and the clip marker (``clipped`` is then set).
    A body whose value is JSON ``null`` reads as ``None`` (no body): a completed
    step with no output body had the output ``null``.
    ``ts`` is the event time of the write; the deep store ranks runs by its maximum."""

    company_id: str
    run_id: str
    step_seq: int
    kind: StepKind
    ts: str
    reasoning: str | None = None
    reasoning_offset: int = 0
    arguments: Any | None = None
    output: Any | None = None
    clipped: bool = False
    # The envelopes of the events that made this step, for a ``.sftrace`` export
    # (``core.envelope``): the opening event (call, request, state change, error, or
    # the first delta of a thinking run) and the result. Bounded like the bodies;
    # ``None`` keeps the stored one.
    call_event: dict[str, Any] | None = None
    result_event: dict[str, Any] | None = None


class Failure(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Why a run failed (the ``.sftrace`` manifest's shape). ``type`` is ``unknown``
    when the agent gave only a message, or nothing (``core.fold``)."""

    type: str
    message: str
    step: int | None = None


class RunRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One run. Written whole, except ``environment`` and ``deep_pruned_at``: a write
    of ``None`` keeps the stored value (``core.merge.merge_run``). ``environment`` is
    the run_start's object (redacted) or string, kept structured while its compact
    JSON is within ``Limits.environment_bytes`` (32,768 UTF-8 bytes), else the head
    of that text ending with the clip marker; the engine writes it only with its
    run_start (it is in no ``RunState``).
    ``seq_gaps`` counts the gaps seen, ``late_events`` the events that filled one
    later (duplicates are counted by neither)."""

    company_id: str
    run_id: str
    agent_name: str | None = None
    # The run_start's session_id (a conversation the run is part of), credential-masked.
    session_id: str | None = None
    environment: dict[str, Any] | str | None = None
    status: RunStatus = "running"
    failure: Failure | None = None
    started_at: str | None = None
    ended_at: str | None = None
    last_event_at: str | None = None
    step_count: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    truncated: bool = False
    dropped_steps: int = 0
    seq_gaps: int = 0
    late_events: int = 0
    # When retention dropped this run's deep bodies (set by the compactor through
    # ``StepStore.mark_deep_pruned``; a run record written as ``None`` keeps it).
    deep_pruned_at: str | None = None
    # The event ids of the run's run_start and run_end (a ``.sftrace`` export names them).
    start_event_id: str | None = None
    end_event_id: str | None = None


class RunState(msgspec.Struct, kw_only=True):
    """Durable fold state of one run: small (no text, and its ``run`` never holds the
    environment: a state stored with one, by an earlier version, still loads, and the
    fold drops it), written with the rows it describes. ``last_seq`` means every event of this run up to it is fully
    reflected in the sinks and nothing beyond it is. It also counts the events that
    take no new agent ``seq``: ``closes`` compactor closes (``run_close``) and the
    run's ``late_events`` (a late event fills a seq below it), so the last agent
    ``seq`` applied is ``last_seq - closes - run.late_events``. Stores compare
    ``last_seq`` only (a batch whose state is not ahead of the stored one is refused),
    and it grows with every applied event, late events and closes included."""

    company_id: str
    run_id: str
    last_seq: int = -1
    next_ordinal: int = 0
    # The open thinking run, if any: its ordinal, the characters already durable.
    thinking_ordinal: int | None = None
    thinking_chars: int = 0
    thinking_clipped: bool = False
    thinking_started_at: str | None = None
    # Open tool and LLM calls: "tool:<call_id>" or "llm:<call_id>" -> ordinal.
    open_calls: dict[str, int] = {}
    # Late events (core.fold): the seqs a gap skipped, as ascending inclusive
    # [first, last] ranges (at most Limits.late_ranges), and the results that made
    # a step before their call arrived: call key -> ordinal.
    skipped_seqs: tuple[tuple[int, int], ...] = ()
    awaiting_calls: dict[str, int] = {}
    run: RunRecord | None = None
    # ``run_close`` events applied. Each takes no agent seq but must move the stored
    # state forward, so ``last_seq`` is the last agent seq applied plus ``closes``
    # (plus ``run.late_events``, for the same reason).
    closes: int = 0
    # The unsequenced events applied (core.fold.RunFold.push): a 53-bit hash of each id,
    # oldest first, at most Limits.applied_ids.
    applied_ids: tuple[int, ...] = ()

    @property
    def agent_seq(self) -> int:
        """The last agent ``seq`` applied: ``last_seq - closes - run.late_events``. The one
        definition, read by the fold (where it resumes) and the compactor (the ``seq`` its
        ``run_close`` names, which the fold takes only when it equals this)."""
        lates = 0 if self.run is None else self.run.late_events
        return self.last_seq - self.closes - lates
