"""Records whose key does not hash to their partition (``stepstream_misrouted_records``).

The worker's exactness needs every event of a run on one partition, read by one
owner at a time. Kafka's default partitioner puts a key on ``murmur2(key) mod
partitions``; a record elsewhere means the run may be split over two partitions
with two owners: the topic's partition count changed under a live run (its old
records hash elsewhere now), or a producer used another partitioner (librdkafka's
``consistent_random`` hashes with CRC32, a ``partition=`` argument picks one by
hand). Counted per topic, never refused: the records are valid, and the folds
absorb a split (a stale refusal reloads the run, docs/worker.md), but the count is
what an operator must see before and after changing partitions (docs/operations.md).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from aiokafka.partitioner import murmur2

log = logging.getLogger(__name__)

#: Keys whose partition is remembered (run keys repeat: a run is hashed once, not per event).
CACHED_KEYS = 100_000


def default_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (the Java client's, aiokafka's) picks."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class RouteCheck:
    """Counts the records of a partition whose key hashes to another one under the
    topic's current partition count (``partitions_of(topic)``, ``None`` while unknown;
    the worker asks its lag poller, which reads the topic's metadata at every poll)."""

    def __init__(self, counter: Any, partitions_of: Callable[[str], int | None]) -> None:
        self._counter = counter
        self._partitions_of = partitions_of
        self._counts: dict[str, int] = {}
        self._cache: dict[tuple[str, bytes], int] = {}
        self._warned: set[tuple[str, int]] = set()

    def check(self, topic: str, partition: int, keys: Iterable[bytes | None]) -> int:
        """How many of ``keys`` (records of ``topic``/``partition``) are misrouted; counted."""
        count = self._partitions_of(topic)
        if not count:
            return 0
        if self._counts.get(topic) != count:
            self._counts[topic] = count
            self._cache.clear()
        cache = self._cache
        misrouted = 0
        # A run's records share one key: hash each key of the fetch once, not per record.
        for key, records in Counter(keys).items():
            if key is None:
                continue  # no key, no rule (such a record is a dead letter anyway)
            expected = cache.get((topic, key))
            if expected is None:
                if len(cache) >= CACHED_KEYS:
                    cache.clear()
                expected = cache[(topic, key)] = default_partition(key, count)
            if expected != partition:
                misrouted += records
        if misrouted:
            self._counter.labels(topic).inc(misrouted)
            if (topic, count) not in self._warned:
                self._warned.add((topic, count))
                log.warning(
                    "%s records of %s/%s are keyed for another partition of %s: runs may be split over two "
                    "partitions (partition count changed under live runs, or a producer with another partitioner)",
                    misrouted, topic, partition, count,
                )
        return misrouted
