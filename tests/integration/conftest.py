"""Fixtures for tests against the real servers that `make test` starts.

`deploy/run-tests.sh` starts a Kafka broker and FerretDB on free ports and exports
``STEPSTREAM_TEST_BROKER`` (``127.0.0.1:P``) and ``STEPSTREAM_TEST_MONGO_URL``
(``mongodb://127.0.0.1:P/``), and a locked-down broker whose folder of listeners and
credentials is ``STEPSTREAM_TEST_SECURE_KAFKA``. Without them these tests fail rather than skip: a
silently skipped integration suite looks exactly like a passing one.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

TopicFactory = Callable[..., Awaitable[str]]


def _server_from_env(name: str, what: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        pytest.fail(
            f"{name} is not set: this test needs {what}. Run the suite with `make test`, "
            f"which starts the servers on free ports and sets it.",
            pytrace=False,
        )
    return value


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """Bootstrap address of the real Kafka broker, ``127.0.0.1:P``."""
    return _server_from_env("STEPSTREAM_TEST_BROKER", "a real Kafka broker")


@pytest.fixture(scope="session")
def secure_kafka():
    """The locked-down broker (SASL_SSL SCRAM-SHA-512, mTLS, ACLs): secure_kafka.SecureKafka."""
    from pathlib import Path

    from secure_kafka import SecureKafka

    folder = _server_from_env(
        "STEPSTREAM_TEST_SECURE_KAFKA", "the locked-down Kafka broker (deploy/with-servers.sh --secure)"
    )
    return SecureKafka(Path(folder))


@pytest.fixture(scope="session")
def mongo_url() -> str:
    """URL of the MongoDB-wire server (FerretDB), ``mongodb://127.0.0.1:P/``."""
    return _server_from_env("STEPSTREAM_TEST_MONGO_URL", "a MongoDB-wire server (FerretDB)")


async def _wait_for_leaders(admin: AIOKafkaAdminClient, topic: str, partitions: int, timeout: float = 15.0) -> None:
    """Return once every partition of ``topic`` has a leader, so the first produce
    or group assignment does not race the controller."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        (described,) = await admin.describe_topics([topic])
        parts = described["partitions"]
        if (
            described["error_code"] == 0
            and len(parts) == partitions
            and all(p["error_code"] == 0 and p["leader"] >= 0 for p in parts)
        ):
            return
        if loop.time() > deadline:
            raise AssertionError(f"topic {topic} has no leader on every partition after {timeout}s: {described}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def kafka_topic_factory(kafka_bootstrap: str) -> AsyncIterator[TopicFactory]:
    """``await create(partitions, prefix="...", config={...})`` makes a topic with a
    unique name (``stepstream.test.<prefix>.<hex>``) and waits for its leaders; every
    topic made is deleted when the test ends."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="stepstream-tests")
    await admin.start()
    created: list[str] = []

    async def create(partitions: int = 1, *, prefix: str = "topic", config: dict[str, str] | None = None) -> str:
        name = f"stepstream.test.{prefix}.{uuid.uuid4().hex[:12]}"
        response = await admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, topic_configs=config or {})]
        )
        errors = [(topic, code, message) for topic, code, message in response.topic_errors if code != 0]
        if errors:
            raise AssertionError(f"creating topic {name} failed: {errors}")
        created.append(name)
        await _wait_for_leaders(admin, name, partitions)
        return name

    try:
        yield create
    finally:
        try:
            if created:
                await admin.delete_topics(created)
        finally:
            await admin.close()
