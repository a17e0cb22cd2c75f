"""202 only after the broker acknowledged: on a broker of its own (the shared one must
stay up), a request is in flight when the broker stops; it is answered 503, and the
client's retry (once the broker is back) lands once downstream: the engine folds what
the topic holds into exactly what folding the events once gives."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from harness import dump, first_difference, golden_dump
from ingest_support import HostLoop, IngestApp, TopicTail, create_topic, ndjson, run_events
from stepstream.api.tokens import add_token
from stepstream.ingest.offline import ingest_file

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
KAFKA = str(REPO / "deploy" / "kafka" / "kafka.sh")


SETTLE_SECONDS = 30.0


async def open_transactions(tail: TopicTail) -> str:
    assert tail.consumer is not None and tail.probe is not None
    stable, ends = await tail.consumer.end_offsets(tail.tps), await tail.probe.end_offsets(tail.tps)
    return f"a transaction still open {SETTLE_SECONDS:g}s after the retry's 202: last stable offsets {stable}, log ends {ends}"


def kafka(*args: str, timeout: float = 180) -> str:
    done = subprocess.run([KAFKA, *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"kafka.sh {' '.join(args)}: {done.stderr[-2000:]}"
    return done.stdout.strip()


@pytest.mark.parametrize("transactional", [False, True], ids=["idempotent", "transactional"])
def test_a_broker_stopped_mid_request_is_503_and_the_retry_lands_once(tmp_path: Path, transactional: bool) -> None:
    data = tmp_path / "kafka"
    bootstrap = kafka("up", "--port", "0", "--data", str(data))
    port = bootstrap.rpartition(":")[2]
    loop = HostLoop()
    app = None
    try:
        topic = loop.run(create_topic(bootstrap, partitions=2))
        token, _ = add_token(tmp_path / "tokens.json", "acme", ["ingest"], created="2026-12-01T12:00:00Z")
        app = IngestApp(loop, bootstrap, topic, tmp_path / "tokens.json", timeout_seconds=3,
                        transactional=transactional).start()  # fmt: skip
        before = run_events("acme", "before", 5)
        assert app.post("acme", token, ndjson(before)).status_code == 202
        request = [e for r in range(4) for e in run_events("acme", f"mid-{r}", 50, pad=200)]

        async def mid_request():
            # The broker stops answering, the request starts producing, then the broker dies.
            os.kill(int((data / "kafka.pid").read_text()), signal.SIGSTOP)
            answer = asyncio.ensure_future(app.apost("acme", token, ndjson(request)))
            while app.ingest_metrics.inflight_bytes._value.get() == 0 and not answer.done():
                await asyncio.sleep(0.005)
            down = await asyncio.create_subprocess_exec(KAFKA, "down", "--data", str(data), "--kill",
                                                        stdout=asyncio.subprocess.DEVNULL,
                                                        stderr=asyncio.subprocess.DEVNULL)  # fmt: skip
            assert await down.wait() == 0
            return await answer

        started = time.monotonic()
        response = loop.run(mid_request())
        assert response.status_code == 503, response.text
        assert int(response.headers["retry-after"]) >= 1
        assert time.monotonic() - started < 60  # answered, not hung (the timeout is 3 s; the kill takes its time)
        assert app.metric("stepstream_ingest_requests_total", outcome="timeout") \
            + app.metric("stepstream_ingest_requests_total", outcome="unavailable") == 1  # fmt: skip

        kafka("up", "--port", port, "--data", str(data))
        deadline = time.monotonic() + 180
        answers: list[int] = []
        while True:  # the client retries the same request, as the SDK does, until it is accepted
            retry = app.post("acme", token, ndjson(request))
            answers.append(retry.status_code)
            if retry.status_code == 202:
                break
            assert retry.status_code == 503, (answers, retry.text)
            assert time.monotonic() < deadline, f"the retry was never accepted: {answers}"
            time.sleep(0.5)
        assert retry.json() == {"accepted": len(request)}

        async def read_all():
            tail = await TopicTail(bootstrap, topic).start()
            try:
                # Read committed, as the worker reads: no transaction may stay open (the
                # last stable offsets reach the log ends) once the retry was answered.
                assert await tail.settle(SETTLE_SECONDS), await open_transactions(tail)
                return await tail.read(settle=0)
            finally:
                await tail.stop()

        records = loop.run(read_all())
        ids = [msgspec.json.decode(value)["event_id"] for _, _, value in records]
        assert set(ids) == {e["event_id"] for e in before + request}
        if transactional:  # nothing half-accepted: the request landed whole, once or twice (its 503 may follow a commit)
            copies = Counter(ids)
            assert {copies[e["event_id"]] for e in request} in ({1}, {2}), copies
        print(f"broker stop: {len(ids)} records for {len(before) + len(request)} events "
              f"({len(ids) - len(set(ids))} duplicates from the request answered 503, then retried)")  # fmt: skip

        landed = tmp_path / "landed.jsonl"
        landed.write_bytes(b"".join(value + b"\n" for _, _, value in sorted(records, key=lambda r: r[0])))
        url = f"sqlite:///{tmp_path / 'landed.db'}"
        report = loop.run(ingest_file(landed, url, url, progress=False))
        assert report.rejected == 0
        from stepstream.core.wire import decode_event

        once = loop.run(golden_dump([decode_event(msgspec.json.encode(e)) for e in before + request],
                                    tmp_path / "once", ["acme"]))  # fmt: skip
        folded = loop.run(dump(url, url, ["acme"]))
        assert folded == once, first_difference(folded, once)
    finally:
        if app is not None:
            app.close()
        loop.close()
        subprocess.run([KAFKA, "down", "--data", str(data), "--kill"], capture_output=True, timeout=60)
