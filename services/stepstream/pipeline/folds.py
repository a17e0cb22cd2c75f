"""The folds of the runs held in memory: a cache, least recently used first.

A fold is only a cache of its run's durable :class:`~stepstream.core.records.RunState`
plus, at most, an unflushed thinking tail. Dropping a fold without a tail loses
nothing: the run reloads from the step store (or from the batch not yet written)
when it speaks again. A fold with a tail is flushed before it is dropped.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator

from stepstream.core.fold import Limits, RunFold
from stepstream.core.records import RunState

RunKey = tuple[str, str]


class Entry:
    __slots__ = ("fold", "tp", "touched")

    def __init__(self, fold: RunFold, tp: Hashable, touched: float) -> None:
        self.fold = fold
        self.tp = tp  # the partition of the run's latest event (None offline)
        self.touched = touched


class FoldCache:
    """Run key -> :class:`Entry`, in least-recently-used order, plus the set of runs
    whose fold holds an unflushed thinking tail (``tails``)."""

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._entries: dict[RunKey, Entry] = {}
        self.tails: set[RunKey] = set()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: RunKey) -> bool:
        return key in self._entries

    def touch(self, key: RunKey, tp: Hashable, now: float) -> Entry | None:
        """The entry of ``key`` moved to the most recent end, or ``None``."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            entry.tp = tp
            entry.touched = now
            self._entries[key] = entry
        return entry

    def get(self, key: RunKey) -> Entry | None:
        return self._entries.get(key)

    def open(self, key: RunKey, state: RunState | None, tp: Hashable, now: float) -> Entry:
        entry = Entry(RunFold(key[0], key[1], state, self._limits, lazy=True), tp, now)
        self._entries[key] = entry
        return entry

    def drop(self, key: RunKey) -> Entry | None:
        self.tails.discard(key)
        return self._entries.pop(key, None)

    def least_recent(self) -> tuple[RunKey, Entry]:
        """The entry touched longest ago (the cache must not be empty)."""
        key = next(iter(self._entries))
        return key, self._entries[key]

    def idle_since(self, cutoff: float) -> Iterator[RunKey]:
        """Runs not touched since ``cutoff`` and holding no tail, oldest first."""
        for key, entry in list(self._entries.items()):
            if entry.touched >= cutoff:
                break
            if not entry.fold.pending:
                yield key

    def on_partitions(self, tps: set[Hashable]) -> list[RunKey]:
        return [key for key, entry in self._entries.items() if entry.tp in tps]
