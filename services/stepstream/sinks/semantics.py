"""What every backend shares: the stored-row merge, the stale-run rule of a step
batch, run recency and its cursor, the clipping every deep write goes through at
the port (``core.caps``), and the error a value no backend column can hold becomes.

The merge is ``core.merge`` (re-exported here: :func:`apply_deep`,
:func:`apply_reasoning`, :func:`merge_run`, :func:`merge_step`,
``KEPT_RUN_FIELDS``), the one definition of the write semantics of
``core.records``: a stored deep row always starts at character 0,
a write at ``reasoning_offset`` N overwrites its own span, a deep row's ``ts``
is the latest it was written with. The memory and file backends apply it in
Python; SQLite calls :func:`apply_reasoning` from SQL and MongoDB before its
conditional write, and the conformance suite holds every backend to it.

**Stale runs** (:func:`admit`). A step batch carries at most one state per run
that matters, its last; a run whose stored state's ``last_seq`` is not below
that one is *stale* in this batch (a former partition owner writing late), and
none of its steps, run records or states are written. Each backend reads the
stored ``last_seq`` where its own atomicity allows and calls :func:`admit`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

import msgspec

from stepstream.core.caps import clip_deep
from stepstream.core.limits import Limits
from stepstream.core.merge import KEPT_RUN_FIELDS, apply_deep, apply_reasoning, merge_run, merge_step
from stepstream.core.records import DeepRecord, RunRecord, RunState, StepRecord
from stepstream.errors import SinkError
from stepstream.sinks.ports import PROBLEM_COUNTERS, PROBLEM_STATUSES, InvalidCursor, RunFilter

RunKey = tuple[str, str]

__all__ = [
    "DEFAULT_LIMITS",
    "KEPT_RUN_FIELDS",
    "Admitted",
    "ClipHook",
    "RunKey",
    "admit",
    "apply_deep",
    "apply_reasoning",
    "check_keep",
    "check_limit",
    "clip_batch",
    "decode_cursor",
    "encode_cursor",
    "matches",
    "merge_run",
    "merge_step",
    "newest_first",
    "page",
    "recency",
    "run_sort_key",
    "seq_range",
    "state_keys",
    "unstorable",
]


def state_keys(states: Sequence[RunState]) -> list[RunKey]:
    """The runs that have a state in a batch, in first-seen order."""
    return list(dict.fromkeys((s.company_id, s.run_id) for s in states))


class Admitted(NamedTuple):
    """The part of a step batch that may be written, and the runs left out."""

    steps: list[StepRecord]
    runs: list[RunRecord]
    states: list[RunState]
    skipped: list[RunKey]


def admit(
    steps: Sequence[StepRecord],
    runs: Sequence[RunRecord],
    states: Sequence[RunState],
    stored_last_seq: Mapping[RunKey, int],
) -> Admitted:
    """Drop every row of the runs whose batch state is not ahead of the stored one.

    ``stored_last_seq`` holds the stored ``last_seq`` of (at least) the runs of
    :func:`state_keys`; a run absent from it has no stored state. A run's batch
    state is its last in ``states``. A run with no state in the batch is kept
    whole. ``skipped`` lists the dropped runs in the order of ``states``."""
    latest: dict[RunKey, int] = {}
    for state in states:
        latest[(state.company_id, state.run_id)] = state.last_seq
    skipped = [key for key, seq in latest.items() if key in stored_last_seq and stored_last_seq[key] >= seq]
    if not skipped:
        return Admitted(list(steps), list(runs), list(states), [])
    drop = set(skipped)
    return Admitted(
        [r for r in steps if (r.company_id, r.run_id) not in drop],
        [r for r in runs if (r.company_id, r.run_id) not in drop],
        [r for r in states if (r.company_id, r.run_id) not in drop],
        skipped,
    )


def unstorable(backend: str, table: str, exc: BaseException) -> SinkError:
    """A value the backend cannot hold (an int beyond 64 bits, a lone surrogate, a
    document the driver refuses): non-retriable, since the same batch fails the
    same way. The message names the exception type and the table but never the
    value (bodies hold secrets); raise it ``from None`` for the same reason."""
    return SinkError(f"{backend} sink: cannot write {table}: {type(exc).__name__} (value not shown)")


def recency(run: RunRecord) -> str:
    """A run's place in ``list_runs``: ``started_at``, else ``last_event_at``, else ``""``."""
    return run.started_at or run.last_event_at or ""


def matches(run: RunRecord, where: RunFilter) -> bool:
    """Whether ``run`` passes ``where`` (the backends without a query language use it)."""
    if where.status is not None and run.status != where.status:
        return False
    if where.agent is not None and run.agent_name != where.agent:
        return False
    if where.since is not None and recency(run) < where.since:
        return False
    if where.until is not None and recency(run) >= where.until:
        return False
    if where.problems:
        counters = any(getattr(run, name) > 0 for name in PROBLEM_COUNTERS)
        return counters or run.truncated or run.status in PROBLEM_STATUSES
    return True


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


def seq_range(seqs: Iterable[int], after: int | None, limit: int | None) -> list[int]:
    """The sorted ``seqs`` above ``after``, at most ``limit`` of them (the in-memory
    backends' range of ``get_steps`` / ``get_deep``)."""
    if limit is not None:
        check_limit(limit)
    chosen = sorted(s for s in seqs if after is None or s > after)
    return chosen if limit is None else chosen[:limit]


def check_limit(limit: int) -> int:
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    return limit


def check_keep(keep: int) -> int:
    if keep < 0:
        raise ValueError(f"keep must be at least 0, got {keep}")
    return keep


DEFAULT_LIMITS = Limits()


ClipHook = Callable[[str], None]


def clip_batch(
    deeps: Iterable[DeepRecord], limits: Limits | None = None, on_clip: ClipHook | None = None
) -> list[DeepRecord]:
    """Every record clipped to the caps of ``limits`` (default: the contract's) with
    ``core.caps.clip_deep``; a record within them is passed through as is. ``on_clip``
    hears the name of every body the port cut (the worker counts them in
    ``stepstream_clipped_bodies``); a record the engine made is already within the
    caps, so only a foreign one (an import, a smaller cap here) is ever cut."""
    limits = limits or DEFAULT_LIMITS
    if on_clip is None:
        return [clip_deep(d, limits) for d in deeps]
    out = []
    for deep in deeps:
        clipped = clip_deep(deep, limits)
        if clipped is not deep:
            for field in _BODIES:
                if getattr(clipped, field) is not getattr(deep, field):
                    on_clip(field)
        out.append(clipped)
    return out


_BODIES = ("reasoning", "arguments", "output")


def newest_first(last_ts: dict[str, str]) -> list[tuple[str, str]]:
    """``(run_id, ts)`` pairs ordered as :meth:`RetentionStore.list_deep_runs` promises."""
    return sorted(last_ts.items(), key=lambda item: (item[1], item[0]), reverse=True)


def page(runs: Sequence[RunRecord], limit: int) -> tuple[list[RunRecord], str | None]:
    """Split a ``limit + 1`` fetch into the page and its next cursor."""
    if len(runs) > limit:
        kept = list(runs[:limit])
        return kept, encode_cursor(kept[-1])
    return list(runs), None
