"""The locked-down broker `make test` starts (``deploy/with-servers.sh --secure``):
its listeners, CA, client certificates and per-run SCRAM passwords, and a
:class:`Scenario` whose system under test connects over SASL_SSL (or mTLS) with the
ACLs of ``deploy/kafka/acls.sh`` on the prefixes ``secure.raw.``, ``secure.dlq.`` and
``secure-group-``. The test's own observers (offsets, topic reads, topic creation by
an admin) use the broker's super-user PLAINTEXT listener."""

from __future__ import annotations

from pathlib import Path

from harness import Scenario, WorkerProcess
from stepstream.config import load_settings
from stepstream.kafka.connection import KafkaConnection

MECHANISM = "SCRAM-SHA-512"


class SecureKafka:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        listeners = dict(line.split("=", 1) for line in (folder / "listeners").read_text().split())
        self.sasl_ssl = listeners["SASL_SSL"]
        self.ssl = listeners["SSL"]
        self.plaintext = listeners["PLAINTEXT"]
        self.ca = folder / "ca.pem"

    def password_file(self, user: str) -> Path:
        return self.folder / f"{user}.password"

    def password(self, user: str) -> str:
        return self.password_file(user).read_text().strip()

    def secrets(self) -> list[str]:
        """Every secret literal of the run: SCRAM passwords, keystore password, private keys."""
        values = [p.read_text().strip() for p in self.folder.glob("*.password")]
        for key in self.folder.glob("*.key"):
            body = [line for line in key.read_text().splitlines() if line and not line.startswith("-----")]
            values.extend(body[1:3])  # two lines of each key's base64 are enough to spot it
        return values

    def connection(self, user: str, *, password: str | None = None, cafile: Path | None = None,
                   brokers: str | None = None) -> KafkaConnection:  # fmt: skip
        return KafkaConnection(
            brokers=brokers or self.sasl_ssl, security_protocol="SASL_SSL", sasl_mechanism=MECHANISM,
            sasl_username=user, sasl_password=password if password is not None else self.password(user),
            ssl_cafile=str(cafile or self.ca),
        )  # fmt: skip

    def mtls(self, user: str) -> KafkaConnection:
        return KafkaConnection(
            brokers=self.ssl, security_protocol="SSL", ssl_cafile=str(self.ca),
            ssl_certfile=str(self.folder / f"client-{user}.pem"), ssl_keyfile=str(self.folder / f"client-{user}.key"),
        )  # fmt: skip

    def env(self, user: str, *, password_file: Path | None = None, cafile: Path | None = None,
            brokers: str | None = None) -> dict[str, str]:  # fmt: skip
        """``STEPSTREAM_*`` of a SASL_SSL client as ``user``; the password by file, as a
        Kubernetes Secret mounts it."""
        return {
            "STEPSTREAM_BROKER": brokers or self.sasl_ssl,
            "STEPSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "STEPSTREAM_KAFKA_SASL_MECHANISM": MECHANISM,
            "STEPSTREAM_KAFKA_SASL_USERNAME": user,
            "STEPSTREAM_KAFKA_SASL_PASSWORD_FILE": str(password_file or self.password_file(user)),
            "STEPSTREAM_KAFKA_SSL_CAFILE": str(cafile or self.ca),
        }

    def mtls_env(self, user: str) -> dict[str, str]:
        return {
            "STEPSTREAM_BROKER": self.ssl,
            "STEPSTREAM_KAFKA_SECURITY_PROTOCOL": "SSL",
            "STEPSTREAM_KAFKA_SSL_CAFILE": str(self.ca),
            "STEPSTREAM_KAFKA_SSL_CERTFILE": str(self.folder / f"client-{user}.pem"),
            "STEPSTREAM_KAFKA_SSL_KEYFILE": str(self.folder / f"client-{user}.key"),
        }


class SecureScenario(Scenario):
    """:class:`Scenario` on the secure broker: topics and group under the ACL prefixes,
    created by the admin (the worker runs with --no-create-topics), workers as ``worker``
    over SASL_SSL (or mTLS), events produced as ``agents``."""

    def __init__(self, secure: SecureKafka, tmp: Path, partitions: int = 4) -> None:
        super().__init__(secure.plaintext, tmp, partitions)
        tag = self.topic.rsplit("-", 1)[-1]
        self.secure = secure
        self.topic = f"secure.raw.{tag}"
        self.dlq = f"secure.dlq.{tag}"
        self.group = f"secure-group-{tag}"

    def settings(self):  # the admin's view: creates both topics over the super-user listener
        return load_settings(
            {"broker": self.broker, "topic": self.topic, "dlq_topic": self.dlq, "partitions": self.partitions}, environ={}
        )

    def start_worker(self, name: str = "w", *, mtls: bool = False, **env: str) -> WorkerProcess:
        client = self.secure.mtls_env("worker") if mtls else self.secure.env("worker")
        worker = WorkerProcess(
            broker=client["STEPSTREAM_BROKER"], topic=self.topic, app_id=self.group, steps_sink=self.steps_url,
            deep_sink=self.deep_url, log_dir=self.tmp, partitions=self.partitions, name=name,
            extra_env={**client, "STEPSTREAM_DLQ_TOPIC": self.dlq, "STEPSTREAM_CREATE_TOPICS": "false",
                       "STEPSTREAM_LOG_LEVEL": "info", **env},
        )  # fmt: skip
        self.workers.append(worker)
        return worker

    async def produce(self, events) -> None:
        from stepstream.emitter.producer import Emitter

        async with Emitter(self.secure.connection("agents"), self.topic) as emitter:
            await emitter.emit_many(events)
