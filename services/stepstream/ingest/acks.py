"""Acknowledge consumed messages to faust strictly in offset order per partition.

faust commits "the highest offset below which everything is acknowledged", but
its bookkeeping only checks contiguity among acked offsets (and skips the check
when nothing was committed yet), so an out-of-order ack can let a commit pass a
message that is not durable. We therefore only ever ack a contiguous prefix of
what was delivered: an event becomes *done* when its effect is durable, and the
head of its partition's queue is acked while it is done.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any


class Pending:
    """One delivered message awaiting durability."""

    __slots__ = ("tp", "offset", "handle", "done")

    def __init__(self, tp: Any, offset: int, handle: Any) -> None:
        self.tp = tp
        self.offset = offset
        self.handle = handle
        self.done = False


class AckTracker:
    """Per-partition FIFO of :class:`Pending`; ``ack(handle)`` is called for the
    done prefix, in delivery order."""

    def __init__(self, ack: Callable[[Any], object]) -> None:
        self._ack = ack
        self._queues: dict[Any, deque[Pending]] = {}

    def track(self, tp: Any, offset: int, handle: Any) -> Pending:
        entry = Pending(tp, offset, handle)
        self._queues.setdefault(tp, deque()).append(entry)
        return entry

    def done(self, entries: Iterable[Pending | None]) -> int:
        """Mark entries durable and ack every partition's done prefix; returns how many were acked."""
        touched = set()
        for entry in entries:
            if entry is not None:
                entry.done = True
                touched.add(entry.tp)
        acked = 0
        for tp in touched:
            queue = self._queues.get(tp)
            while queue and queue[0].done:
                self._ack(queue.popleft().handle)
                acked += 1
        return acked

    def drop(self, tps: Iterable[Any]) -> int:
        """Forget partitions (revoked): their unacked messages will be redelivered
        to the next owner from the committed offset. Returns how many were dropped."""
        dropped = 0
        for tp in tps:
            queue = self._queues.pop(tp, None)
            if queue:
                dropped += len(queue)
        return dropped

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._queues.values())
