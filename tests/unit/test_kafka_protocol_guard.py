"""The guard on every client's effective security protocol: what each client is built
with equals the configured protocol, and a silent downgrade (faust's SASLCredentials
without an SSL context is SASL_PLAINTEXT) stops the worker before it connects."""

from __future__ import annotations

import faust
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from stepstream.config import load_settings
from stepstream.errors import ConfigError
from stepstream.kafka.connection import SECURITY_PROTOCOLS, KafkaConnection, effective_protocol

SASL = {"sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "worker", "sasl_password": "guard-pw"}


def connection(protocol: str) -> KafkaConnection:
    extra = SASL if protocol.startswith("SASL") else {}
    return KafkaConnection(brokers="127.0.0.1:9", security_protocol=protocol, **extra)


def settings_for(protocol: str, app_id: str):
    flags = {"kafka_security_protocol": protocol, "app_id": app_id, "broker": "127.0.0.1:9"}
    env = {}
    if protocol.startswith("SASL"):
        flags |= {"kafka_sasl_mechanism": "SCRAM-SHA-512", "kafka_sasl_username": "worker"}
        env = {"STEPSTREAM_KAFKA_SASL_PASSWORD": "guard-pw"}
    return load_settings(flags, environ=env)


@pytest.mark.parametrize("protocol", SECURITY_PROTOCOLS)
async def test_every_aiokafka_client_kind_gets_the_configured_protocol(protocol: str) -> None:
    kafka = connection(protocol)
    producer = AIOKafkaProducer(**kafka.aiokafka_kwargs())
    consumer = AIOKafkaConsumer(**kafka.aiokafka_kwargs())
    admin = AIOKafkaAdminClient(**kafka.aiokafka_kwargs())
    try:
        for client in (producer, consumer, admin):
            assert effective_protocol(client) == protocol
            kafka.check_protocol(effective_protocol(client), type(client).__name__)
    finally:  # never started: these only mark them closed
        await producer.stop()
        await consumer.stop()
        await admin.close()


@pytest.mark.parametrize("protocol", SECURITY_PROTOCOLS)
def test_the_worker_app_hands_faust_the_configured_protocol(protocol: str) -> None:
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    from stepstream.ingest.app import create_app

    app = create_app(settings_for(protocol, f"guard-{protocol.lower()}"))
    auth = credentials_to_aiokafka_auth(app.conf.broker_credentials, app.conf.ssl_context)
    assert auth["security_protocol"] == protocol
    if protocol.startswith("SASL"):
        assert auth["sasl_mechanism"] == "SCRAM-SHA-512"
    if protocol.endswith("SSL"):
        assert auth["ssl_context"] is not None


def test_a_sasl_ssl_worker_given_credentials_without_tls_refuses_to_start(monkeypatch) -> None:
    from stepstream.ingest.app import create_app

    def downgraded(self: KafkaConnection) -> faust.SASLCredentials:
        # faust's own default: no ssl_context, so SASL_PLAINTEXT, sending the password in clear.
        return faust.SASLCredentials(username=self.sasl_username, password=self.sasl_password, mechanism=self.sasl_mechanism)

    monkeypatch.setattr(KafkaConnection, "faust_credentials", downgraded)
    with pytest.raises(ConfigError, match="would connect with SASL_PLAINTEXT, not the configured SASL_SSL"):
        create_app(settings_for("SASL_SSL", "guard-downgrade"))


def test_a_client_with_another_protocol_is_refused() -> None:
    with pytest.raises(ConfigError, match="refusing to start"):
        connection("SASL_SSL").check_protocol("SASL_PLAINTEXT", "a client")
