"""Topic administration: the raw and dead-letter topics, and how large a dead-letter
copy may be (the dead-letter topic's ``max.message.bytes`` is sized to it).

Public names (stable): :func:`ensure_topics`, :func:`max_copy_bytes`,
:func:`max_request_bytes`, and the bounds :data:`KEY_BYTES`, :data:`HEADERS_BYTES`,
:data:`OWN_HEADERS_BYTES`, :data:`BATCH_OVERHEAD_BYTES` (``ingest.dead_letters`` cuts
copies to them).

faust does not create source topics, and every client here is built from the
settings' :class:`~stepstream.kafka.connection.KafkaConnection`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepstream.errors import ConfigError

if TYPE_CHECKING:
    from stepstream.config import Settings

__all__ = [
    "BATCH_OVERHEAD_BYTES",
    "HEADERS_BYTES",
    "KEY_BYTES",
    "OWN_HEADERS_BYTES",
    "ensure_topics",
    "max_copy_bytes",
    "max_request_bytes",
]

KEY_BYTES = 4_096
HEADERS_BYTES = 65_536  # the original headers a copy keeps, counted by dead_letters.header_bytes()
OWN_HEADERS_BYTES = 4_096  # stepstream-* headers: the detail is at most 500 chars (2,000 bytes)
BATCH_OVERHEAD_BYTES = 4_096  # a record batch of one record, beyond its key, value and headers


def max_copy_bytes(max_event_bytes: int) -> int:
    """The largest dead-letter copy (key, value and headers) the worker produces."""
    return max_event_bytes + KEY_BYTES + HEADERS_BYTES + OWN_HEADERS_BYTES


def max_request_bytes(max_event_bytes: int) -> int:
    """The producer's ``max_request_size`` and the dead-letter topic's ``max.message.bytes``."""
    return max_copy_bytes(max_event_bytes) + BATCH_OVERHEAD_BYTES


def worker_topics(settings: Settings) -> tuple[str, ...]:
    """The topics a worker reads or writes: the raw and dead-letter topics, and the
    OTLP topic when one is set."""
    return (settings.topic, settings.dlq, *([settings.otlp_topic] if settings.otlp_topic else []))


async def ensure_topics(settings: Settings, *, create: bool = True) -> None:
    """Create the raw and dead-letter topics (and the OTLP topic, when set) with the configured partition count and
    replication factor, the dead-letter topic with ``max.message.bytes`` above its
    largest copy; an existing topic is left as it is (a copy it refuses for its size is
    sent bounded: ingest/dead_letters.py).

    With ``create=False`` (``--no-create-topics``: an admin made the topics, and this
    principal may not create them) nothing is created: both topics must exist with
    ``settings.partitions`` partitions, else :class:`ConfigError` says which does not."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    from stepstream.kafka.connection import effective_protocol

    admin = AIOKafkaAdminClient(**settings.kafka.aiokafka_kwargs(), client_id="stepstream-admin")
    settings.kafka.check_protocol(effective_protocol(admin), "topic administration")
    await admin.start()
    try:
        names = worker_topics(settings)
        if not create:
            await _check_topics(admin, names, settings.partitions)
            return
        existing = set(await admin.list_topics())
        configs = {name: {} for name in names}
        configs[settings.dlq] = {"max.message.bytes": str(max_request_bytes(settings.max_event_bytes))}
        wanted = [
            NewTopic(
                name,
                num_partitions=settings.partitions,
                replication_factor=settings.replication_factor,
                topic_configs=configs[name],
            )
            for name in names
            if name not in existing
        ]
        if wanted:
            try:
                await admin.create_topics(wanted)
            except TopicAlreadyExistsError:
                pass
    finally:
        await admin.close()


async def _check_topics(admin: object, names: tuple[str, ...], partitions: int) -> None:
    described = await admin.describe_topics(list(names))  # type: ignore[attr-defined]
    by_name = {d["topic"]: d for d in described}
    for name in names:
        d = by_name.get(name)
        if d is None or d["error_code"] != 0:
            code = d["error_code"] if d is not None else "none"
            raise ConfigError(
                f"topic {name} is not there or not visible (error code {code}) and --no-create-topics is set: "
                "create it, or grant DESCRIBE on it"
            )
        count = len(d["partitions"])
        if count != partitions:
            raise ConfigError(f"topic {name} has {count} partitions, the settings say {partitions} (--partitions)")
