"""The JSON bodies of the operator routes (steps and runs), as msgspec Structs.

These are the API's own types, not the stored records: the wire shape of a
route stays put when storage changes, and every field is always present
(``null`` when unknown), which is what ``/openapi.json`` says. None of them has
a field for raw reasoning, arguments or output: a step is the redacted view.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from stepstream.core.records import RunRecord, StepRecord


class RunFailure(msgspec.Struct, kw_only=True):
    """Why a run failed: ``type`` is ``unknown`` when the agent gave only a message
    or nothing; ``step`` is the agent's step number when it gave one."""

    type: str
    message: str
    step: int | None


class Run(msgspec.Struct, kw_only=True):
    """One run record (CONTRACT section 2)."""

    company_id: str
    run_id: str
    agent_name: str | None
    session_id: str | None = None  # the conversation or session the run is part of
    environment: dict[str, Any] | str | None  # the run_start's object (redacted) or string
    status: Literal["running", "completed", "failed", "abandoned"]
    failure: RunFailure | None
    started_at: str | None
    ended_at: str | None
    last_event_at: str | None
    step_count: int
    input_tokens: int
    output_tokens: int
    reasoning_tokens: int
    truncated: bool
    dropped_steps: int
    seq_gaps: int
    late_events: int
    deep_pruned_at: str | None  # when retention dropped the run's deep bodies


class RunsPage(msgspec.Struct, kw_only=True):
    """Runs most recent first; pass ``next_cursor`` as ``before`` for the next
    (older) page. ``next_cursor`` is ``null`` on the last page."""

    runs: list[Run]
    next_cursor: str | None


class Step(msgspec.Struct, kw_only=True):
    """One step: kind, label, redacted arguments, shapes, status, times."""

    step_seq: int
    kind: Literal["thinking", "tool", "llm", "state", "error"]
    label: str | None
    status: Literal["running", "ok", "error", "abandoned"] | None
    call_id: str | None
    arguments: Any
    input_shape: str | None
    output_shape: str | None
    started_at: str | None
    ended_at: str | None


class RunDetail(msgspec.Struct, kw_only=True):
    """A run record and a page of its steps in ordinal order; pass ``next_cursor``
    as ``after`` for the next page. ``next_cursor`` is ``null`` on the last page."""

    run: Run
    steps: list[Step]
    next_cursor: str | None


class Health(msgspec.Struct, kw_only=True):
    status: Literal["ok"] = "ok"


def run_view(record: RunRecord) -> Run:
    return Run(
        company_id=record.company_id,
        run_id=record.run_id,
        agent_name=record.agent_name,
        session_id=record.session_id,
        environment=record.environment,
        status=record.status,
        failure=None
        if record.failure is None
        else RunFailure(type=record.failure.type, message=record.failure.message, step=record.failure.step),
        started_at=record.started_at,
        ended_at=record.ended_at,
        last_event_at=record.last_event_at,
        step_count=record.step_count,
        input_tokens=record.input_tokens,
        output_tokens=record.output_tokens,
        reasoning_tokens=record.reasoning_tokens,
        truncated=record.truncated,
        dropped_steps=record.dropped_steps,
        seq_gaps=record.seq_gaps,
        late_events=record.late_events,
        deep_pruned_at=record.deep_pruned_at,
    )


def step_view(record: StepRecord) -> Step:
    return Step(
        step_seq=record.step_seq,
        kind=record.kind,
        label=record.label,
        status=record.status,
        call_id=record.call_id,
        arguments=record.arguments,
        input_shape=record.input_shape,
        output_shape=record.output_shape,
        started_at=record.started_at,
        ended_at=record.ended_at,
    )
