"""Every Prometheus metric stepstream exports (CONTRACT.md section 6), declared once
against a registry passed in, so tests use a fresh one."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Metrics:
    """The metric families. Hot paths update them per batch, not per event."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.events = Counter("stepstream_events", "Raw events applied, by type.", ["type"], registry=r)
        self.duplicates = Counter(
            "stepstream_duplicate_events", "Events skipped because their seq was already applied.", registry=r
        )
        self.dead_letters = Counter(
            "stepstream_dead_letters", "Messages sent to the dead-letter topic, by reason.", ["reason"], registry=r
        )
        self.consumer_lag = Gauge(
            "stepstream_consumer_lag_records",
            "Log-end offset minus committed offset of the consumer group.",
            ["topic", "partition"],
            registry=r,
        )
        self.ingest_lag = Histogram(
            "stepstream_ingest_lag_seconds",
            "Event timestamp to sink commit, by kind: thinking_delta (held in a tail until it flushes) or other.",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.sink_write = Histogram(
            "stepstream_sink_write_seconds", "Duration of one batch write, by sink.", ["sink"], registry=r
        )
        self.rows_written = Counter(
            "stepstream_rows_written", "Rows written to the sinks, by kind.", ["kind"], registry=r
        )
        self.thinking_flushes = Counter(
            "stepstream_thinking_flushes", "Thinking text flushes, by trigger.", ["trigger"], registry=r
        )
        self.clipped = Counter("stepstream_clipped_bodies", "Deep bodies (and run environments) clipped at a cap, by field.", ["field"], registry=r)
        self.steps_dropped = Counter(
            "stepstream_steps_dropped", "Steps dropped beyond the per-run step limit.", registry=r
        )
        self.seq_gaps = Counter("stepstream_seq_gaps", "Runs' sequence gaps seen.", registry=r)
        self.otlp = Counter(
            "stepstream_otlp", "OTLP topic: spans decoded, wire events produced, spans or events rejected by reason.",
            ["what"], registry=r,
        )  # fmt: skip
        self.runs_pruned = Counter("stepstream_runs_pruned", "Runs whose deep bodies were pruned.", registry=r)
        self.open_runs = Gauge("stepstream_open_runs", "Runs with fold state in memory.", registry=r)
        self.worker_start = Gauge(
            "stepstream_worker_start_seconds",
            "When each phase of the worker's start ended, in seconds since the process started "
            "(imported, preflight, topics, stores, assigned, first_batch).",
            ["phase"],
            registry=r,
        )
        self.stale_runs = Counter(
            "stepstream_stale_run_writes",
            "Runs whose batch rows a store refused because its stored state was already as far or further "
            "(a former partition owner writing late).",
            registry=r,
        )
        self.misrouted = Counter(
            "stepstream_misrouted_records",
            "Records whose key does not hash to their partition under Kafka's default partitioner and the "
            "topic's current partition count (a run split over two partitions), by topic.",
            ["topic"],
            registry=r,
        )
        self.store_retries = Counter(
            "stepstream_store_retries", "Batch writes retried in place after a retriable store error, by sink.",
            ["sink"], registry=r,
        )
        self.store_available = Gauge(
            "stepstream_store_available", "0 while a store write or read is being retried, else 1.", registry=r
        )
        self.held_age = Gauge(
            "stepstream_oldest_held_seconds",
            "Age of the oldest consumed message whose effect is not yet durable (it holds commits back).",
            registry=r,
        )
        self.evicted_runs = Counter(
            "stepstream_evicted_runs", "Folds dropped from memory, by reason (ended, idle, capacity, revoked).",
            ["reason"], registry=r,
        )
        self.pending_events = Gauge(
            "stepstream_pending_events", "Consumed events not yet durable (offsets held back).", registry=r
        )
        self.late_events = Counter(
            "stepstream_late_events",
            "Events applied late: their seq filled a gap their run had skipped (duplicates are not counted here).",
            registry=r,
        )
        self.failures_coerced = Counter(
            "stepstream_run_failures_coerced",
            "run_end failures not in the contract's shape, kept as what they say, by shape (missing, untyped, malformed).",
            ["shape"],
            registry=r,
        )

        # The compactor. runs_pruned above counts runs whose bodies it dropped.
        self.compactor_passes = Counter(
            "stepstream_compactor_passes", "Compactor passes, by outcome (ok, error).", ["outcome"], registry=r
        )
        self.bodies_purged = Counter(
            "stepstream_deep_bodies_purged",
            "Deep bodies (rows) destroyed, by cause (retention, step_ttl, purge).",
            ["cause"],
            registry=r,
        )
        self.runs_abandoned = Counter(
            "stepstream_runs_abandoned", "run_close events the compactor published for idle running runs.", registry=r
        )
        self.runs_expired = Counter(
            "stepstream_runs_expired", "Runs deleted whole (steps included) by the step TTL.", registry=r
        )
        self.compactor_pass = Histogram(
            "stepstream_compactor_pass_seconds", "Duration of one compactor pass.", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.compactor_last_success = Gauge(
            "stepstream_compactor_last_success_timestamp_seconds",
            "Unix time when the last compactor pass without an error ended.",
            registry=r,
        )
        self.compactor_errors = Counter(
            "stepstream_compactor_errors", "Compactor stages that failed, by stage (retried next pass).", ["stage"],
            registry=r,
        )


_API_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class ApiMetrics:
    """The read API's metrics (``stepstream api``). Labels are the route template
    (``/v1/companies/{company}/runs/{run_id}``), never a company, run or token id."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "stepstream_api_requests",
            "API requests answered, by method, route template and status code.",
            ["method", "route", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "stepstream_api_request_duration_seconds",
            "API request latency (first byte in to last byte out), by method and route template.",
            ["method", "route"],
            buckets=_API_BUCKETS,
            registry=r,
        )
        self.exports_in_progress = Gauge(
            "stepstream_api_exports_in_progress",
            "Deep reads and bundle builds holding a slot (at most --max-exports).",
            registry=r,
        )
        self.exports_refused = Counter(
            "stepstream_api_exports_refused",
            "Deep reads and bundle builds refused with 503: no slot freed up within --export-wait.",
            registry=r,
        )


_PRODUCE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class IngestMetrics:
    """The ingest route's metrics (``POST /v1/companies/{company}/events``), on the
    API's registry. No label is a company, a run or a token: ``reason`` and ``cause``
    come from fixed sets (the refusal reasons of ``api/ingest.py``, the wire rules'
    :data:`~stepstream.core.wire.DECODE_REASONS`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = self.registry = registry
        self.requests = Counter(
            "stepstream_ingest_requests", "Ingest requests, by outcome (accepted or the refusal's reason).",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.events = Counter(
            "stepstream_ingest_events", "Events the broker acknowledged for an accepted ingest request.", registry=r
        )
        self.bytes = Counter(
            "stepstream_ingest_bytes", "Bytes of event values the broker acknowledged (accepted requests).", registry=r
        )
        self.rejected_lines = Counter(
            "stepstream_ingest_rejected_lines", "Lines of refused ingest requests that are not wire v1 events, by reason.",
            ["reason"], registry=r,
        )  # fmt: skip
        self.produce_latency = Histogram(
            "stepstream_ingest_produce_seconds", "Request received by the producer to its transaction committed, per accepted request.",
            buckets=_PRODUCE_BUCKETS, registry=r,
        )  # fmt: skip
        self.produce_failures = Counter(
            "stepstream_ingest_produce_failures", "Ingest requests answered 503 by the producer, by cause (timeout, refused).",
            ["cause"], registry=r,
        )  # fmt: skip
        self.transactions = Counter(
            "stepstream_ingest_transactions", "Kafka transactions of the ingest producers, by outcome (committed, aborted, resealed).",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.inflight_bytes = Gauge(
            "stepstream_ingest_inflight_bytes", "Bytes produced to the broker and not yet committed (bounded).", registry=r
        )
        self.connected = Gauge(
            "stepstream_ingest_connected", "1 while the ingest producer is connected to Kafka, else 0.", registry=r
        )


def observe_many(histogram: Any, values: Iterable[float]) -> None:
    """``histogram.observe(v)`` for every ``v`` (non-negative, not NaN), in one pass:
    each value's bucket by bisection, then one increment per bucket and one of the sum.
    The worker observes the ingest lag of every event; ``observe`` would take two locks
    and a loop over the bounds per event. Reads prometheus-client 0.26's (pinned)
    ``_upper_bounds``, ``_buckets`` and ``_sum``; ``tests/unit/test_metrics_bulk.py``
    holds it equal to ``observe``."""
    bounds = histogram._upper_bounds
    counts = [0] * len(bounds)
    total = 0.0
    for v in values:
        counts[bisect_left(bounds, v)] += 1
        total += v
    histogram._sum.inc(total)
    buckets = histogram._buckets
    for i, n in enumerate(counts):
        if n:
            buckets[i].inc(n)
