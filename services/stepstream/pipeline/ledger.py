"""The one ledger of what is durable and what may be committed, per partition.

A consumed message is in exactly one of three places until its effect is durable:

* the **open batch**: it was delivered since the last batch was sealed (its rows,
  its duplicate skip or its dead-letter copy ride on that batch);
* a **sealed batch**: a batch being written (in order, one at a time in practice);
* a run's **hold**: a thinking delta whose text sits in its run's unflushed tail.
  A hold remembers only the run's *first* held offset and when it was taken: later
  deltas of the same tail are above it and become durable together with it.

The **watermark** of a partition (what faust commits) is the lowest offset still in
one of those places, or the offset after the last one delivered when none is: the
offset after the longest prefix whose effects are all durable. It only moves
forward while the partition stays assigned.

A hold is *released* when its run emits a state (the tail flushed): the held offset
then moves into the open batch (its floor drops to it) and becomes durable when that
batch does. Pure bookkeeping: no I/O, no clock of its own (``now`` is passed in).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from typing import Any

RunKey = tuple[str, str]


class Sealed:
    """The floors of one batch handed to the writer: offsets at or above a floor (per
    partition) are not durable until :meth:`Ledger.durable` is called with it."""

    __slots__ = ("floors",)

    def __init__(self, floors: dict[Any, int]) -> None:
        self.floors = floors


class Ledger:
    """Per-partition durability bookkeeping; see the module docstring."""

    def __init__(self) -> None:
        self._next: dict[Hashable, int] = {}  # offset after the last delivered one
        self._open: dict[Hashable, int] = {}  # floor of the open batch
        self._sealed: list[Sealed] = []  # batches being written, oldest first
        # Holds: per partition, run -> (first held offset, time held), in the order
        # they were taken, so the first entry is the oldest; not always the lowest (a
        # redo after a stale refusal holds an earlier offset again, after later holds).
        self._holds: dict[Hashable, dict[RunKey, tuple[int, float]]] = {}
        self._hold_tp: dict[RunKey, Hashable] = {}

    # -- delivery -------------------------------------------------------------

    def delivered(self, tp: Hashable, first: int, last: int) -> None:
        """Records ``first..last`` of ``tp`` were delivered, in order, into the open batch."""
        if tp not in self._open:
            self._open[tp] = first
        self._next[tp] = last + 1

    def skipped(self, tp: Hashable, to: int) -> None:
        """The offsets from the last delivered one up to ``to`` (exclusive) hold no record
        to deliver (the consumer passed over transaction markers or aborted records
        there): the watermark may move past them. Ignored before ``tp``'s first delivery."""
        mark = self._next.get(tp)
        if mark is not None and to > mark:
            self._next[tp] = to

    def next_offset(self, tp: Hashable) -> int | None:
        """The offset after the last delivered one, ``None`` before the first delivery."""
        return self._next.get(tp)

    def hold(self, key: RunKey, tp: Hashable, offset: int, now: float) -> None:
        """``offset`` is a delta buffered in ``key``'s tail (only the first one counts)."""
        if key not in self._hold_tp:
            self._hold_tp[key] = tp
            self._holds.setdefault(tp, {})[key] = (offset, now)

    def release(self, key: RunKey, into: Sealed | None = None) -> None:
        """``key``'s tail is in the open batch now (or in the batch ``into``, being
        written): its hold becomes part of that batch."""
        tp = self._hold_tp.pop(key, None)
        if tp is None:
            return
        offset, _ = self._holds[tp].pop(key)
        floors = self._open if into is None else into.floors
        floor = floors.get(tp)
        if floor is None or offset < floor:
            floors[tp] = offset

    # -- batches ----------------------------------------------------------------

    def seal(self) -> Sealed:
        """Close the open batch (it is about to be written); a new one opens."""
        sealed = Sealed(self._open)
        self._open = {}
        self._sealed.append(sealed)
        return sealed

    def durable(self, sealed: Sealed) -> None:
        """The batch ``sealed`` is written: its offsets are durable."""
        try:
            self._sealed.remove(sealed)
        except ValueError:
            pass  # its partitions were dropped meanwhile

    # -- reading --------------------------------------------------------------

    def watermark(self, tp: Hashable) -> int | None:
        """The offset to commit for ``tp`` (``None``: nothing delivered yet)."""
        mark = self._next.get(tp)
        if mark is None:
            return None
        floor = self._open.get(tp)
        if floor is not None and floor < mark:
            mark = floor
        for sealed in self._sealed:
            floor = sealed.floors.get(tp)
            if floor is not None and floor < mark:
                mark = floor
        holds = self._holds.get(tp)
        if holds:
            # The lowest hold, not the first taken (see ``_holds``); read at commit cadence.
            first = min(offset for offset, _ in holds.values())
            if first < mark:
                mark = first
        return mark

    def partitions(self) -> list[Hashable]:
        return list(self._next)

    def expired_holds(self, now: float, max_age: float) -> Iterator[RunKey]:
        """Runs whose hold is older than ``max_age``, oldest first per partition."""
        for holds in list(self._holds.values()):
            for key, (_, since) in list(holds.items()):
                if now - since < max_age:
                    break
                yield key

    def oldest_hold_age(self, now: float) -> float:
        oldest = now
        for holds in self._holds.values():
            if holds:
                oldest = min(oldest, next(iter(holds.values()))[1])
        return now - oldest

    @property
    def held_runs(self) -> int:
        return len(self._hold_tp)

    # -- ownership --------------------------------------------------------------

    def drop(self, tps: Iterable[Hashable]) -> set[RunKey]:
        """Forget partitions (revoked); returns the runs that held messages there.
        Their messages are re-read by the next owner from the committed offset."""
        gone = set(tps)
        runs: set[RunKey] = set()
        for tp in gone:
            self._next.pop(tp, None)
            self._open.pop(tp, None)
            for sealed in self._sealed:
                sealed.floors.pop(tp, None)
            for key in self._holds.pop(tp, {}):
                self._hold_tp.pop(key, None)
                runs.add(key)
        return runs
