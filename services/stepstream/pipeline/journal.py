"""Per run, the events applied since the last state of the run a store accepted.

A stale refusal (the store holds the run further: another owner wrote it) means
every row this pipeline made for the run since that state is void: the refused
batch, the open batch and the fold's unflushed tail were all made by a fold that
did not know what the other owner wrote. The journal keeps exactly the events
those rows came from, in the order they were applied, so that the run can be
reloaded from the store and the events applied again (``Pipeline`` does it; those
the other owner skipped are late events there, those it applied are duplicates).

Positions are absolute (they only grow): a batch notes, per run whose state it
carries, the position up to which that state reflects the events (:meth:`covered`);
once the batch is written and the run admitted, everything before it is
forgotten (:meth:`settle`). Pure bookkeeping, no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

Entry = tuple[Any, Hashable, int]  # (event, partition, offset)


class Journal:
    __slots__ = ("entries", "start", "tail")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.start = 0  # the absolute position of entries[0]
        self.tail: int | None = None  # position of the first event of the unflushed tail

    @property
    def end(self) -> int:
        return self.start + len(self.entries)

    def add(self, event: Any, tp: Hashable, offset: int, buffered: bool) -> None:
        """An event applied; ``buffered``: it only went into the fold's tail."""
        if buffered:
            if self.tail is None:
                self.tail = self.end
        else:
            self.tail = None
        self.entries.append((event, tp, offset))

    def flushed(self) -> None:
        """The fold's tail was flushed into a state (no event of its own)."""
        self.tail = None

    def covered(self) -> int:
        """Where the fold's durable state stands now: a pending tail is not in it."""
        return self.end if self.tail is None else self.tail

    def settle(self, position: int) -> bool:
        """A state covering up to ``position`` was written; ``True`` when nothing is left."""
        if position > self.start:
            del self.entries[: position - self.start]
            self.start = position
        return not self.entries

    def take(self) -> list[Entry]:
        """Every entry, for a redo; the journal is empty afterwards."""
        entries, self.entries = self.entries, []
        self.start += len(entries)
        self.tail = None
        return entries
