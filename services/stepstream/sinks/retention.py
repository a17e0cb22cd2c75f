"""The retention index rules every deep backend shares (one home for each rule).

Each backend keeps, per ``(company_id, run_id)``, one small index entry beside the
bodies (``core.records`` is untouched): ``rank``, ``last_ts``, ``received_at``,
``version`` and ``pruned_at`` (:class:`~stepstream.sinks.ports.DeepRun` says what
they mean). A ``DeepStore.write`` does, per run of the batch and in this order:

1. drop the run's bodies if its entry is marked pruned (they are refused);
2. fold the batch into the entry (:func:`batch_ranks`, :func:`fold_write`):
   ``rank`` and ``last_ts`` and ``received_at`` keep their maximum, ``version`` + 1;
3. write the bodies.

Bumping the version before the bodies land is what makes a conditional prune safe
on a backend without transactions: a prune that ranked the run before the bump
finds another version and leaves the run alone, and one that marked it before the
write's check makes the write drop the bodies (or, where the check is a separate
read, leaves bodies on a marked run that readers never see and the next pass deletes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone

import msgspec

from stepstream.core.records import DeepRecord
from stepstream.core.timefmt import format_ts
from stepstream.sinks.ports import DeepRun, RetentionStore

RunKey = tuple[str, str]
Clock = Callable[[], float]

__all__ = ["IndexEntry", "batch_ranks", "choose_pruned", "fold_write", "merge_index", "now_text", "prune_via_marks"]


def now_text(clock: Clock) -> str:
    """The clock's time as a stored timestamp (RFC 3339 UTC, microseconds, ``Z``)."""
    return format_ts(datetime.fromtimestamp(clock(), timezone.utc))


class IndexEntry(msgspec.Struct, kw_only=True):
    """One run's entry, as the memory and file backends hold it."""

    company_id: str
    run_id: str
    rank: str = ""
    last_ts: str = ""
    received_at: str = ""
    version: int = 0
    pruned_at: str | None = None


def batch_ranks(deeps: Iterable[DeepRecord], received: str) -> dict[RunKey, tuple[str, str]]:
    """Per run of a batch: ``(last ts, rank)`` = ``(max ts, min(max ts, received))``
    (the maximum over rows of ``min(ts, received)`` is the minimum of the two maxima)."""
    latest: dict[RunKey, str] = {}
    for deep in deeps:
        key = (deep.company_id, deep.run_id)
        ts = latest.get(key)
        if ts is None or deep.ts > ts:
            latest[key] = deep.ts
    return {key: (ts, min(ts, received)) for key, ts in latest.items()}


def fold_write(entry: IndexEntry | None, key: RunKey, last_ts: str, rank: str, received: str) -> IndexEntry:
    """The entry after one write stored bodies for the run."""
    if entry is None:
        return IndexEntry(company_id=key[0], run_id=key[1], rank=rank, last_ts=last_ts, received_at=received, version=1)
    entry.rank = max(entry.rank, rank)
    entry.last_ts = max(entry.last_ts, last_ts)
    entry.received_at = max(entry.received_at, received)
    entry.version += 1
    return entry


def merge_index(
    entries: Mapping[str, IndexEntry | DeepRun], bodies: Mapping[str, tuple[int, str]]
) -> list[DeepRun]:
    """:meth:`RetentionStore.retention_index` from a company's entries (by run id) and
    its bodies (run id -> ``(rows, last ts)``): every run holding bodies or marked
    pruned, highest rank first (ties: larger run id). A run with bodies and no entry
    (written before the index existed) ranks by its last ts, version 0."""
    out: list[DeepRun] = []
    for run_id in entries.keys() | bodies.keys():
        entry = entries.get(run_id)
        rows, last = bodies.get(run_id, (0, ""))
        if entry is None:
            out.append(DeepRun(run_id=run_id, rank=last, last_ts=last, received_at=last, version=0, bodies=rows))
        elif rows or entry.pruned_at is not None:
            out.append(DeepRun(run_id=run_id, rank=entry.rank, last_ts=entry.last_ts, received_at=entry.received_at,
                               version=entry.version, bodies=rows, pruned_at=entry.pruned_at))  # fmt: skip
    out.sort(key=lambda r: (r.rank, r.run_id), reverse=True)
    return out


def choose_pruned(index: Sequence[DeepRun], keep: int) -> list[DeepRun]:
    """The runs past the newest ``keep`` that still hold bodies and are not marked."""
    live = [r for r in index if r.pruned_at is None]
    return live[keep:]


async def prune_via_marks(store: RetentionStore, company_id: str, keep: int, at: str) -> list[str]:
    """``RetentionStore.prune`` in terms of the index: rank, mark, delete."""
    chosen = choose_pruned(await store.retention_index(company_id), keep)
    if not chosen:
        return []
    marked = await store.mark_pruned(company_id, [(r.run_id, r.version) for r in chosen], at)
    await store.delete_pruned(company_id, marked)
    return marked
