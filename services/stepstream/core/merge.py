"""The write semantics of ``core.records``, written once: what a store holds after
a write. Every backend is held to these functions (the conformance suite compares
each backend's rows with them):

* the memory and file backends apply :func:`apply_deep` and :func:`merge_step` in
  Python (through ``sinks.semantics``, which re-exports them);
* SQLite keeps ``None`` bodies in SQL (``coalesce``) and splices every other
  reasoning write with :func:`apply_reasoning`, registered on its connection as
  the SQL function ``stepstream_splice``;
* MongoDB reads the stored reasoning and ``$set`` s :func:`apply_reasoning` of it,
  on condition that the row still holds what it read (retried on a miss);
* the pipeline's batch coalesces two writes of one row with :func:`merge_deep`,
  which is *defined* as the one write equal to applying both in order.

**Run records** (:func:`merge_run`) replace whole, except the fields of
:data:`KEPT_RUN_FIELDS`, which a write of ``None`` keeps as stored: the compactor's
``deep_pruned_at`` mark (the worker never knows it) and the ``environment``, which
the engine writes once, with its run_start, and never holds in a fold's state
(memory and files apply :func:`merge_run`, SQLite ``coalesce`` s those columns,
MongoDB leaves them out of its ``$set``).

**The positional reasoning rule** (:func:`apply_reasoning`): a write carries the
text from character ``reasoning_offset`` on and overwrites its own span,
``stored[:offset] + written + stored[offset + len(written):]``. A chunk never
shortens the text, and writing the same chunk twice changes nothing (so a replay
converges). Two edge cases, chosen so that no written character is ever lost:
a row with no text takes the chunk as its text whatever its offset (the store's
text always starts at character 0), and a chunk starting past the stored end is
appended at the end (Python slicing). The engine never writes either: its chunks
are contiguous from 0; they arise only when rows were purged mid-run.
"""

from __future__ import annotations

import msgspec

from stepstream.core.records import DeepRecord, RunRecord, StepRecord

__all__ = ["KEPT_RUN_FIELDS", "apply_deep", "apply_reasoning", "can_merge_deep", "merge_deep", "merge_run", "merge_step"]

#: The run record fields that a write of ``None`` keeps as stored (module docstring).
KEPT_RUN_FIELDS = ("environment", "deep_pruned_at")

_STEP_FIELDS = tuple(f for f in StepRecord.__struct_fields__ if f not in ("company_id", "run_id", "step_seq"))


def apply_reasoning(stored: str | None, offset: int, written: str | None) -> str | None:
    """The positional reasoning rule (module docstring); ``None`` keeps."""
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


def merge_run(stored: RunRecord | None, written: RunRecord) -> RunRecord:
    """The run record a store holds after ``written`` lands on ``stored``: ``written``
    whole, but a ``None`` in a field of :data:`KEPT_RUN_FIELDS` keeps the stored value."""
    if stored is None:
        return written
    kept = {}
    for name in KEPT_RUN_FIELDS:
        if getattr(written, name) is None and getattr(stored, name) is not None:
            kept[name] = getattr(stored, name)
    return msgspec.structs.replace(written, **kept) if kept else written


def apply_deep(stored: DeepRecord | None, written: DeepRecord) -> DeepRecord:
    """The row a store holds after ``written`` lands on ``stored``: ``None`` bodies
    keep, ``clipped`` is sticky, ``ts`` the latest, ``kind`` the written one, and
    ``reasoning`` follows :func:`apply_reasoning`. A stored row always has
    ``reasoning_offset`` 0."""
    if stored is None:
        if written.reasoning_offset:
            return msgspec.structs.replace(written, reasoning_offset=0)
        return written
    return DeepRecord(
        company_id=stored.company_id,
        run_id=stored.run_id,
        step_seq=stored.step_seq,
        kind=written.kind,
        ts=max(stored.ts, written.ts),
        reasoning=apply_reasoning(stored.reasoning, written.reasoning_offset, written.reasoning),
        arguments=written.arguments if written.arguments is not None else stored.arguments,
        output=written.output if written.output is not None else stored.output,
        clipped=stored.clipped or written.clipped,
        call_event=written.call_event if written.call_event is not None else stored.call_event,
        result_event=written.result_event if written.result_event is not None else stored.result_event,
    )


def can_merge_deep(first: DeepRecord, second: DeepRecord) -> bool:
    """Whether :func:`merge_deep` can coalesce the two writes: the second chunk
    starts within the first or right after it (or one of them has no text)."""
    if second.reasoning is None or first.reasoning is None:
        return True
    cut = second.reasoning_offset - first.reasoning_offset
    return 0 <= cut <= len(first.reasoning)


def merge_deep(first: DeepRecord | None, second: DeepRecord) -> DeepRecord:
    """One write equal to writing ``first`` then ``second`` (``second`` alone when
    ``first`` is ``None``): for every stored row whose text reaches
    ``first.reasoning_offset``,
    ``apply_deep(apply_deep(row, first), second) == apply_deep(row, merge_deep(first, second))``.
    The chunk is :func:`apply_reasoning` of the second onto the first, at the
    first's offset. Raises ``ValueError`` unless :func:`can_merge_deep` holds
    (the two must then be written apart, in order)."""
    if first is None:
        return second
    if not can_merge_deep(first, second):
        raise ValueError("the second chunk does not start within or right after the first: write them apart")
    if first.reasoning is None:
        reasoning, offset = second.reasoning, second.reasoning_offset
    else:
        reasoning = apply_reasoning(first.reasoning, second.reasoning_offset - first.reasoning_offset, second.reasoning)
        offset = first.reasoning_offset
    return msgspec.structs.replace(
        first,
        kind=second.kind,
        ts=max(first.ts, second.ts),
        reasoning=reasoning,
        reasoning_offset=offset,
        arguments=second.arguments if second.arguments is not None else first.arguments,
        output=second.output if second.output is not None else first.output,
        clipped=first.clipped or second.clipped,
        call_event=second.call_event if second.call_event is not None else first.call_event,
        result_event=second.result_event if second.result_event is not None else first.result_event,
    )
