"""The ingest route's producer is built from the Kafka connection value: on the
locked-down broker (SASL_SSL, SCRAM-SHA-512, ACLs) the API produces as a principal with
WRITE on the raw topic only, and the route answers 202 once the broker holds the
events; a principal without the ACL is 503, never a 202. No secret literal reaches an
answer, ``/metrics`` or a log line (librdkafka's own included, before any scrub)."""

from __future__ import annotations

import msgspec
import pytest

from ingest_support import HostLoop, IngestApp, TopicTail, ndjson, run_events
from stepstream.api.tokens import add_token

pytestmark = pytest.mark.integration


async def _admin_topic(secure, name: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=secure.plaintext)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, num_partitions=2, replication_factor=1)])
    finally:
        await admin.close()


def test_the_ingest_producer_speaks_sasl_ssl_with_least_privilege(secure_kafka, tmp_path, caplog) -> None:
    import logging
    import uuid

    caplog.set_level(logging.DEBUG)  # every line, librdkafka's own included (its logger)

    topic = f"secure.raw.ingest-{uuid.uuid4().hex[:8]}"
    loop = HostLoop()
    token, _ = add_token(tmp_path / "tokens.json", "acme", ["ingest"], created="2026-12-01T12:00:00Z")
    loop.run(_admin_topic(secure_kafka, topic))
    agents = IngestApp(loop, "", topic, tmp_path / "tokens.json", timeout_seconds=5,
                       connection=secure_kafka.connection("agents")).start()  # fmt: skip
    denied = IngestApp(loop, "", topic, tmp_path / "tokens.json", timeout_seconds=3,
                       connection=secure_kafka.connection("api")).start(connected=False)  # fmt: skip
    try:
        events = run_events("acme", "secure-run", 20)
        response = agents.post("acme", token, ndjson(events))
        assert response.status_code == 202, response.text
        refused = denied.post("acme", token, ndjson(run_events("acme", "denied-run", 2)))
        assert refused.status_code == 503 and refused.headers["retry-after"], refused.text  # no ACL: never connected
        assert not denied.log.connected

        async def read():
            tail = await TopicTail(secure_kafka.plaintext, topic).start()
            try:
                return await tail.read()
            finally:
                await tail.stop()

        records = loop.run(read())
        assert [msgspec.json.decode(v)["event_id"] for _, _, v in records] == [e["event_id"] for e in events]
        from prometheus_client import generate_latest

        assert any(r.name == "stepstream.api.ingest.librdkafka" for r in caplog.records)  # the logs were seen
        for text in (response.text, refused.text, generate_latest(agents.metrics.registry).decode(),
                     generate_latest(denied.metrics.registry).decode(), caplog.text):  # fmt: skip
            for secret in secure_kafka.secrets():
                assert secret not in text
    finally:
        agents.close()
        denied.close()
        loop.close()
