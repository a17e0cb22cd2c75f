"""Nothing half-accepted downstream, with ``--ingest-transactions``: each ingest request
is produced inside a Kafka transaction, and the worker reads ``read_committed``.

On the real broker, a request is made to fail half-way: its runs go to three
partitions, and one of its records is larger than its topic's ``max.message.bytes``, so
the broker writes the records of the other partitions and refuses that one. The
request is answered 503, and its records are in the log (a ``read_uncommitted`` reader
sees them) but never read committed, and never folded by a real ``stepstream worker``,
whose rows equal folding the accepted requests once. Around it, concurrent requests
share transactions (fewer commits than requests), and the worker commits past every
transaction's marker: its group ends at the log end, not one offset short per
partition, and it never took a marker for a lost fetch."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import msgspec
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from harness import WorkerProcess, dump, first_difference, golden_dump, wait_caught_up
from ingest_support import HostLoop, IngestApp, TopicTail, ndjson, run_events
from stepstream.api.tokens import add_token
from stepstream.core.wire import decode_event
from stepstream.ingest.routing import default_partition

pytestmark = pytest.mark.integration

PARTITIONS = 3
MAX_MESSAGE_BYTES = 262_144  # per record batch: far above what the small requests batch


async def _topic(broker: str) -> str:
    name = f"stepstream.test.txn.{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, num_partitions=PARTITIONS, replication_factor=1,
                                            topic_configs={"max.message.bytes": str(MAX_MESSAGE_BYTES)})])  # fmt: skip
    finally:
        await admin.close()
    return name


def _runs_by_partition(prefix: str, count: int) -> dict[int, list[str]]:
    """``count`` run ids per partition of the topic (by the key's partition)."""
    out: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    n = 0
    while min(len(v) for v in out.values()) < count:
        run = f"{prefix}-{n}"
        n += 1
        part = default_partition(f"acme/{run}".encode(), PARTITIONS)
        if len(out[part]) < count:
            out[part].append(run)
    return out


def _read(broker: str, topic: str, loop: HostLoop, *, committed: bool) -> list[dict]:
    async def read() -> list[dict]:
        tail = await TopicTail(broker, topic, committed=committed).start()
        try:
            return [msgspec.json.decode(value) for _, _, value in await tail.read()]
        finally:
            await tail.stop()

    return loop.run(read())


def test_a_request_aborted_half_way_is_never_read_and_never_folded(kafka_bootstrap: str, tmp_path: Path) -> None:
    loop = HostLoop()
    topic = loop.run(_topic(kafka_bootstrap))
    token, _ = add_token(tmp_path / "tokens.json", "acme", ["ingest"], created="2026-12-01T12:00:00Z")
    app = IngestApp(loop, kafka_bootstrap, topic, tmp_path / "tokens.json", timeout_seconds=5, transactional=True).start()
    worker = None
    try:
        accepted: list[dict] = []

        async def concurrently(tag: str, requests: int) -> list[int]:
            bodies = [run_events("acme", f"{tag}-{i}", 8) for i in range(requests)]
            answers = await asyncio.gather(*(app.apost("acme", token, ndjson(b)) for b in bodies))
            for body, answer in zip(bodies, answers, strict=True):
                if answer.status_code == 202:
                    accepted.extend(body)
            return [a.status_code for a in answers]

        assert loop.run(concurrently("before", 24)) == [202] * 24

        # Runs on every partition; the last one's run_end carries a record over the
        # topic's max.message.bytes: that partition refuses it, the others take theirs.
        runs = _runs_by_partition("half", 2)
        big = runs[0][0]
        doomed = [e for part in sorted(runs) for run in runs[part] for e in run_events("acme", run, 3)]
        for e in doomed:
            if e["run_id"] == big and e["type"] == "thinking_delta":
                e["payload"]["text"] = "y" * (MAX_MESSAGE_BYTES * 2)
                break
        refused = app.post("acme", token, ndjson(doomed))
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "1"
        assert app.metric("stepstream_ingest_transactions_total", outcome="aborted") == 1

        assert loop.run(concurrently("after", 24)) == [202] * 24
        committed = app.metric("stepstream_ingest_transactions_total", outcome="committed")
        assert 2 <= committed < 48, f"{committed} commits for 48 accepted requests: no request shared a transaction"

        # The aborted request's records of the other partitions are in the log...
        doomed_ids = {e["event_id"] for e in doomed}
        everything = _read(kafka_bootstrap, topic, loop, committed=False)
        written = {e["event_id"] for e in everything} & doomed_ids
        assert {e["run_id"] for e in doomed if e["event_id"] in written} - {big}, (
            "no record of the refused request reached the log: the test did not write half a request"
        )
        # ...and never read committed: exactly the accepted requests, each once.
        landed = [e["event_id"] for e in _read(kafka_bootstrap, topic, loop, committed=True)]
        assert sorted(landed) == sorted(e["event_id"] for e in accepted)

        # The worker folds exactly the accepted requests and commits to the log end.
        steps = f"sqlite:///{tmp_path / 'steps.db'}"
        deep = f"sqlite:///{tmp_path / 'deep.db'}"
        group = f"stepstream-test-txn-{uuid.uuid4().hex[:8]}"
        worker = WorkerProcess(broker=kafka_bootstrap, topic=topic, app_id=group, steps_sink=steps, deep_sink=deep,
                               log_dir=tmp_path, partitions=PARTITIONS, extra_env={"STEPSTREAM_LOG_LEVEL": "info"})  # fmt: skip
        loop.run(wait_caught_up(kafka_bootstrap, group, topic, [worker], timeout=120), timeout=150)
        once = loop.run(golden_dump([decode_event(msgspec.json.encode(e)) for e in accepted], tmp_path / "once",
                                    ["acme"]))  # fmt: skip
        folded = loop.run(dump(steps, deep, ["acme"]))
        assert folded == once, first_difference(folded, once)
        assert worker.stop() == 0
        log = worker.log_path.read_text(errors="replace")
        assert "seeking back" not in log and "are not in the log" not in log, log[-3000:]
        worker = None
    finally:
        if worker is not None:
            worker.kill()
        app.close()
        loop.close()
