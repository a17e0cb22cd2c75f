"""The secrets stepstream holds (the Kafka SASL password) are masked as literals in
every log line and traceback, whatever the text around them (logscrub.add_secrets)."""

from __future__ import annotations

import logging

from hypothesis import given
from hypothesis import strategies as st

from stepstream.kafka.connection import KafkaConnection
from stepstream.logscrub import add_secrets, install, scrub_text

PASSWORD = "kafka-pw-literal-5b1e"


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def test_the_kafka_password_is_masked_in_messages_and_tracebacks() -> None:
    kafka = KafkaConnection(brokers="b:1", security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                            sasl_username="u", sasl_password=PASSWORD)  # fmt: skip
    add_secrets(kafka.secrets())
    install()
    logger = logging.getLogger("stepstream.test.logscrub_secrets")
    logger.propagate = False
    handler = Captured()
    logger.addHandler(handler)
    try:
        logger.warning("sasl said %s to us", PASSWORD)
        try:
            raise RuntimeError(f"auth with {PASSWORD}x failed")
        except RuntimeError:
            logger.exception("connect failed")
    finally:
        logger.removeHandler(handler)
    text = "\n".join(handler.lines)
    assert PASSWORD not in text
    assert "sasl said [redacted] to us" in text and "auth with [redacted]x failed" in text


@given(st.text(max_size=40), st.text(max_size=40))
def test_a_known_secret_never_survives_whatever_surrounds_it(before: str, after: str) -> None:
    add_secrets([PASSWORD])
    assert PASSWORD not in scrub_text(before + PASSWORD + after, 4096)
