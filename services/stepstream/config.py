"""Settings, read once at the edge (the CLI) from flags and ``STEPSTREAM_*`` variables.

Nothing else in stepstream reads the environment: every component takes a frozen
:class:`Settings` (or the few values it needs) from the composition root.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import msgspec

from stepstream.errors import ConfigError
from stepstream.kafka.connection import KafkaConnection, faust_broker, normalize_broker

__all__ = ["ENV_PREFIX", "KAFKA_OVERRIDES", "Settings", "faust_broker", "load_settings", "normalize_broker"]

ENV_PREFIX = "STEPSTREAM_"
# Flags of the Kafka connection (``--kafka-security-protocol`` is ``kafka_security_protocol``
# among the overrides) and the connection field each sets. No password flag: a password
# comes from the environment or a file, never from argv.
KAFKA_OVERRIDES = {
    "kafka_security_protocol": "security_protocol",
    "kafka_sasl_mechanism": "sasl_mechanism",
    "kafka_sasl_username": "sasl_username",
    "kafka_sasl_password_file": "sasl_password_file",
    "kafka_ssl_cafile": "ssl_cafile",
    "kafka_ssl_certfile": "ssl_certfile",
    "kafka_ssl_keyfile": "ssl_keyfile",
    "kafka_ssl_check_hostname": "ssl_check_hostname",
}


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Every knob of the service, with its default. Environment names are the
    upper-cased field names with the ``STEPSTREAM_`` prefix."""

    broker: str = "127.0.0.1:9092"
    # The brokers and their security (``STEPSTREAM_KAFKA_*``), read by load_settings;
    # clients are built from :attr:`kafka` only. Its repr never shows the password.
    connection: KafkaConnection | None = None
    # The worker creates its topics unless this is off (``--no-create-topics``); then it
    # checks that they exist with ``partitions`` partitions.
    create_topics: bool = True
    topic: str = "stepstream.events"
    dlq_topic: str = ""  # default: "<topic>.dlq"
    partitions: int = 4
    # Replication factor of the raw and dead-letter topics the worker creates (1 on a
    # single broker; 3 on a production cluster). An existing topic is left as it is.
    replication_factor: int = 1
    app_id: str = "stepstream-worker"
    steps_sink: str = "sqlite:///stepstream.db"
    deep_sink: str = ""  # default: the steps sink
    tokens_file: str = "stepstream-tokens.json"
    web_host: str = "127.0.0.1"
    web_port: int = 6066
    # Batching: a batch is written when it holds this many records or is this old.
    batch_records: int = 5000
    batch_seconds: float = 0.05
    # ... and at once when the message values it settles reach this many bytes (group
    # commit never grows a batch past it): the worker's memory bound (docs/worker.md).
    batch_bytes: int = 33_554_432
    idle_flush_seconds: float = 5.0
    # The oldest consumed-but-not-durable message of a partition is at most this old:
    # past it, the thinking tail that holds it is flushed (commit lag stays bounded).
    max_hold_seconds: float = 10.0
    # Runs with a fold in memory; past it the least recently used are flushed and evicted.
    max_open_runs: int = 20_000
    # A retriable store error is retried in place (same batch, backoff) for this long;
    # then the worker exits non-zero so Kafka rewinds to the durable watermark.
    store_retry_seconds: float = 60.0
    # Path of a fault plan (JSON) that wraps both stores with the fault injector
    # (``stepstream.sinks.faults``); empty: off. For chaos tests, never in production.
    fault_plan: str = ""
    # Consumer group session timeout: a worker silent this long loses its partitions.
    session_timeout_seconds: float = 60.0
    # On SIGTERM, once the last batch is written and committed, the rest of the stop
    # (leaving the group, which first waits for a rebalance in flight) gets this long;
    # then the process exits 0 anyway (ingest/stopping.py). 0: wait for faust.
    stop_grace_seconds: float = 15.0
    max_event_bytes: int = 1_048_576
    # OpenTelemetry in (ingest/otlp_bridge.py, docs/otel.md): the OTLP topic the worker
    # also consumes (off unless set), the largest export request it takes, the company of
    # its spans when no stepstream-company header names one, and whether a resource's
    # stepstream.company_id attribute may name it (anyone who can write the topic could).
    otlp_topic: str = ""
    otlp_max_message_bytes: int = 8_388_608
    otlp_company: str = ""
    otlp_trust_resource_company: bool = False
    lag_poll_seconds: float = 2.0
    log_level: str = "warning"
    # The read API (``stepstream api``); tokens live in ``tokens_file``.
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    # Deep reads and bundle builds in progress at once per API process (each holds
    # about a page of bodies), and how long a request waits for one before a 503.
    api_max_exports: int = 4
    api_export_wait_seconds: float = 2.0
    # The compactor (``stepstream compactor``): defaults of the retention policy, which
    # the TOML file ``retention_file`` may override per company (compactor/policy.py).
    deep_runs_per_company: int = 50
    deep_ttl_seconds: float = 0.0  # 0: off
    step_ttl_seconds: float = 0.0  # 0: off
    abandon_after_seconds: float = 3600.0  # 0: off
    retention_file: str = ""
    compactor_interval_seconds: float = 60.0
    compactor_web_port: int = 6068
    # The ingest route of the API (``POST /v1/companies/{company}/events``, api/ingest.py):
    # off unless asked for (then the API produces to ``topic`` and needs Kafka WRITE on it).
    api_ingest: bool = False
    ingest_max_body_bytes: int = 8_388_608  # 413 past it, before the body is read whole
    ingest_max_events: int = 10_000  # per request (413 past it)
    # Per company: a token bucket of events refilled at this rate (0: no limit), 429 when empty.
    ingest_rate_events: float = 10_000.0
    ingest_burst_events: int = 50_000  # at least ingest_max_events
    ingest_timeout_seconds: float = 10.0  # every acknowledgement (or the commit) within this, else 503
    ingest_max_inflight_bytes: int = 67_108_864  # sent, not yet acknowledged (committed); 503 past it
    ingest_max_requests: int = 32  # ingest requests served at once per process; 503 past it
    # Each request in a Kafka transaction (all or nothing downstream; api/kafka_txn_log.py),
    # and the prefix of those producers' transactional.id: {prefix}-{hostname}-{pid}-0-{slot}.
    ingest_transactions: bool = False
    ingest_transactional_id: str = "stepstream-api"

    @property
    def kafka(self) -> KafkaConnection:
        """The connection every Kafka client is built from (plaintext to ``broker`` when
        the settings were built directly, without :func:`load_settings`)."""
        return self.connection if self.connection is not None else KafkaConnection.plaintext(self.broker)

    @property
    def dlq(self) -> str:
        return self.dlq_topic or f"{self.topic}.dlq"

    @property
    def deep(self) -> str:
        return self.deep_sink or self.steps_sink


def load_settings(overrides: Mapping[str, object] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Defaults, then ``STEPSTREAM_*`` variables, then explicit ``overrides``
    (flags; ``None`` values are ignored). Raises :class:`ConfigError` naming the bad setting."""
    env = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for field in msgspec.structs.fields(Settings):
        if field.name == "connection":
            continue
        raw = env.get(ENV_PREFIX + field.name.upper())
        if raw is not None and raw != "":
            values[field.name] = raw
    kafka_overrides: dict[str, object] = {}
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key in KAFKA_OVERRIDES:
            kafka_overrides[KAFKA_OVERRIDES[key]] = value
        else:
            values[key] = value
    try:
        settings = msgspec.convert(values, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"bad setting: {exc}") from None
    if settings.partitions < 1 or settings.replication_factor < 1:
        raise ConfigError("bad setting: partitions and replication_factor must be at least 1")
    if settings.batch_bytes < 1:
        raise ConfigError("bad setting: batch_bytes must be at least 1")
    if settings.api_max_exports < 1 or not 0 <= settings.api_export_wait_seconds <= 3600:
        raise ConfigError("bad setting: api_max_exports must be at least 1, api_export_wait_seconds 0..3600")
    if (
        min(settings.ingest_max_body_bytes, settings.ingest_max_events, settings.ingest_max_inflight_bytes,
            settings.ingest_max_requests) < 1
        or settings.ingest_rate_events < 0
        or not 0 < settings.ingest_timeout_seconds <= 600
    ):  # fmt: skip
        raise ConfigError("bad setting: ingest_* bounds must be at least 1, the rate at least 0, the timeout 0..600 s")
    if settings.ingest_rate_events > 0 and settings.ingest_burst_events < settings.ingest_max_events:
        raise ConfigError("bad setting: ingest_burst_events must be at least ingest_max_events")
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", settings.ingest_transactional_id):
        raise ConfigError("bad setting: ingest_transactional_id must be 1-200 of A-Z a-z 0-9 . _ -")
    connection = KafkaConnection.from_env(env, kafka_overrides, brokers=settings.broker)
    return msgspec.structs.replace(settings, broker=connection.brokers, connection=connection)

