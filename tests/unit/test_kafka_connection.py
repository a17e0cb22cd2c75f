"""The one Kafka connection value: read from STEPSTREAM_KAFKA_* and flags, validated,
never showing its password, and the client arguments built from it."""

from __future__ import annotations

import ssl

import pytest

from stepstream.cli import _settings, build_parser
from stepstream.config import load_settings
from stepstream.errors import ConfigError
from stepstream.kafka.connection import ENV_NAMES, SDK_ARGUMENTS, KafkaConnection

PASSWORD = "pw-canary-7f3a9c"

SASL_ENV = {
    "STEPSTREAM_BROKER": "kafka://b0:9093;b1:9093",
    "STEPSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
    "STEPSTREAM_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "STEPSTREAM_KAFKA_SASL_USERNAME": "worker",
    "STEPSTREAM_KAFKA_SASL_PASSWORD": PASSWORD,
}


def test_the_environment_names_are_the_issues() -> None:
    assert sorted(ENV_NAMES.values()) == sorted(
        [
            "STEPSTREAM_BROKER",
            "STEPSTREAM_KAFKA_SECURITY_PROTOCOL",
            "STEPSTREAM_KAFKA_SASL_MECHANISM",
            "STEPSTREAM_KAFKA_SASL_USERNAME",
            "STEPSTREAM_KAFKA_SASL_PASSWORD",
            "STEPSTREAM_KAFKA_SASL_PASSWORD_FILE",
            "STEPSTREAM_KAFKA_SSL_CAFILE",
            "STEPSTREAM_KAFKA_SSL_CERTFILE",
            "STEPSTREAM_KAFKA_SSL_KEYFILE",
            "STEPSTREAM_KAFKA_SSL_CHECK_HOSTNAME",
        ]
    )
    assert set(SDK_ARGUMENTS) == {name.removeprefix("STEPSTREAM_KAFKA_").lower() for name in ENV_NAMES.values()} - {
        "stepstream_broker"
    }


def test_default_is_plaintext_on_localhost() -> None:
    kafka = KafkaConnection.from_env({})
    assert (kafka.brokers, kafka.security_protocol) == ("127.0.0.1:9092", "PLAINTEXT")
    assert kafka.aiokafka_kwargs() == {"bootstrap_servers": "127.0.0.1:9092", "security_protocol": "PLAINTEXT"}
    assert kafka.faust_credentials() is None
    assert load_settings(environ={}).kafka == kafka


def test_sasl_ssl_from_the_environment_builds_every_client_kind() -> None:
    kafka = KafkaConnection.from_env(SASL_ENV)
    assert kafka.brokers == "b0:9093,b1:9093" and kafka.faust_broker == "kafka://b0:9093;kafka://b1:9093"
    kwargs = kafka.aiokafka_kwargs()
    assert kwargs["security_protocol"] == "SASL_SSL"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]) == ("worker", PASSWORD)
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext) and kwargs["ssl_context"].check_hostname


def test_faust_credentials_keep_sasl_ssl_and_the_mechanism() -> None:
    """The guard on faust's trap: SASLCredentials without an SSL context means SASL_PLAINTEXT,
    and its mechanism defaults to PLAIN."""
    credentials = KafkaConnection.from_env(SASL_ENV).faust_credentials()
    assert str(credentials.protocol.value) == "SASL_SSL"
    assert str(credentials.mechanism.value) == "SCRAM-SHA-512"
    assert credentials.ssl_context is not None
    plain = KafkaConnection.from_env({**SASL_ENV, "STEPSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"})
    assert str(plain.faust_credentials().protocol.value) == "SASL_PLAINTEXT"
    tls = KafkaConnection(brokers="b:1", security_protocol="ssl").faust_credentials()
    assert str(tls.protocol.value) == "SSL"


def test_the_password_is_in_no_repr_str_or_description() -> None:
    kafka = KafkaConnection.from_env(SASL_ENV)
    settings = load_settings(environ=SASL_ENV)
    for text in (repr(kafka), str(kafka), kafka.describe(), repr(settings), str(settings)):
        assert PASSWORD not in text
    assert kafka.describe() == "SASL_SSL SCRAM-SHA-512 user 'worker' at b0:9093,b1:9093"


def test_a_password_file_is_read_once_without_its_newline(tmp_path) -> None:
    path = tmp_path / "password"
    path.write_text(PASSWORD + "\n")
    env = {k: v for k, v in SASL_ENV.items() if k != "STEPSTREAM_KAFKA_SASL_PASSWORD"}
    kafka = KafkaConnection.from_env({**env, "STEPSTREAM_KAFKA_SASL_PASSWORD_FILE": str(path)})
    path.write_text("changed")
    assert kafka.sasl_password == PASSWORD
    with pytest.raises(ConfigError, match="kafka_sasl_password_file") as refused:
        KafkaConnection.from_env({**env, "STEPSTREAM_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "missing")})
    assert PASSWORD not in str(refused.value)


def test_flags_override_the_environment(tmp_path) -> None:
    path = tmp_path / "password"
    path.write_text("from-the-file")
    args = build_parser().parse_args(
        ["worker", "--kafka-security-protocol", "SASL_PLAINTEXT", "--kafka-sasl-mechanism", "SCRAM-SHA-256",
         "--kafka-sasl-username", "flag-user", "--kafka-sasl-password-file", str(path), "--no-create-topics"]
    )  # fmt: skip
    import os

    saved = dict(os.environ)
    try:
        os.environ.update(SASL_ENV)
        settings = _settings(args)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    kafka = settings.kafka
    assert (kafka.security_protocol, kafka.sasl_mechanism, kafka.sasl_username) == (
        "SASL_PLAINTEXT", "SCRAM-SHA-256", "flag-user",
    )  # fmt: skip
    assert kafka.sasl_password == "from-the-file"  # a file given as a flag wins over the variable
    assert settings.create_topics is False
    assert settings.broker == kafka.brokers == "b0:9093,b1:9093"


def test_there_is_no_password_flag(capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--kafka-sasl-password", PASSWORD])
    err = capsys.readouterr().err
    assert "never a flag" in err and PASSWORD not in err


def test_check_hostname_can_be_turned_off() -> None:
    kafka = KafkaConnection.from_env({"STEPSTREAM_KAFKA_SECURITY_PROTOCOL": "SSL", "STEPSTREAM_KAFKA_SSL_CHECK_HOSTNAME": "false"})
    assert kafka.ssl_check_hostname is False
    assert kafka.ssl_context().check_hostname is False
    args = build_parser().parse_args(["demo", "--kafka-security-protocol", "SSL", "--no-kafka-ssl-check-hostname"])
    assert _settings(args).kafka.ssl_check_hostname is False


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"STEPSTREAM_KAFKA_SECURITY_PROTOCOL": "TLS"}, "kafka_security_protocol"),
        ({**SASL_ENV, "STEPSTREAM_KAFKA_SASL_MECHANISM": "GSSAPI"}, "kafka_sasl_mechanism"),
        ({**SASL_ENV, "STEPSTREAM_KAFKA_SASL_MECHANISM": ""}, "kafka_sasl_mechanism"),
        ({**SASL_ENV, "STEPSTREAM_KAFKA_SASL_PASSWORD": ""}, "kafka_sasl_password"),
        ({"STEPSTREAM_KAFKA_SASL_USERNAME": "u"}, "SASL settings"),
        ({"STEPSTREAM_KAFKA_SSL_CAFILE": "/ca.pem"}, "TLS files"),
        ({"STEPSTREAM_KAFKA_SECURITY_PROTOCOL": "SSL", "STEPSTREAM_KAFKA_SSL_CERTFILE": "/c.pem"}, "go together"),
        ({"STEPSTREAM_KAFKA_SECURITY_PROTOCOL": "SSL", "STEPSTREAM_KAFKA_SSL_CHECK_HOSTNAME": "maybe"}, "check_hostname"),
    ],
)
def test_settings_that_cannot_work_are_refused_by_name(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as refused:
        KafkaConnection.from_env(env)
    assert PASSWORD not in str(refused.value)


def test_an_unreadable_ca_file_is_a_config_error_naming_the_setting(tmp_path) -> None:
    kafka = KafkaConnection(brokers="b:1", security_protocol="SSL", ssl_cafile=str(tmp_path / "none.pem"))
    with pytest.raises(ConfigError, match="kafka_ssl_cafile"):
        kafka.aiokafka_kwargs()


def test_the_sdk_reads_the_same_names_and_keywords(monkeypatch) -> None:
    from stepstream.emitter.tracer import Tracer

    for name, value in SASL_ENV.items():
        monkeypatch.setenv(name, value)
    tracer = Tracer()
    assert tracer.kafka == KafkaConnection.from_env(SASL_ENV)
    tracer.close()
    tracer = Tracer("k:1", security_protocol="SASL_PLAINTEXT", sasl_username="agent", sasl_password="other")
    assert (tracer.kafka.brokers, tracer.kafka.security_protocol, tracer.kafka.sasl_username) == (
        "k:1", "SASL_PLAINTEXT", "agent",
    )  # fmt: skip
    assert tracer.kafka.sasl_mechanism == "SCRAM-SHA-512"  # from the environment
    tracer.close()
    with pytest.raises(ValueError, match="inside the KafkaConnection"):
        Tracer(KafkaConnection.plaintext("k:1"), security_protocol="SSL")


def test_the_librdkafka_config_is_the_same_connection() -> None:
    """The API's ingest producer (confluent-kafka) gets the protocol, mechanism,
    principal and hostname rule of every other client; librdkafka accepts the config."""
    from confluent_kafka import Producer

    from stepstream.api.kafka_log import producer_config

    kafka = KafkaConnection.from_env(SASL_ENV)
    config = kafka.librdkafka_config()
    assert config["bootstrap.servers"] == "b0:9093,b1:9093"
    assert (config["security.protocol"], config["sasl.mechanism"]) == ("sasl_ssl", "SCRAM-SHA-512")
    assert (config["sasl.username"], config["sasl.password"]) == ("worker", PASSWORD)
    assert config["ssl.ca.location"] == "probe" and config["ssl.endpoint.identification.algorithm"] == "https"
    unchecked = KafkaConnection.from_env({**SASL_ENV, "STEPSTREAM_KAFKA_SSL_CHECK_HOSTNAME": "false"})
    assert unchecked.librdkafka_config()["ssl.endpoint.identification.algorithm"] == "none"
    assert KafkaConnection.from_env({}).librdkafka_config() == {"bootstrap.servers": "127.0.0.1:9092",
                                                               "security.protocol": "plaintext"}  # fmt: skip
    full = producer_config(kafka, timeout_seconds=3, max_inflight_bytes=1 << 20, max_request_bytes=1 << 20)
    assert (full["enable.idempotence"], full["acks"], full["partitioner"]) == (True, "all", "murmur2_random")
    assert full["allow.auto.create.topics"] is False and full["message.timeout.ms"] == 3000
    Producer(full).flush(0)  # every key and value is one librdkafka knows (an unknown one raises)
    from stepstream.api.kafka_txn_log import transactional_config

    txn = transactional_config(kafka, timeout_seconds=3, max_inflight_bytes=1 << 20, max_request_bytes=1 << 20)
    # A transaction outlives the commit of the other slot and its own: two timeouts.
    assert txn["transaction.timeout.ms"] == 2 * 3000 + 5000 and "transactional.id" not in txn
    assert {k: v for k, v in txn.items() if k != "transaction.timeout.ms"} == full
    Producer(dict(txn, **{"transactional.id": "stepstream-api-h-1-0-0"})).flush(0)


def test_transactional_ids_differ_per_process_and_log_and_slot_and_repeat_on_restart() -> None:
    from stepstream.api.kafka_txn_log import transactional_ids

    one = transactional_ids("stepstream-api", 2, host="pod-a", pid=1)
    assert one == ["stepstream-api-pod-a-1-0-0", "stepstream-api-pod-a-1-0-1"]
    assert transactional_ids("stepstream-api", 2, host="pod-a", pid=1) == one  # a restart in its pod: the same
    others = [transactional_ids("stepstream-api", 2, host="pod-b", pid=1),
              transactional_ids("stepstream-api", 2, host="pod-a", pid=2),
              transactional_ids("stepstream-api", 2, host="pod-a", pid=1, instance=1)]  # fmt: skip
    everything = one + [i for ids in others for i in ids]
    assert len(set(everything)) == len(everything)
    assert all(i.startswith("stepstream-api-") for i in everything)  # the ACL's prefix


def test_an_unreadable_ca_file_is_a_config_error_for_librdkafka_too(tmp_path) -> None:
    kafka = KafkaConnection(brokers="b:1", security_protocol="SSL", ssl_cafile=str(tmp_path / "none.pem"))
    with pytest.raises(ConfigError, match="kafka_ssl_cafile"):
        kafka.librdkafka_config()
