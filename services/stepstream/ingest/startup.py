"""How long a worker took to start, phase by phase, from the process' own start.

A worker that KEDA adds is worth something only once it consumes, so the worker
records when each step of its start ended, in seconds since the kernel started the
process (``/proc/self/stat``, so the interpreter's start and the imports count):

``imported``
    the CLI and the faust app's modules are imported;
``preflight``
    the broker answered the preflight (reachable, topics and group allowed);
``topics``
    the topics were checked (or created);
``stores``
    the stores are open (their writer processes started and the schema made);
``assigned``
    the consumer group gave this worker its partitions;
``first_batch``
    the first batch of events is durable.

Each is exported as ``stepstream_worker_start_seconds{phase}`` and the whole is
logged once, at the first durable batch. Phases that overlap (the stores open while
the first lag poll runs) keep their own end times: they do not add up.

:class:`TablelessManager` is the start's one change to faust: no one-second sleep
before the consumer subscribes.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from faust.tables import TableManager

log = logging.getLogger(__name__)

PHASES = ("imported", "preflight", "topics", "stores", "assigned", "first_batch")


def process_age() -> float:
    """Seconds since this process started (the kernel's clock-tick resolution, 10 ms);
    the time since the interpreter's own start when ``/proc`` cannot tell."""
    try:
        with open(f"/proc/{os.getpid()}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, ticks since boot
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, IndexError, ValueError, AttributeError):
        return time.perf_counter() - _FALLBACK_ORIGIN


_FALLBACK_ORIGIN = time.perf_counter()


class StartTimes:
    """The end of each start phase (seconds since the process started), each set once."""

    def __init__(self, age: Callable[[], float] = process_age) -> None:
        self._age = age
        self.phases: dict[str, float] = {}
        self._gauge: Any = None

    def bind(self, gauge: Any) -> None:
        """Export the phases on ``gauge`` (labelled by ``phase``), those past included."""
        self._gauge = gauge
        for phase, seconds in self.phases.items():
            gauge.labels(phase).set(seconds)

    def mark(self, phase: str) -> None:
        """``phase`` ended now; a later mark of the same phase is ignored."""
        if phase in self.phases:
            return
        if phase not in PHASES:
            raise ValueError(f"unknown start phase {phase!r}")
        seconds = self.phases[phase] = self._age()
        if self._gauge is not None:
            self._gauge.labels(phase).set(seconds)
        if phase == "first_batch":
            log.info("first durable batch %.2fs after the process started (%s)", seconds, self.describe())

    def describe(self) -> str:
        return ", ".join(f"{phase} {seconds:.2f}s" for phase, seconds in self.phases.items())


class TablelessManager(TableManager):
    """faust's table manager for an app without tables (the worker keeps none).

    faust's ``on_start`` sleeps one second before it registers the tables' changelog
    channels, so that tables declared late still make it; only then does the
    conductor subscribe the consumer to the topics. The worker declares no table, so
    that second is only a second lost at every start: this one registers at once."""

    async def on_start(self) -> None:
        if len(self):
            await super().on_start()  # tables after all: faust's own way, sleep included
            return
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()
