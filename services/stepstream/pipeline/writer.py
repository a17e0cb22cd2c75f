"""Writing a batch, and the policy for every way a store can fail.

=============================  =============================================================
store raises                   policy
=============================  =============================================================
``SinkError`` retriable        retry the SAME batch in place, with backoff (50 ms doubling to
(``SinkUnavailable``)          2 s), for at most ``retry_seconds``; ``available`` is false
                               meanwhile (the worker's ``/ready`` answers 503). The folds wait:
                               nothing else is folded until the batch lands.
``SinkError`` not retriable,   :class:`StoreFailed`: the caller stops the process non-zero, so
an exhausted budget, a write   Kafka rewinds to the committed (durable) offsets and a restart
that hangs past the budget,    replays from there.
or any other exception
=============================  =============================================================

A batch's write path starts with ``before`` (the worker's confirmation that the broker
holds the batch's dead-letter copies, :mod:`stepstream.ingest.dead_letters`): any
exception there is a :class:`StoreFailed` too, and the stores are not written.

A retried batch is written whole again (deep rows, then steps, run records and
states): every write is idempotent, so a write that landed but reported failure is
absorbed. Never is a batch dropped while the folds stay ahead of the store.

**Health follows each call that retries** (:meth:`BatchWriter.healthy`, the worker's
``/ready`` and ``stepstream_store_available``): ``available`` is false while any write
or read is being retried, and only that call's own success clears its part. So a state
read that succeeds while a batch write is still retried does not make the stores look
available; a read that is retried while no write is in flight does make them look
unavailable (the folds wait on it). A call that gives up (:class:`StoreFailed`) leaves
them unavailable: the process is stopping. A write counts as in progress (for the stall
check) from the start of ``before`` on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from stepstream.errors import SinkError, StepstreamError
from stepstream.metrics import Metrics
from stepstream.pipeline.batch import RowBatch, RunKey
from stepstream.sinks.ports import DeepStore, StepStore

log = logging.getLogger(__name__)

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]


class StoreFailed(StepstreamError):
    """A batch could not be written under the policy above: stop, let Kafka rewind."""


class _StoreError(Exception):
    """Carries a store call's exception and which store raised it."""

    def __init__(self, sink: str, error: Exception) -> None:
        super().__init__(sink, error)
        self.sink = sink
        self.error = error


class BatchWriter:
    """Writes batches to the two stores under the retry policy (module docstring)."""

    def __init__(
        self,
        steps: StepStore,
        deep: DeepStore,
        *,
        metrics: Metrics | None = None,
        retry_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._steps = steps
        self._deep = deep
        self._metrics = metrics
        self._retry_seconds = retry_seconds
        self._clock = clock
        self._sleep = sleep
        self._retrying_calls = 0  # writes and reads being retried (or given up)
        self.batches = 0
        self.writing_since: float | None = None  # clock() when the write in progress began

    @property
    def available(self) -> bool:
        """No store call is being retried (module docstring)."""
        return self._retrying_calls == 0

    def healthy(self, stall_seconds: float = 5.0) -> bool:
        """Whether batches get written: no store call is being retried, and the write in
        progress (if any, counted from the start of its ``before``) has not been running
        for ``stall_seconds``."""
        since = self.writing_since
        return self.available and (since is None or self._clock() - since < stall_seconds)

    async def write(self, batch: RowBatch, before: Callable[[], Awaitable[None]] | None = None) -> list[RunKey]:
        """Await ``before``, then write ``batch`` (deep rows first, nothing when it has no
        rows); returns the runs the step store refused as stale. Raises
        :class:`StoreFailed` when the policy gives up or ``before`` raised anything."""
        self.writing_since = self._clock()
        try:
            if before is not None:
                await self._before(before)
            if not batch.has_rows:
                return []
            return await self._write(batch)
        finally:
            self.writing_since = None

    @staticmethod
    async def _before(before: Callable[[], Awaitable[None]]) -> None:
        try:
            await before()
        except StoreFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - the batch cannot be made durable: stop
            raise StoreFailed(f"the batch could not be confirmed: {exc!r}") from exc

    async def _write(self, batch: RowBatch) -> list[RunKey]:
        timings: list[float] = []

        async def attempt(deadline: float) -> Any:
            started = time.perf_counter()
            if batch.deeps:
                await self._bounded(self._deep.write(batch.deeps), deadline, "deep")
            deep_done = time.perf_counter()
            skipped = await self._bounded(
                self._steps.write(list(batch.steps.values()), list(batch.runs.values()), list(batch.states.values())),
                deadline,
                "steps",
            )
            timings[:] = [deep_done - started, time.perf_counter() - deep_done]
            return skipped

        skipped = await self._retrying(attempt)
        self.batches += 1
        m = self._metrics
        if m is not None:
            m.sink_write.labels("deep").observe(timings[0])
            m.sink_write.labels("steps").observe(timings[1])
        return list(skipped or ())

    async def read(self, call: Callable[[], Awaitable[T]]) -> T:
        """A store read (loading run states) under the same policy as a write."""

        async def attempt(deadline: float) -> T:
            return await self._bounded(call(), deadline, "steps")

        return await self._retrying(attempt)

    async def _retrying(self, attempt: Callable[[float], Awaitable[T]]) -> T:
        deadline = self._clock() + self._retry_seconds
        delay = 0.05
        retried = False
        while True:
            try:
                result = await attempt(deadline)
            except _StoreError as failure:
                exc, sink = failure.error, failure.sink
                if isinstance(exc, TimeoutError):
                    raise StoreFailed(f"{sink} store call hung for more than {self._retry_seconds:g}s") from exc
                if not isinstance(exc, SinkError):
                    raise StoreFailed(f"{sink} store raised {type(exc).__name__} (not a SinkError)") from exc
                if not exc.retriable:
                    raise StoreFailed(f"{sink} store failed (not retriable): {exc}") from exc
                if self._clock() + delay > deadline:
                    raise StoreFailed(
                        f"{sink} store unavailable for more than {self._retry_seconds:g}s: {exc}"
                    ) from exc
                if not retried:
                    retried = True
                    self._count_retrying(+1)
                if self._metrics is not None:
                    self._metrics.store_retries.labels(sink).inc()
                log.warning("%s store unavailable, retrying in %.2fs: %s", sink, delay, exc)
                await self._sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            if retried:
                self._count_retrying(-1)
            return result

    async def _bounded(self, call: Awaitable[T], deadline: float, sink: str) -> T:
        """One store call, given at most what is left of the budget (at least 1 s);
        any failure comes out as :class:`_StoreError` naming the store."""
        try:
            return await asyncio.wait_for(call, timeout=max(1.0, deadline - self._clock()))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise _StoreError(sink, exc) from exc

    def _count_retrying(self, change: int) -> None:
        self._retrying_calls += change
        if change < 0 and self.available:
            log.warning("stores are available again")
        if self._metrics is not None:
            self._metrics.store_available.set(1 if self.available else 0)
