"""The write semantics of ``core.records`` as pure functions: what a store holds
after a write. The memory sink, the file sink's reader, the SQLite sink's splice
function and the pipeline's batch coalescing all use these, so there is one
definition of "replace on key" and of the positional reasoning rule.
"""

from __future__ import annotations

import msgspec

from stepstream.core.records import DeepRecord, StepRecord

_STEP_FIELDS = tuple(f for f in StepRecord.__struct_fields__ if f not in ("company_id", "run_id", "step_seq"))


def apply_reasoning(stored: str | None, offset: int, written: str | None) -> str | None:
    """The positional reasoning rule: ``written`` overwrites its own span of the
    stored text, ``stored[:offset] + written + stored[offset + len(written):]``.

    A chunk never shortens the text (a late, stale chunk rewrites characters that
    are already there, with the same text when the writer is deterministic); an
    offset past the stored end appends (Python slicing); ``None`` keeps."""
    if written is None:
        return stored
    if not stored:
        return written
    return stored[:offset] + written + stored[offset + len(written) :]


def merge_step(stored: StepRecord | None, written: StepRecord) -> StepRecord:
    """Field by field: a ``None`` in ``written`` keeps the stored value."""
    if stored is None:
        return written
    changes = {}
    for name in _STEP_FIELDS:
        value = getattr(written, name)
        if value is not None:
            changes[name] = value
    return msgspec.structs.replace(stored, **changes)


def merge_deep(stored: DeepRecord | None, written: DeepRecord) -> DeepRecord:
    """Coalesce two writes of one row into one: ``None`` bodies keep, ``clipped``
    is sticky, ``ts`` the latest, ``reasoning`` follows :func:`apply_reasoning`
    relative to ``stored.reasoning_offset``. When :func:`can_merge_deep` holds,
    writing the result equals writing ``stored`` then ``written`` on any row
    whose text reaches ``stored.reasoning_offset``; otherwise the written chunk
    starts a new window (characters would be lost, so callers check first)."""
    if stored is None:
        return written
    reasoning = stored.reasoning
    offset = stored.reasoning_offset
    if written.reasoning is not None:
        head = stored.reasoning or ""
        cut = written.reasoning_offset - offset
        if cut < 0 or cut > len(head):
            # Not adjacent to what is stored: the written chunk starts a new window.
            reasoning, offset = written.reasoning, written.reasoning_offset
        else:
            reasoning = apply_reasoning(head, cut, written.reasoning)
    return msgspec.structs.replace(
        stored,
        kind=written.kind,
        ts=max(stored.ts, written.ts),
        reasoning=reasoning,
        reasoning_offset=offset,
        arguments=written.arguments if written.arguments is not None else stored.arguments,
        output=written.output if written.output is not None else stored.output,
        clipped=stored.clipped or written.clipped,
    )


def can_merge_deep(stored: DeepRecord, written: DeepRecord) -> bool:
    """Whether ``merge_deep`` keeps every character (the chunk is adjacent or overlapping)."""
    if written.reasoning is None or stored.reasoning is None:
        return True
    cut = written.reasoning_offset - stored.reasoning_offset
    return 0 <= cut <= len(stored.reasoning)
