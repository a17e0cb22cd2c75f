"""The cyclic garbage collector's settings for the data-plane processes.

CPython's default (a young collection every 700 container allocations, an older one
every 10 of those) suits a program that allocates little. The worker allocates several
containers per event (the record aiokafka hands over, the decoded event and its payload,
the rows) and holds tens of thousands of them at once (a fetch in flight, a batch being
written, every open run's fold), so most of them survive a young collection only to be
freed by reference counting a moment later, after the collector walked them again in
the older generations. Measured on the real worker (``docs/worker.md``, "where the time
goes"), collections took a quarter to a third of its CPU.

:func:`tune` raises the young threshold, so most containers die before a collection sees
them, makes full collections rare, and moves everything that exists at startup (the
imported modules, faust's app, the settings) to the permanent generation
(:func:`gc.freeze`), which no collection walks. Cycles are still collected: the
worker's own data makes none (its records and states are trees), and what the event
loop makes (a task's traceback holding its frame) waits at most one young collection.
"""

from __future__ import annotations

import gc

__all__ = ["FULL_EVERY", "MIDDLE_EVERY", "YOUNG", "tune"]

#: Container allocations (net of deallocations) between two young collections.
YOUNG = 50_000
#: Young collections between two collections of the middle generation.
MIDDLE_EVERY = 20
#: Middle collections before a full one is considered (CPython also waits until the
#: objects that survived into the old generation since the last full collection are a
#: quarter of those that were there).
FULL_EVERY = 100


def tune() -> None:
    """Apply the settings above to this process and freeze what exists now. Call once,
    after the imports and the setup a process keeps for its life."""
    gc.collect()  # what startup left as garbage is freed, not frozen
    gc.freeze()
    gc.set_threshold(YOUNG, MIDDLE_EVERY, FULL_EVERY)
