"""The write semantics of ``core.records`` as pure functions: what a store holds
after a write. The memory sink, the file sink's reader and the pipeline's batch
coalescing all use these, so there is one definition of "replace on key".
"""

from __future__ import annotations

import msgspec

from stepstream.core.records import DeepRecord, StepRecord

_STEP_FIELDS = tuple(f for f in StepRecord.__struct_fields__ if f not in ("company_id", "run_id", "step_seq"))


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
    """``None`` bodies keep, ``clipped`` is sticky, ``reasoning`` is positional:
    the result holds ``stored[:written.reasoning_offset] + written.reasoning``.
    The result always has ``reasoning_offset`` 0 when ``stored`` starts at 0."""
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
            reasoning = head[:cut] + written.reasoning
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
