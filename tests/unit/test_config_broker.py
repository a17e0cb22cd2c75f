"""Broker addresses as users write them (host:port, kafka://host:port, lists) and the
topic settings the worker creates topics with."""

from __future__ import annotations

import pytest

from stepstream.config import faust_broker, load_settings, normalize_broker
from stepstream.errors import ConfigError


@pytest.mark.parametrize(
    ("given", "bootstrap"),
    [
        ("127.0.0.1:9092", "127.0.0.1:9092"),
        ("kafka://127.0.0.1:9092", "127.0.0.1:9092"),
        ("KAFKA://broker-0.kafka:9092/", "broker-0.kafka:9092"),
        ("kafka://a:9092;kafka://b:9093", "a:9092,b:9093"),
        (" a:9092 , kafka://b:9093 ", "a:9092,b:9093"),
        ("[::1]:9092", "[::1]:9092"),
    ],
)
def test_broker_forms_become_bootstrap_servers(given: str, bootstrap: str) -> None:
    assert normalize_broker(given) == bootstrap
    assert faust_broker(given) == ";".join(f"kafka://{s}" for s in bootstrap.split(","))


@pytest.mark.parametrize("bad", ["", "localhost", "http://a:9092", "a:0", "a:99999", "a:port", ":9092", ";"])
def test_a_broker_without_a_port_or_with_another_scheme_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="broker"):
        normalize_broker(bad)


def test_settings_normalize_the_broker_from_flags_and_environment() -> None:
    assert load_settings(environ={"STEPSTREAM_BROKER": "kafka://k:9092"}).broker == "k:9092"
    assert load_settings({"broker": "kafka://x:1"}, environ={"STEPSTREAM_BROKER": "k:9092"}).broker == "x:1"


def test_replication_factor_and_partitions_are_settings() -> None:
    s = load_settings(environ={"STEPSTREAM_REPLICATION_FACTOR": "3", "STEPSTREAM_PARTITIONS": "12"})
    assert (s.replication_factor, s.partitions) == (3, 12)
    assert load_settings(environ={}).replication_factor == 1
    with pytest.raises(ConfigError):
        load_settings({"replication_factor": 0}, environ={})


def test_the_worker_app_takes_kafka_urls_and_lists() -> None:
    from stepstream.ingest.app import create_app

    settings = load_settings({"broker": "kafka://k0:9092;k1:9093", "app_id": "url-test"}, environ={})
    app = create_app(settings)
    assert [str(url) for url in app.conf.broker] == ["kafka://k0:9092", "kafka://k1:9093"]
    assert app.conf.web_bind == settings.web_host


def test_settings_built_directly_with_a_kafka_url_still_work() -> None:
    from stepstream.config import Settings
    from stepstream.ingest.app import create_app

    app = create_app(Settings(broker="kafka://k0:9092", app_id="direct-url-test"))
    assert [str(url) for url in app.conf.broker] == ["kafka://k0:9092"]
