"""The step engine: one pure state machine per run (CONTRACT.md section 2).

:class:`RunFold` turns a run's wire events into the records to write, from ONE
pass: :meth:`RunFold.push` returns an :class:`Output` holding the scrubbed
steps, their unredacted deep companions, the run record and the durable state,
in write order. There is no second state machine that has to agree with it.

Contracts:

* **Ordinals.** One dense counter per run (``RunState.next_ordinal``), in
  arrival order. ``run_start`` and ``run_end`` make no step. Every other event
  makes a step or completes one: ``tool_result``/``llm_response`` complete the
  ordinal of their call (looked up in ``open_calls``) by writing only the fields
  they know; the store's field-by-field merge (``core.records``) keeps the rest,
  so the state never holds call arguments. A result with no open call becomes a
  step of its own (label ``unmatched result``).
* **Thinking fold.** Consecutive ``thinking_delta`` events are one step whose
  ordinal is fixed at the first delta. The unflushed text (the *tail*) lives
  only in memory. It is flushed as a positional chunk of the deep ``reasoning``
  (``reasoning_offset`` = characters already durable) with trigger ``size`` as
  soon as ``Limits.flush_bytes`` UTF-8 bytes or ``Limits.flush_deltas`` deltas
  are pending (the whole tail, including the delta that crossed the line; every
  delta counts, also an empty one, so a trickle of empty deltas is flushed too),
  ``close`` when any other event of
  the run arrives (before that event's own records) or on ``run_end``, and
  ``idle`` from :meth:`RunFold.flush_idle`. Closing marks the step ``ok``.
* **Idle and forced flushes do not close.** :meth:`RunFold.flush_idle` and
  :meth:`RunFold.flush` make the tail durable but leave the thinking step open:
  a later delta continues the same ordinal. Ordinals therefore depend only on
  the events, never on wall-clock timing, so a worker (with idle flushes, crashes
  and rebalances) and an offline ``ingest-file`` of the same events converge to
  identical rows.
* **A thinking step carries no text**, only ``output_shape`` of the total text
  so far (``4.2k characters``). Its deep ``ts`` and, when it closes, its
  ``ended_at`` are the latest event time seen up to its last delta.
* **Caps** (``core.caps``): deep bodies are clipped in characters of what a reader
  sees (a string by its characters, any other value by its compact JSON text), with
  a marker and a sticky ``clipped`` flag; an unclipped body is the JSON value. Once a thinking run's reasoning is clipped,
  later deltas are only counted (for the shape): the tail keeps no more text.
* **500 steps.** A step that would get ordinal ``>= max_steps`` is dropped, step
  and deep alike; the run becomes ``truncated`` and ``dropped_steps`` counts it
  (a dropped thinking run once). Results of dropped calls are dropped silently,
  and so is any result without an open call once the run is truncated.
* **Idempotence.** An event whose ``seq`` is not above the last applied one and
  fills no gap returns ``None`` and changes nothing (``stale`` counts it). A gap
  (``seq > last + 1``) is applied and counted in ``RunRecord.seq_gaps``
  (``Output.seq_gap``); it closes an open thinking run first (the missing events
  may hold the one that closed it) and remembers the skipped seqs.
* **Late events.** An event whose ``seq`` is a skipped one is applied
  (``Output.late``; ``late`` and ``RunRecord.late_events`` count it) as its type
  would be in order, with the next ordinal, but never touches the open thinking
  run: a late delta is a closed thinking step of its own; a late call whose result
  already made a step fills that step in. The skipped seqs
  (``RunState.skipped_seqs``) and the results awaiting a late call
  (``RunState.awaiting_calls``) are bounded by ``Limits.late_ranges``; the oldest
  are forgotten. In-order events never touch them. ``docs/engine.md`` has the
  table per type.
* **Run payloads.** ``environment`` (an object, redacted by key, or a string) and
  ``failure`` are kept structured. A run_end is never refused for the shape of its
  failure (``core.failures``: a string is the message of type ``unknown``, a missing
  one on a ``failed`` run_end is type ``unknown``, any other shape keeps what it says);
  ``Output.failure_coerced`` names a coerced shape for the count.
* **The environment is written once.** It rides only on the run record of the
  Output that applied its run_start (capped at ``Limits.environment_bytes``, clipped
  and counted in ``Output.clipped`` as ``environment``); every other run record has
  ``environment=None``, which the stores keep (``core.merge.merge_run``), and no
  ``RunState`` holds it (one stored with it by an earlier version loads and is
  dropped), so a batch rewrites a small state, not the environment, and an open
  fold does not hold it.
* **Rejection.** An event ``push`` cannot apply raises
  :class:`~stepstream.errors.WireError` before anything changes (the fold is as
  it was, so the caller dead-letters the event and goes on): ``seq_jump`` when
  ``seq > last_seq + Limits.max_seq_jump`` (one wild ``seq`` would otherwise make
  every later event of the run a duplicate), ``out_of_range`` for a ``ts``
  outside the window of ``core.timefmt`` (``decode_event`` already rejects those;
  this guards events built in Python). For an event from ``decode_event`` of its
  own run, ``push`` raises nothing else: everything after these checks is total.
  Token totals on the run record saturate at ``2**63 - 1``.
* **Durability.** ``Output.state`` is a snapshot of :class:`RunState`, present
  exactly when no tail is pending after the call; every event up to its
  ``last_seq`` is fully reflected in the Output's records and those before it.
  A delta that only buffers returns an Output with empty lists and
  ``state=None``: its effect becomes durable with a later Output that carries a
  state. ``Output.run`` rides only on Outputs with a state, when the run record
  changed since it was last emitted. A fold restored from any such snapshot and
  fed the later events (earlier ones are skipped) makes exactly the records an
  uninterrupted fold makes.
* **Abandoned runs** (``run_close``, published by the compactor). A close takes
  no agent ``seq``: its ``seq`` names the last agent ``seq`` the compactor saw,
  and it applies only if that is still the fold's last applied agent ``seq`` and
  the run is ``running``; otherwise it returns ``None`` (a replayed close, or one
  that lost the race to a resumed agent or to ``run_end``). Applying it flushes
  and closes an open thinking run, marks every open tool/LLM step ``abandoned``
  (the calls stay open, so a late result still completes its own ordinal) and the
  run ``abandoned`` (``ended_at`` the close's ``ts``), and counts it in
  ``RunState.closes`` so the stored ``last_seq`` (agent seq plus closes) moves
  forward. The next agent event of an abandoned run sets it ``running`` again
  (``ended_at`` cleared) and is applied as usual: no event and no ordinal is lost.
* **State fields** (``core.records.RunState``): ``thinking_chars`` counts every
  durable character of the open thinking run, also those past the cap (the deep
  text then stops at the cap); ``thinking_ordinal >= max_steps`` marks an open
  thinking run that was dropped; ``open_calls`` never holds a dropped call.

Pure: no I/O, no clock (``now`` is passed in, only for the idle timer).
"""

from __future__ import annotations

import sys
from bisect import bisect_right
from datetime import datetime
from typing import Any, Callable

import msgspec

from stepstream.core import wire
from stepstream.core.caps import clip, clip_chunk, json_body_bytes
from stepstream.core.limits import Limits
from stepstream.core.envelope import envelope
from stepstream.core.records import DeepRecord, RunRecord, RunState, StepRecord
from stepstream.core.failures import Coerced, coerce_failure
from stepstream.core.redact import scrub
from stepstream.core.steps import CALLS, OPENERS, RESULTS, Rows, call_key, opening_rows, result_rows, thinking_step
from stepstream.core.timefmt import TS_MAX, TS_MIN, WINDOW, format_ts, in_window, parse_ts
from stepstream.errors import WireError

__all__ = ["BUFFERED", "MAX_TOKEN_TOTAL", "Limits", "Output", "RunFold"]

# Token totals saturate here, so no sum of usage counts overflows a signed 64-bit column.
MAX_TOKEN_TOTAL = 2**63 - 1


class Output(msgspec.Struct):
    """Everything one call produced, in write order (see the module docstring), and
    what the worker counts: the flush triggers, the clipped fields, whether the
    event opened a gap (``seq_gap``) or filled one (``late``), and how many steps
    the run dropped at its ceiling (``dropped``)."""

    steps: list[StepRecord] = []
    deeps: list[DeepRecord] = []
    run: RunRecord | None = None
    state: RunState | None = None
    flushes: list[str] = []
    clipped: list[str] = []
    seq_gap: bool = False
    late: bool = False
    dropped: int = 0
    failure_coerced: Coerced | None = None


#: The Output of a delta that only joined the fold's tail (most events of a thinking run):
#: one shared instance, so the hot path allocates nothing and a caller can tell it by
#: identity. Never changed, by the fold or by anyone handed it.
BUFFERED = Output([], [], None, None, [], [])

_Handler = Callable[["RunFold", Any, str, Output], None]
_ThinkingDelta = wire.ThinkingDelta
_RunClose = wire.RunClose
_UNSEQUENCED = wire.UNSEQUENCED


def _utf8_len(text: str) -> int:
    try:
        return len(text.encode())
    except UnicodeEncodeError:  # a lone surrogate (only from events built in Python)
        return len(text.encode("utf-8", "surrogatepass"))


class RunFold:
    """The fold of one run; see the module docstring for its contracts."""

    __slots__ = (
        "company_id", "run_id", "limits", "stale", "_last_seq", "_next", "_open", "_run",
        "_dirty", "_max_ts", "_max_ts_str", "_th_ord", "_th_chars", "_th_clipped",
        "_th_started", "_pending", "_tail", "_tail_chars", "_tail_bytes", "_tail_deltas", "_delta_now",
        "_th_env", "_max_steps", "_flush_bytes", "_flush_deltas", "_max_seq_jump", "lazy", "_clean",
        "late", "_skipped", "_awaiting", "_closes", "_environment", "_applied", "_max_applied",
    )  # fmt: skip

    def __init__(
        self,
        company_id: str,
        run_id: str,
        state: RunState | None = None,
        limits: Limits = Limits(),
        *,
        lazy: bool = False,
    ):
        self.company_id = sys.intern(company_id)  # shared by every run of a company
        self.lazy = lazy
        self._clean: RunState | None = None  # lazy only: the last clean state, kept while a tail is pending
        self.run_id = run_id
        self.limits = limits
        self._max_steps = limits.max_steps
        self._flush_bytes = limits.flush_bytes
        self._flush_deltas = limits.flush_deltas
        self._max_seq_jump = limits.max_seq_jump
        self.stale = 0
        self.late = 0
        self._pending = False
        self._tail: list[str] = []
        self._tail_chars = 0
        self._tail_bytes = 0
        self._tail_deltas = 0
        self._delta_now = 0.0
        self._max_ts_str: str | None = None
        if state is None:
            state = RunState(company_id=company_id, run_id=run_id)
        elif (state.company_id, state.run_id) != (company_id, run_id):
            raise ValueError(f"state of {state.company_id}/{state.run_id} given to {company_id}/{run_id}")
        self._closes = state.closes
        # Unsequenced events applied (their id hashes, oldest first): see push.
        self._applied: dict[int, None] = dict.fromkeys(state.applied_ids)
        self._max_applied = limits.applied_ids
        self._last_seq = state.agent_seq  # the last agent seq applied
        self._next = state.next_ordinal
        self._open: dict[str, int] | None = dict(state.open_calls) if state.open_calls else None
        self._th_ord = state.thinking_ordinal
        self._th_chars = state.thinking_chars
        self._th_clipped = state.thinking_clipped
        self._th_started: datetime | str | None = state.thinking_started_at  # formatted lazily
        # The envelope of the open thinking run's first delta until its first write stores it.
        self._th_env: dict[str, Any] | None = None
        self._skipped = state.skipped_seqs
        self._awaiting: dict[str, int] | None = dict(state.awaiting_calls) if state.awaiting_calls else None
        run = state.run
        if run is None:
            run = RunRecord(company_id=self.company_id, run_id=run_id)
        # A state stored by an earlier version holds the environment: the store has it already.
        self._run = msgspec.structs.replace(run, company_id=self.company_id, environment=None)
        # A run_start's environment until an Output carries it (the fold never keeps it).
        self._environment: dict[str, Any] | str | None = None
        self._dirty = False
        last = self._run.last_event_at
        self._run.last_event_at = None
        self._max_ts: datetime | None = None if last is None else parse_ts(last)
        self._max_ts_str = last

    # -- public surface -------------------------------------------------------

    @property
    def pending(self) -> bool:
        """Whether an unflushed thinking tail is held in memory."""
        return self._pending

    @property
    def state(self) -> RunState:
        """A copy of the current state. Only an ``Output.state`` is a durable
        snapshot: this one omits any pending tail."""
        return self._snapshot(self._run_copy())

    def push(self, event: wire.Event, now: float, sequenced: bool = False) -> Output | None:
        """Apply one event of this run; ``None`` if its ``seq`` was already applied.
        ``now`` is the injected clock, used only by :meth:`flush_idle`.

        An *unsequenced* event (its id starts with :data:`~stepstream.core.wire.UNSEQUENCED`:
        made from an OpenTelemetry span, which has no agent ``seq``) takes the next
        ``seq`` on arrival and is a duplicate when its id was applied already: the run
        keeps the ids applied (a 53-bit hash of each, at most ``Limits.applied_ids``, the
        oldest forgotten) in its durable state.

        Raises ``WireError`` (``seq_jump``, ``out_of_range``) for an event it cannot
        apply, leaving the fold unchanged, and ``ValueError`` for an event of another run."""
        if not sequenced and event.event_id.startswith(_UNSEQUENCED) and type(event) is not _RunClose:
            return self._unsequenced(event, now)  # its seq given, it comes back with sequenced=True
        if event.run_id != self.run_id or event.company_id != self.company_id:
            raise ValueError(f"event of {event.company_id}/{event.run_id} pushed to {self.company_id}/{self.run_id}")
        if type(event) is _RunClose:
            return self._close(event)
        seq = event.seq
        last = self._last_seq
        if seq <= last:
            skipped = self._skipped_range(seq) if self._skipped else -1
            if skipped < 0:
                self.stale += 1
                return None
        elif seq - last > self._max_seq_jump:
            raise WireError(
                "seq_jump", f"`$.seq` is more than {self._max_seq_jump} past the run's last applied seq ({last})"
            )
        ts = event.ts
        try:
            outside = ts < TS_MIN or ts > TS_MAX
        except TypeError:  # a naive ts (an event built in Python, never decoded): UTC, as format_ts takes it
            outside = not in_window(ts)
        if outside:
            raise WireError("out_of_range", f"Expected a time {WINDOW} (in UTC) - at `$.ts`")
        # Nothing below raises: every time it formats is in the window, and its sums saturate.
        if self.lazy and not self._pending and self._clean is None and type(event) is _ThinkingDelta:
            # This delta may start a tail: keep the clean state it leaves behind.
            self._clean = self._snapshot(self._run_copy())
        run = self._run
        if run.status == "abandoned":  # the agent came back after a run_close
            run.status, run.ended_at = "running", None
            self._dirty = True
        if seq == last + 1:  # in order: the hot path
            self._last_seq = seq
            latest = self._max_ts
            if type(event) is _ThinkingDelta:
                if latest is None or ts > latest:
                    self._see(ts)
                ordinal = self._th_ord
                if ordinal is not None and ordinal < self._max_steps:
                    return self._buffer(event.payload.text, now)
                dropped = self._run.dropped_steps
                out = self._delta_start(event, now)
            else:
                dropped = self._run.dropped_steps
                at = format_ts(ts)
                out = Output([], [], None, None, [], [])
                if self._th_ord is not None:
                    self._flush_thinking(out, "close", close=True)
                if latest is None or ts > latest:
                    self._see(ts)
                _HANDLERS[type(event)](self, event, at, out)
                out = self._finish(out)
        else:
            dropped = self._run.dropped_steps
            out = self._after_gap(event, last, now) if seq > last else self._late(event, skipped)
        if self._run.dropped_steps != dropped:
            out.dropped = self._run.dropped_steps - dropped
        return out

    def _unsequenced(self, event: wire.Event, now: float) -> Output | None:
        """Push an unsequenced event (see :meth:`push`) with the next ``seq``, or
        ``None`` when its id was applied already."""
        applied = self._applied
        key = wire.id_hash(event.event_id)
        if key in applied:
            self.stale += 1
            return None
        if self.lazy and not self._pending and self._clean is None and type(event) is _ThinkingDelta:
            # The clean state this delta's tail may be held back to must not hold its id.
            self._clean = self._snapshot(self._run_copy())
        if len(applied) >= self._max_applied:
            oldest = next(iter(applied))
            del applied[oldest]
        else:
            oldest = None
        applied[key] = None  # before the push: the state it snapshots holds the id
        try:
            return self.push(msgspec.structs.replace(event, seq=self._last_seq + 1), now, sequenced=True)
        except BaseException:  # refused: the fold is as it was
            del applied[key]
            if oldest is not None:
                self._applied = applied = {oldest: None, **applied}
            raise

    def flush_idle(self, now: float) -> Output | None:
        """Flush a pending tail (trigger ``idle``) if no delta came for
        ``limits.idle_seconds``; the thinking step stays open."""
        if not self._pending or now - self._delta_now < self.limits.idle_seconds:
            return None
        return self.flush("idle")

    def flush(self, trigger: str = "close") -> Output | None:
        """Force-flush a pending tail (before a partition is released, at
        shutdown, at the end of a file); the thinking step stays open."""
        if not self._pending:
            return None
        out = Output([], [], None, None, [], [])
        self._flush_thinking(out, trigger, close=False)
        return self._finish(out)

    # -- bookkeeping ----------------------------------------------------------

    def _see(self, ts: datetime) -> None:
        """A later event time than any seen (called only when ``ts`` is)."""
        if self._max_ts is None and self._run.started_at is None:
            self._run.started_at = format_ts(ts)
        self._max_ts = ts
        self._max_ts_str = None
        self._dirty = True

    def _latest(self) -> str:
        text = self._max_ts_str
        if text is None:
            assert self._max_ts is not None
            text = self._max_ts_str = format_ts(self._max_ts)
        return text

    def _started_text(self) -> str | None:
        started = self._th_started
        if isinstance(started, datetime):
            started = self._th_started = format_ts(started)
        return started

    def _run_copy(self) -> RunRecord:
        # last_event_at lives in _max_ts; the held record does not keep a stale string of it.
        if self._max_ts is None:
            return msgspec.structs.replace(self._run)
        return msgspec.structs.replace(self._run, last_event_at=self._latest())

    def _snapshot(self, run: RunRecord) -> RunState:
        return RunState(
            company_id=self.company_id,
            run_id=self.run_id,
            last_seq=self._last_seq + self._closes + run.late_events,
            next_ordinal=self._next,
            thinking_ordinal=self._th_ord,
            thinking_chars=self._th_chars,
            thinking_clipped=self._th_clipped,
            thinking_started_at=self._started_text(),
            open_calls={} if self._open is None else dict(self._open),
            run=run,
            skipped_seqs=self._skipped,
            awaiting_calls={} if self._awaiting is None else dict(self._awaiting),
            closes=self._closes,
            applied_ids=tuple(self._applied),
        )

    def durable_state(self) -> RunState:
        """The state as of the last clean point (no pending tail): what a batch holding
        this lazy fold's rows writes. See :meth:`_finish`."""
        clean = self._clean
        if clean is None:
            clean = self._clean = self._snapshot(self._run_copy())
            assert not self._pending
        return clean

    def _finish(self, out: Output) -> Output:
        if not self._pending:
            if self.lazy:
                # No copies per event: the batch keeps this fold and takes
                # durable_state() when it is sealed (every later change either ends
                # clean again or is a pending tail, which keeps _clean).
                self._clean = None
                if self._dirty:
                    if self._environment is None:
                        out.run = self  # type: ignore[assignment]
                    else:  # a run_start's environment rides on a record of its own (the batch keeps it)
                        out.run = self._with_environment(self._run_copy())
                    self._dirty = False
                out.state = self  # type: ignore[assignment]
                return out
            run = self._run_copy()
            if self._dirty:
                out.run = self._with_environment(run)
                self._dirty = False
            out.state = self._snapshot(run)
        return out

    def _with_environment(self, run: RunRecord) -> RunRecord:
        """``run`` carrying the environment a run_start set since the last Output with a
        run record, then forgotten: it is written once, never kept in the state."""
        environment = self._environment
        if environment is None:
            return run
        self._environment = None
        return msgspec.structs.replace(run, environment=environment)

    def _alloc(self) -> int | None:
        """The next ordinal, or ``None`` when the run is at its step ceiling."""
        ordinal = self._next
        run = self._run
        self._dirty = True
        if ordinal >= self._max_steps:
            run.truncated = True
            run.dropped_steps += 1
            return None
        self._next = run.step_count = ordinal + 1
        return ordinal

    # -- thinking ---------------------------------------------------------------

    def _delta_start(self, event: wire.ThinkingDelta, now: float) -> Output:
        """A delta that opens a thinking run, or one of a dropped thinking run."""
        if self._th_ord is None:
            ordinal = self._alloc()
            self._th_ord = self._max_steps if ordinal is None else ordinal  # open but dropped: counted once
            self._th_chars = 0
            self._th_clipped = False
            self._th_started = event.ts
            self._th_env = envelope(event, self.limits)
        if self._th_ord >= self._max_steps:
            return self._finish(Output([], [], None, None, [], []))
        return self._buffer(event.payload.text, now)

    def _buffer(self, text: str, now: float) -> Output:
        """Add one delta's text to the tail; flush it whole once it holds ``flush_bytes``
        or ``flush_deltas`` deltas."""
        self._pending = True
        self._delta_now = now
        if not self._th_clipped:
            self._tail.append(text)
        n = len(text)
        self._tail_chars += n
        if not text.isascii():
            n = _utf8_len(text)
        n += self._tail_bytes
        self._tail_bytes = n
        deltas = self._tail_deltas = self._tail_deltas + 1
        if n >= self._flush_bytes or deltas >= self._flush_deltas:
            out = Output([], [], None, None, [], [])
            self._flush_thinking(out, "size", close=False)
            return self._finish(out)
        return BUFFERED

    def _flush_thinking(self, out: Output, trigger: str, *, close: bool) -> None:
        """Write the open thinking step (and its pending chunk); close it if asked."""
        ordinal = self._th_ord
        assert ordinal is not None
        if ordinal < self._max_steps:
            ts = self._latest()
            total = self._th_chars
            if self._pending:
                total += self._tail_chars
                deep = DeepRecord(
                    company_id=self.company_id, run_id=self.run_id, step_seq=ordinal, kind="thinking", ts=ts
                )
                if self._th_clipped:
                    deep.clipped = True  # nothing more is kept; the write only moves ts
                else:
                    if self._th_env is not None:
                        deep.call_event, self._th_env = self._th_env, None
                    chunk, offset, cut = clip_chunk("".join(self._tail), self._th_chars, self.limits.reasoning_chars)
                    deep.reasoning, deep.reasoning_offset = chunk, offset
                    if cut:
                        deep.clipped = self._th_clipped = True
                        out.clipped.append("reasoning")
                out.deeps.append(deep)
                self._th_chars = total
                self._tail = []
                self._tail_chars = self._tail_bytes = self._tail_deltas = 0
                self._pending = False
            started = self._started_text()
            out.steps.append(
                thinking_step(
                    self.company_id, self.run_id, ordinal, chars=total, started_at=started, ts=ts, closed=close
                )
            )
            out.flushes.append(trigger)
        if close:
            self._th_ord = None
            self._th_chars = 0
            self._th_clipped = False
            self._th_started = None
            self._th_env = None

    # -- abandoned runs -------------------------------------------------------------

    def _close(self, event: wire.RunClose) -> Output | None:
        """A compactor's ``run_close`` (module docstring): no seq of its own."""
        run = self._run
        if run.status != "running" or event.seq != self._last_seq or not in_window(event.ts):
            self.stale += 1
            return None
        at = format_ts(event.ts)
        out = Output([], [], None, None, [], [])
        if self._th_ord is not None:
            self._flush_thinking(out, "close", close=True)
        for key, ordinal in (self._open or {}).items():
            kind = "tool" if key.startswith("tool:") else "llm"
            out.steps.append(StepRecord(company_id=self.company_id, run_id=self.run_id, step_seq=ordinal,
                                        kind=kind, status="abandoned", ended_at=at))  # fmt: skip
        run.status = "abandoned"
        run.ended_at = at
        self._closes += 1
        self._dirty = True
        return self._finish(out)

    # -- other events -------------------------------------------------------------

    def _emit(self, out: Output, rows: Rows) -> None:
        out.steps.append(rows.step)
        out.deeps.append(rows.deep)
        if rows.clipped is not None:
            out.clipped.append(rows.clipped)

    def _opening(self, event: Any, at: str, out: Output) -> None:
        """A tool call, LLM request, state change or error: a new ordinal."""
        ordinal = self._alloc()
        if ordinal is None:
            return
        if type(event) in CALLS:
            if self._open is None:
                self._open = {}
            self._open[call_key(event)] = ordinal
        self._emit(out, opening_rows(event, self.company_id, self.run_id, ordinal, at, self.limits))

    def _result(self, event: Any, at: str, out: Output) -> None:
        """A tool result or LLM response: completes its call's ordinal."""
        usage = getattr(event.payload, "usage", None)
        if usage is not None:
            run = self._run
            run.input_tokens = min(run.input_tokens + usage.input_tokens, MAX_TOKEN_TOTAL)
            run.output_tokens = min(run.output_tokens + usage.output_tokens, MAX_TOKEN_TOTAL)
            run.reasoning_tokens = min(run.reasoning_tokens + usage.reasoning_tokens, MAX_TOKEN_TOTAL)
            self._dirty = True
        key = call_key(event)
        ordinal = None if self._open is None else self._open.pop(key, None)
        matched = ordinal is not None
        if ordinal is None:
            if self._next >= self._max_steps:
                return  # the result of a dropped call, or nothing to match in a truncated run
            ordinal = self._alloc()
            assert ordinal is not None
            if self._skipped and self._skipped[0][0] < event.seq:
                self._await_call(key, ordinal)  # its call may be in a gap below it
        self._emit(out, result_rows(event, self.company_id, self.run_id, ordinal, at, self.limits, matched=matched))

    def _run_start(self, event: wire.RunStart, at: str, out: Output) -> None:
        p = event.payload
        run = self._run
        run.agent_name = scrub(p.agent_name)
        if p.session_id is not None:
            run.session_id = scrub(p.session_id)
        run.start_event_id = event.event_id
        if p.environment is not None:
            # A string, or an object redacted by key; then capped in bytes as a whole.
            self._environment, cut = json_body_bytes(scrub(p.environment), self.limits.environment_bytes)
            if cut:
                out.clipped.append("environment")
        run.started_at = at
        self._dirty = True

    def _run_end(self, event: wire.RunEnd, at: str, out: Output) -> None:
        p = event.payload
        run = self._run
        run.status = p.status
        run.failure, out.failure_coerced = coerce_failure(p.status, p.failure)
        run.ended_at = at
        run.end_event_id = event.event_id
        self._dirty = True

    # -- late events ------------------------------------------------------------

    def _skipped_range(self, seq: int) -> int:
        """The index of the skipped range holding ``seq``, or -1 (a duplicate)."""
        ranges = self._skipped
        index = bisect_right(ranges, (seq, MAX_TOKEN_TOTAL)) - 1
        return index if index >= 0 and ranges[index][1] >= seq else -1

    def _bounded(self, ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
        """At most ``late_ranges`` ranges: the oldest (lowest) are forgotten, so their
        seqs count as duplicates if they ever arrive."""
        over = len(ranges) - self.limits.late_ranges
        return ranges[over:] if over > 0 else ranges

    def _after_gap(self, event: wire.Event, last: int, now: float) -> Output:
        """An event past a gap: remember the skipped seqs, close an open thinking run
        (the missing events may hold what closed it), then apply the event."""
        seq = event.seq
        self._skipped = self._bounded((*self._skipped, (last + 1, seq - 1)))
        self._run.seq_gaps += 1
        self._dirty = True
        self._last_seq = seq
        out = Output([], [], None, None, [], [])
        if self._th_ord is not None:
            self._flush_thinking(out, "close", close=True)
        ts = event.ts
        if self._max_ts is None or ts > self._max_ts:
            self._see(ts)
        if type(event) is _ThinkingDelta:
            more = self._delta_start(event, now)
            if more is BUFFERED:
                more = Output([], [], None, None, [], [])  # it gets seq_gap below: not the shared one
            out.steps += more.steps
            out.deeps += more.deeps
            out.flushes += more.flushes
            out.clipped += more.clipped
            out.run, out.state = more.run, more.state
            if more.state is None and not out.steps:
                out = more  # only buffered
        else:
            _HANDLERS[type(event)](self, event, format_ts(ts), out)
            out = self._finish(out)
        out.seq_gap = True
        return out

    def _late(self, event: wire.Event, skipped: int) -> Output:
        """An event that fills a skipped seq. It makes or completes its own step as an
        in-order event would, but never touches the open thinking run: a late delta
        becomes a closed thinking step of its own."""
        seq = event.seq
        first, last = self._skipped[skipped]
        pieces = tuple(r for r in ((first, seq - 1), (seq + 1, last)) if r[0] <= r[1])
        self._skipped = self._bounded(self._skipped[:skipped] + pieces + self._skipped[skipped + 1 :])
        self.late += 1
        run = self._run
        run.late_events += 1
        self._dirty = True
        ts = event.ts
        if self._max_ts is None or ts > self._max_ts:
            self._see(ts)
        at = format_ts(ts)
        if run.started_at is None or at < run.started_at:
            run.started_at = at
        out = Output([], [], None, None, [], [])
        out.late = True
        kind = type(event)
        if kind is _ThinkingDelta:
            self._late_delta(event, at, out)
        elif kind in CALLS and self._awaiting is not None and call_key(event) in self._awaiting:
            self._late_call(event, at, out)
        else:
            _HANDLERS[kind](self, event, at, out)
        if not self._skipped:
            self._awaiting = None  # no call can arrive late any more
        return self._finish(out)

    def _late_call(self, event: Any, at: str, out: Output) -> None:
        """A late call whose result came first and made the step: fill in the call's
        fields and keep the result's status (the store keeps what a ``None`` leaves)."""
        assert self._awaiting is not None
        ordinal = self._awaiting.pop(call_key(event))
        if not self._awaiting:
            self._awaiting = None
        rows = opening_rows(event, self.company_id, self.run_id, ordinal, at, self.limits)
        rows.step.status = None
        self._emit(out, rows)

    def _late_delta(self, event: wire.ThinkingDelta, at: str, out: Output) -> None:
        ordinal = self._alloc()
        if ordinal is None:
            return
        text = event.payload.text
        body, cut = clip(text, self.limits.reasoning_chars)
        out.deeps.append(DeepRecord(company_id=self.company_id, run_id=self.run_id, step_seq=ordinal,
                                    kind="thinking", ts=at, reasoning=body, clipped=cut,
                                    call_event=envelope(event, self.limits, at)))  # fmt: skip
        if cut:
            out.clipped.append("reasoning")
        out.steps.append(
            thinking_step(self.company_id, self.run_id, ordinal, chars=len(text), started_at=at, ts=at, closed=True)
        )

    def _await_call(self, key: str, ordinal: int) -> None:
        awaiting = self._awaiting
        if awaiting is None:
            awaiting = self._awaiting = {}
        awaiting[key] = ordinal
        if len(awaiting) > self.limits.late_ranges:
            del awaiting[next(iter(awaiting))]  # the oldest is forgotten


_HANDLERS: dict[type, _Handler] = {
    wire.RunStart: RunFold._run_start,
    wire.RunEnd: RunFold._run_end,
    **{cls: RunFold._opening for cls in OPENERS},
    **{cls: RunFold._result for cls in RESULTS},
}
