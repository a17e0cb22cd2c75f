"""What every backend shares: the stored-row merge, run recency and its cursor,
and the clipping every deep write goes through at the port (``core.caps``).

The merge here is the *store's* view of ``core.records``: a stored deep row
always starts at character 0, and a write at ``reasoning_offset`` N leaves
``stored[:N] + written`` (an offset past the stored end simply appends, as
Python slicing does). A deep row's ``ts`` is the latest it was written with
(``max``), as ``core.merge.merge_deep`` coalesces a batch, so a row is the same
whether or not the worker's batch boundaries fell between two writes. The
memory and file backends apply it in Python; SQLite and MongoDB implement the
same rule natively and the conformance suite holds them to it.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Sequence

import msgspec

from stepstream.core.caps import clip_deep
from stepstream.core.fold import Limits
from stepstream.core.merge import merge_step
from stepstream.core.records import DeepRecord, RunRecord
from stepstream.sinks.ports import InvalidCursor

__all__ = [
    "DEFAULT_LIMITS",
    "apply_deep",
    "apply_reasoning",
    "check_keep",
    "check_limit",
    "clip_batch",
    "decode_cursor",
    "encode_cursor",
    "merge_step",
    "newest_first",
    "page",
    "recency",
    "run_sort_key",
]


def apply_reasoning(stored: str | None, offset: int, written: str | None) -> str | None:
    """The positional rule: ``stored[:offset] + written``; ``None`` keeps."""
    if written is None:
        return stored
    if not offset or stored is None:
        return written
    return stored[:offset] + written


def apply_deep(stored: DeepRecord | None, written: DeepRecord) -> DeepRecord:
    """The row a store holds after ``written`` lands on ``stored``. The result
    always has ``reasoning_offset`` 0."""
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
    )


def recency(run: RunRecord) -> str:
    """A run's place in ``list_runs``: ``started_at``, else ``last_event_at``, else ``""``."""
    return run.started_at or run.last_event_at or ""


def run_sort_key(run: RunRecord) -> tuple[str, str]:
    return (recency(run), run.run_id)


_cursor_encoder = msgspec.json.Encoder()
_cursor_decoder = msgspec.json.Decoder(tuple[str, str])


def encode_cursor(run: RunRecord) -> str:
    """An opaque cursor after ``run``: URL-safe, the same in every backend."""
    raw = _cursor_encoder.encode(run_sort_key(run))
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: str) -> tuple[str, str]:
    """``(recency, run_id)`` of a cursor made by :func:`encode_cursor`."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        return _cursor_decoder.decode(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (binascii.Error, UnicodeEncodeError, ValueError, msgspec.DecodeError):
        raise InvalidCursor(f"not a runs cursor: {cursor[:64]!r}") from None


def check_limit(limit: int) -> int:
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    return limit


def check_keep(keep: int) -> int:
    if keep < 0:
        raise ValueError(f"keep must be at least 0, got {keep}")
    return keep


DEFAULT_LIMITS = Limits()


def clip_batch(deeps: Iterable[DeepRecord], limits: Limits | None = None) -> list[DeepRecord]:
    """Every record clipped to the caps of ``limits`` (default: the contract's) with
    ``core.caps.clip_deep``; a record within them is passed through as is."""
    limits = limits or DEFAULT_LIMITS
    return [clip_deep(d, limits) for d in deeps]


def newest_first(last_ts: dict[str, str]) -> list[tuple[str, str]]:
    """``(run_id, ts)`` pairs ordered as :meth:`RetentionStore.list_deep_runs` promises."""
    return sorted(last_ts.items(), key=lambda item: (item[1], item[0]), reverse=True)


def page(runs: Sequence[RunRecord], limit: int) -> tuple[list[RunRecord], str | None]:
    """Split a ``limit + 1`` fetch into the page and its next cursor."""
    if len(runs) > limit:
        kept = list(runs[:limit])
        return kept, encode_cursor(kept[-1])
    return list(runs), None
