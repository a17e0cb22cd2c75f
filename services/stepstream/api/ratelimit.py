"""Per-company token buckets for the ingest route: events per second, with a burst.

A bucket holds up to ``burst`` events and refills at ``rate`` events per second. A
request of ``n`` events takes ``n`` at once or nothing (:meth:`CompanyBuckets.take`);
when it cannot, the answer is how long until it could (the ``Retry-After``). Events
of a request that was refused later (the broker was away) are given back
(:meth:`CompanyBuckets.give_back`), so a retry is not charged twice.

Buckets exist only for companies that presented a valid ``ingest`` token, so their
number is bounded by the tokens file; a full bucket is the same as no bucket, and
the oldest full ones are forgotten past ``max_companies`` all the same.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["CompanyBuckets"]


class CompanyBuckets:
    """``rate`` <= 0 turns the limit off (every take succeeds)."""

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_companies: int = 100_000,
    ) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._max = max_companies
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # company -> (tokens, at)

    def _level(self, company: str, now: float) -> float:
        tokens, at = self._buckets.get(company, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) * self.rate)

    def _store(self, company: str, tokens: float, now: float) -> None:
        self._buckets[company] = (tokens, now)
        self._buckets.move_to_end(company)
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)

    def wait_for(self, company: str, events: int = 1) -> float:
        """Seconds until ``events`` could be taken (0: now); takes nothing."""
        if self.rate <= 0:
            return 0.0
        missing = events - self._level(company, self._clock())
        return 0.0 if missing <= 0 else missing / self.rate

    def take(self, company: str, events: int) -> float:
        """Take ``events`` and return 0, or take nothing and return the seconds until
        they could be taken (``math.inf`` when ``events`` exceeds the burst)."""
        if self.rate <= 0:
            return 0.0
        if events > self.burst:
            return math.inf
        now = self._clock()
        tokens = self._level(company, now)
        if tokens < events:
            return (events - tokens) / self.rate
        self._store(company, tokens - events, now)
        return 0.0

    def give_back(self, company: str, events: int) -> None:
        if self.rate <= 0:
            return
        now = self._clock()
        self._store(company, min(float(self.burst), self._level(company, now) + events), now)


def retry_after(seconds: float) -> str:
    """A ``Retry-After`` value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))
