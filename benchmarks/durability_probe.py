"""Event-to-durable latency per event and per event type, read from the SQLite sink.

The worker's ``stepstream_ingest_lag_seconds{kind}`` histogram is read beside this
probe, which measures from outside the worker: a
thinking delta is durable only when its run's thinking tail is flushed. So the
benchmark asks the store: the contract of ``RunState.last_seq`` is that every event
of the run up to it is reflected in the sinks and nothing beyond it, so an event
``(run, seq)`` is durable from the moment its run's stored ``last_seq >= seq``.

:class:`DurabilityProbe` is told of every event as it is sent (with its send time,
which is also its ``ts``), and polls ``run_state`` every ``interval`` seconds for the
runs that still have events in flight. An event's latency is the start of the first
poll that saw it durable minus its send time: an upper bound, at most ``interval``
late.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec

RunKey = tuple[str, str]
_CHUNK = 400  # runs per query: 800 bound parameters


class Quantiles(msgspec.Struct, frozen=True):
    count: int
    unresolved: int
    p50: float
    p99: float
    max: float


def quantile(sorted_values: list[float], q: float) -> float:
    """Nearest rank; ``inf`` entries (never durable) count as the largest."""
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, max(0, int(q * len(sorted_values) + 0.5) - 1))]


class DurabilityProbe:
    """See the module docstring. Not thread-safe: call from the event loop's thread;
    queries run on one private thread."""

    def __init__(self, db_path: Path, interval: float = 0.05) -> None:
        self._path = db_path
        self._interval = interval
        self._pending: dict[RunKey, deque[tuple[int, bool, float]]] = {}
        self.latencies: dict[bool, list[float]] = {True: [], False: []}  # is_delta -> seconds
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="durability-probe")
        self._conn: sqlite3.Connection | None = None
        self.polls = 0

    def sent(self, company_id: str, run_id: str, seq: int, is_delta: bool, at: float) -> None:
        """An event left the producer at wall time ``at`` (seconds since the epoch)."""
        self._pending.setdefault((company_id, run_id), deque()).append((seq, is_delta, at))

    @property
    def outstanding(self) -> int:
        return sum(len(q) for q in self._pending.values())

    def _query(self, keys: list[RunKey]) -> list[tuple[str, str, int]]:
        if self._conn is None:
            if not self._path.exists():
                return []
            self._conn = sqlite3.connect(self._path, timeout=30, check_same_thread=False)
        rows: list[tuple[str, str, int]] = []
        for start in range(0, len(keys), _CHUNK):
            chunk = keys[start : start + _CHUNK]
            values = ",".join("(?,?)" for _ in chunk)
            sql = (
                "SELECT company_id, run_id, json_extract(state, '$.last_seq') FROM run_state "
                f"WHERE (company_id, run_id) IN (VALUES {values})"
            )
            try:
                rows.extend(self._conn.execute(sql, [part for key in chunk for part in key]).fetchall())
            except sqlite3.OperationalError as exc:
                if "no such table" not in str(exc):
                    raise
        return rows

    async def poll_once(self) -> None:
        if not self._pending:
            return
        keys = list(self._pending)
        seen_at = time.time()
        rows = await asyncio.get_running_loop().run_in_executor(self._executor, self._query, keys)
        self.polls += 1
        for company_id, run_id, last_seq in rows:
            queue = self._pending.get((company_id, run_id))
            if queue is None or last_seq is None:
                continue
            while queue and queue[0][0] <= last_seq:
                _, is_delta, at = queue.popleft()
                self.latencies[is_delta].append(max(0.0, seen_at - at))
            if not queue:
                del self._pending[(company_id, run_id)]

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop`` is set."""
        while not stop.is_set():
            started = time.perf_counter()
            await self.poll_once()
            await asyncio.sleep(max(0.0, self._interval - (time.perf_counter() - started)))

    async def settle(self, timeout: float) -> None:
        """Poll until every event sent is durable, or ``timeout`` seconds passed."""
        deadline = time.perf_counter() + timeout
        while self._pending and time.perf_counter() < deadline:
            await self.poll_once()
            await asyncio.sleep(self._interval)

    def summary(self, is_delta: bool) -> Quantiles:
        """Latencies of one kind; events never seen durable count as ``inf``."""
        unresolved = sum(1 for q in self._pending.values() for _, d, _ in q if d == is_delta)
        values = sorted(self.latencies[is_delta]) + [float("inf")] * unresolved
        return Quantiles(
            count=len(values),
            unresolved=unresolved,
            p50=quantile(values, 0.50),
            p99=quantile(values, 0.99),
            max=values[-1] if values else float("nan"),
        )

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            self._executor.submit(conn.close).result()
        self._executor.shutdown(wait=True)
