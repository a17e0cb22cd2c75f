"""The split: what one event's step (scrubbed) and deep companion (raw) look like.

``core.fold`` decides *which* ordinal an event writes; this module decides *what*
it writes there. Per event type:

============== ===================== ================================ ===========================
event          step label            step arguments (redacted)        deep body (raw JSON value)
============== ===================== ================================ ===========================
tool_call      the tool              the arguments                    ``arguments``: the arguments
llm_request    ``provider/model``    the params                       ``arguments``: the input
state_change   the key               ``{key: value}``                 ``arguments``: the value
error          the kind, or "error"  ``{"message": masked message}``  ``output``: the message
tool_result    (kept)                (kept)                           ``output``: the output
llm_response   (kept)                (kept)                           ``output``: the output
============== ===================== ================================ ===========================

A call writes its step ``running``; its result writes only what it knows
(status, ``output_shape``, ``ended_at``) and leaves ``label``, ``arguments`` and
``started_at`` as ``None`` for the store to keep (``core.records``). A result with
no open call is labelled ``unmatched result`` and carries its own start time.
A step never holds raw output or thinking text: only shapes (``core.shapes``).
Labels, call ids and error messages go through ``core.redact.scrub`` (credentials
masked, then clipped: 256 characters, 2,048 for a message).
Bodies are clipped to the caps of ``core.caps``, and so are a step's redacted
``arguments`` (:func:`step_arguments`): the argument cap is the ceiling of the
operator view too, with the same rule (``core.caps.json_body``: clip, mark, never
refuse), so a step never shows more of an argument than its deep body holds.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from stepstream.core import wire
from stepstream.core.caps import json_body
from stepstream.core.envelope import envelope
from stepstream.core.limits import Limits
from stepstream.core.records import DeepRecord, StepRecord
from stepstream.core.redact import TEXT_CHARS, redact, scrub
from stepstream.core.shapes import shape, shape_chars


__all__ = [
    "CALLS",
    "OPENERS",
    "RESULTS",
    "Rows",
    "call_key",
    "opening_rows",
    "result_rows",
    "step_arguments",
    "thinking_step",
]

CALLS = (wire.ToolCall, wire.LlmRequest)
RESULTS = (wire.ToolResult, wire.LlmResponse)
OPENERS = (*CALLS, wire.StateChange, wire.Error)


class Rows(NamedTuple):
    step: StepRecord
    deep: DeepRecord
    clipped: str | None  # the deep field that was clipped, if any


def call_key(event: Any) -> str:
    """The ``open_calls`` key of a call or result: ``tool:<call_id>`` or ``llm:<call_id>``."""
    prefix = "tool:" if type(event) in (wire.ToolCall, wire.ToolResult) else "llm:"
    return prefix + event.payload.call_id


def step_arguments(value: Any, limits: Limits) -> Any:
    """``value`` redacted (``core.redact``), then capped like an argument body
    (``core.caps.json_body`` at ``limits.arguments_chars``): within the cap it is
    the redacted value itself; over it, the head of its compact JSON text ending
    with the clip marker, as a string."""
    return json_body(redact(value).value, limits.arguments_chars)[0]


def _rows(step: StepRecord, at: str, field: str, raw: Any, cap: int, env: tuple[str, dict[str, Any]]) -> Rows:
    body, cut = json_body(raw, cap)
    deep = DeepRecord(
        company_id=step.company_id, run_id=step.run_id, step_seq=step.step_seq, kind=step.kind, ts=at, clipped=cut
    )
    setattr(deep, field, body)
    setattr(deep, env[0], env[1])
    return Rows(step, deep, field if cut else None)


def opening_rows(event: Any, company_id: str, run_id: str, ordinal: int, at: str, limits: Limits) -> Rows:
    """The rows of a call, a state change or an error (``at``: its formatted ts)."""
    p = event.payload
    env = ("call_event", envelope(event, limits, at))
    base: dict[str, Any] = {"company_id": company_id, "run_id": run_id, "step_seq": ordinal, "started_at": at}
    if type(event) is wire.ToolCall:
        step = StepRecord(**base, kind="tool", label=scrub(p.tool), status="running", call_id=scrub(p.call_id),
                          arguments=step_arguments(p.arguments, limits), input_shape=shape(p.arguments))  # fmt: skip
        return _rows(step, at, "arguments", p.arguments, limits.arguments_chars, env)
    if type(event) is wire.LlmRequest:
        params = None if p.params is None else step_arguments(p.params, limits)
        step = StepRecord(**base, kind="llm", label=scrub(f"{p.provider}/{p.model}"), status="running",
                          call_id=scrub(p.call_id),
                          arguments=params, input_shape=shape(p.input))  # fmt: skip
        return _rows(step, at, "arguments", p.input, limits.arguments_chars, env)
    if type(event) is wire.StateChange:
        step = StepRecord(**base, kind="state", label=scrub(p.key), status="ok",
                          arguments=step_arguments({p.key: p.value}, limits), input_shape=shape(p.value), ended_at=at)  # fmt: skip
        return _rows(step, at, "arguments", p.value, limits.arguments_chars, env)
    if type(event) is wire.Error:
        step = StepRecord(**base, kind="error", label=scrub(p.kind or "error"), status="error",
                          arguments={"message": scrub(p.message, TEXT_CHARS)}, ended_at=at)  # fmt: skip
        return _rows(step, at, "output", p.message, limits.output_chars, env)
    raise TypeError(f"{type(event).__name__} opens no step")


def result_rows(
    event: Any, company_id: str, run_id: str, ordinal: int, at: str, limits: Limits, *, matched: bool
) -> Rows:
    """The rows of a tool result or LLM response completing ``ordinal`` (or, when
    not ``matched``, making it a step of its own)."""
    p = event.payload
    kind = "tool" if type(event) is wire.ToolResult else "llm"
    status = "error" if kind == "tool" and p.is_error else "ok"
    extra: dict[str, Any] = {} if matched else {"label": "unmatched result", "started_at": at}
    step = StepRecord(company_id=company_id, run_id=run_id, step_seq=ordinal, kind=kind, status=status,
                      call_id=scrub(p.call_id), output_shape=shape(p.output), ended_at=at, **extra)  # fmt: skip
    return _rows(step, at, "output", p.output, limits.output_chars, ("result_event", envelope(event, limits, at)))


def thinking_step(
    company_id: str, run_id: str, ordinal: int, *, chars: int, started_at: str | None, ts: str, closed: bool
) -> StepRecord:
    """The thinking step: no text, only the shape of all its text so far."""
    return StepRecord(
        company_id=company_id,
        run_id=run_id,
        step_seq=ordinal,
        kind="thinking",
        label="reasoning",
        status="ok" if closed else "running",
        output_shape=shape_chars(chars),
        started_at=started_at,
        ended_at=ts if closed else None,
    )
