"""Kafka's default partitioner, as the worker computes it to count misrouted records."""

from __future__ import annotations

import random

from aiokafka.partitioner import DefaultPartitioner
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stepstream.core.wire import partition_key
from stepstream.ingest.routing import RouteCheck, default_partition
from stepstream.metrics import Metrics

# org.apache.kafka.common.utils.UtilsTest#testMurmur2: the Java client's own vectors.
JAVA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def misrouted(metrics: Metrics) -> dict[str, float]:
    return {
        s.labels["topic"]: s.value
        for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in family.samples
        if s.name == "stepstream_misrouted_records_total"
    }


def test_the_default_partition_is_the_java_clients():
    for key, hashed in JAVA_MURMUR2.items():
        for partitions in (1, 3, 4, 24, 1000):
            assert default_partition(key, partitions) == (hashed & 0x7FFFFFFF) % partitions


def test_the_default_partition_is_the_producers():
    rng = random.Random(7)
    partitioner = DefaultPartitioner()
    for _ in range(500):
        key = partition_key(f"c{rng.randrange(50)}", f"run-{rng.randrange(10**9)}")
        partitions = rng.randrange(1, 64)
        assert default_partition(key, partitions) == partitioner(key, list(range(partitions)), [])


def test_records_keyed_for_another_partition_are_counted_per_topic():
    metrics = Metrics()
    counts = {"events": 4}
    check = RouteCheck(metrics.misrouted, counts.get)
    keys = [partition_key("acme", f"r{i}") for i in range(40)]
    home = {key: default_partition(key, 4) for key in keys}
    for partition in range(4):
        assert check.check("events", partition, [k for k in keys if home[k] == partition]) == 0
    assert misrouted(metrics) == {}
    wrong = [k for k in keys if home[k] != 1]
    assert check.check("events", 1, [*wrong, None, keys[0] if home[keys[0]] == 1 else None]) == len(wrong)
    assert misrouted(metrics) == {"events": len(wrong)}
    assert check.check("unknown-topic", 0, keys) == 0  # no partition count known yet: nothing counted


def test_a_partition_count_change_makes_the_old_records_misrouted():
    """After ``kafka-topics --alter`` from 2 to 3 partitions, records produced under 2
    (still unread) are counted when their key hashes elsewhere under 3."""
    metrics = Metrics()
    counts = {"events": 2}
    check = RouteCheck(metrics.misrouted, counts.get)
    keys = [partition_key("acme", f"r{i}") for i in range(60)]
    old = {key: default_partition(key, 2) for key in keys}
    for partition in (0, 1):
        assert check.check("events", partition, [k for k in keys if old[k] == partition]) == 0
    counts["events"] = 3
    moved = sum(1 for k in keys if default_partition(k, 3) != old[k])
    assert moved > 0
    got = sum(check.check("events", p, [k for k in keys if old[k] == p]) for p in (0, 1))
    assert got == moved
    assert misrouted(metrics) == {"events": moved}
