"""The bound on exports in progress per process: deep reads and bundle builds.

Both routes stream (the deep route page by page, the bundle as a tar of spooled
files), so each holds about one page of bodies in memory; :class:`ExportSlots`
bounds how many run at once, so that the process's memory is bounded too. A
request takes a slot before it reads anything, waiting up to ``wait_seconds``
for one; past that it is refused with 503 ``unavailable`` and ``Retry-After``
(an RFC 9457 problem, like every error). The slot is held until the response's
last byte is sent, or the client goes away, or the response is dropped unsent
(:class:`Held` releases it in every one of those cases, once).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from stepstream.api.problems import ProblemError, problem

__all__ = ["DEFAULT_MAX_EXPORTS", "DEFAULT_WAIT_SECONDS", "RETRY_AFTER", "ExportSlots", "Held", "Slot"]

DEFAULT_MAX_EXPORTS = 4
DEFAULT_WAIT_SECONDS = 2.0
RETRY_AFTER = "2"


class Slot:
    """One export in progress; :meth:`release` is idempotent."""

    __slots__ = ("_release", "_cleanups")

    def __init__(self, release: Callable[[], None]) -> None:
        self._release: Callable[[], None] | None = release
        self._cleanups: list[Callable[[], None]] = []

    def on_release(self, cleanup: Callable[[], None]) -> None:
        """Run ``cleanup`` (close spooled files, ...) when the slot is released."""
        self._cleanups.append(cleanup)

    def release(self) -> None:
        release, self._release = self._release, None
        if release is None:
            return
        cleanups, self._cleanups = self._cleanups, []
        try:
            for cleanup in cleanups:
                cleanup()
        finally:
            release()


class ExportSlots:
    """At most ``limit`` exports at once in this process (one event loop)."""

    def __init__(
        self, limit: int = DEFAULT_MAX_EXPORTS, wait_seconds: float = DEFAULT_WAIT_SECONDS, metrics: Any = None
    ) -> None:
        if limit < 1:
            raise ValueError("the export limit must be at least 1")
        self.limit = limit
        self.wait_seconds = max(wait_seconds, 0.0)
        self.active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._metrics = metrics  # an ApiMetrics: exports_in_progress, exports_refused

    async def take(self) -> Slot:
        """A slot, waiting up to ``wait_seconds`` for one; past that, the 503 problem."""
        if self.active >= self.limit and self.wait_seconds > 0:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.wait_seconds
            while self.active >= self.limit and (remaining := deadline - loop.time()) > 0:
                waiter: asyncio.Future[None] = loop.create_future()
                self._waiters.append(waiter)
                try:
                    await asyncio.wait_for(waiter, remaining)
                except TimeoutError:
                    break
                finally:
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)
        if self.active >= self.limit:
            if self._metrics is not None:
                self._metrics.exports_refused.inc()
            raise ProblemError(problem(503, "too many exports in progress; retry later"), {"Retry-After": RETRY_AFTER})
        self._count(+1)
        return Slot(self._give_back)

    def _count(self, change: int) -> None:
        self.active += change
        if self._metrics is not None:
            self._metrics.exports_in_progress.set(self.active)

    def _give_back(self) -> None:
        self._count(-1)
        while self._waiters:  # wake the longest waiter; it takes the slot if nobody came first
            waiter = self._waiters.popleft()
            if not waiter.done():
                try:
                    waiter.set_result(None)
                except RuntimeError:  # its loop is closed (shutdown): nobody waits any more
                    continue
                return


class Held:
    """An async iterator over a response's chunks that releases ``slot`` when the
    chunks end or fail (a client that went away cancels the stream), or when the
    iterator is dropped without being finished (a response never sent)."""

    def __init__(self, chunks: AsyncIterator[bytes], slot: Slot) -> None:
        self._chunks = chunks
        self._slot = slot

    def __aiter__(self) -> Held:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._chunks.__anext__()
        except BaseException:  # StopAsyncIteration, a store error, a cancellation
            self._slot.release()
            raise

    def __del__(self) -> None:
        self._slot.release()
