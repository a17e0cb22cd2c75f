"""With ``--ingest-transactions``, an API process killed while it produces leaves no
half request downstream.

A real ``stepstream api --ingest`` takes concurrent requests of 60 events over three
runs each (three partitions) and is SIGKILLed while they flow, some of them half
produced: their transactions stay open until the broker's coordinator aborts them
(``transaction.timeout.ms``, 7 s with a 1 s ingest timeout). Then, read committed, as
the worker reads: every request answered 202 is there, whole and once, and every other
request is there whole or not at all, never in part. A second API process (another
pid: other transactional ids) takes the retries of the unanswered requests, and they
land once."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import msgspec
import pytest

from ingest_support import ApiProcess, HostLoop, TopicTail, create_topic, ndjson, run_events
from stepstream.api.tokens import add_token

pytestmark = pytest.mark.integration

CLIENTS = 12


def test_a_killed_api_leaves_each_request_whole_or_absent(kafka_bootstrap: str, tmp_path: Path) -> None:
    loop = HostLoop()
    topic = loop.run(create_topic(kafka_bootstrap, partitions=3))
    tokens = tmp_path / "tokens.json"
    token, _ = add_token(tokens, "acme", ["ingest"], created="2026-12-01T12:00:00Z")
    env = {"STEPSTREAM_INGEST_TIMEOUT_SECONDS": "1", "STEPSTREAM_INGEST_TRANSACTIONS": "true"}
    api = ApiProcess(kafka_bootstrap, topic, tokens, tmp_path, **env).wait_connected()
    second = None
    requests: dict[int, list[dict]] = {}
    answers: dict[int, int | str] = {}
    try:
        async def post(key: int, http: httpx.AsyncClient) -> None:
            events = [e for r in range(3) for e in run_events("acme", f"k{key}-{r}", 18, pad=300)]
            requests[key] = events
            try:
                response = await http.post("/v1/companies/acme/events", content=ndjson(events),
                                           headers={"authorization": f"Bearer {token}",
                                                    "content-type": "application/x-ndjson"})  # fmt: skip
                answers[key] = response.status_code
            except httpx.HTTPError as exc:
                answers[key] = type(exc).__name__

        async def flow_then_kill(api: ApiProcess, first_key: int) -> None:
            # Open loop: a request every 3 ms, whatever the answers, so at any instant
            # requests are at every stage (received, produced, committing).
            limits = httpx.Limits(max_connections=CLIENTS * 8, max_keepalive_connections=CLIENTS * 8)
            watch = await TopicTail(kafka_bootstrap, topic).start()  # last stable offsets against log ends
            async with httpx.AsyncClient(base_url=api.url, timeout=30, limits=limits) as http:
                tasks = []
                open_seen = False
                deadline = time.monotonic() + 30
                killed_at = None
                key = first_key
                while killed_at is None or time.monotonic() < killed_at + 0.2:
                    assert time.monotonic() < deadline, f"the API accepted too little: {list(answers.values())[:20]}"
                    if killed_at is None and sum(1 for a in answers.values() if a == 202) >= 40:
                        # Kill while a transaction holds written records (a log end past its
                        # last stable offset): a request is half produced, or produced and
                        # not committed.
                        assert watch.consumer is not None and watch.probe is not None
                        stable = await watch.consumer.end_offsets(watch.tps)
                        ends = await watch.probe.end_offsets(watch.tps)
                        open_seen = any(ends[tp] > stable[tp] for tp in watch.tps)
                        if open_seen:
                            os.kill(api.proc.pid, signal.SIGKILL)
                            killed_at = time.monotonic()
                    if killed_at is None and sum(1 for t in tasks if not t.done()) < CLIENTS * 8:
                        tasks.append(asyncio.ensure_future(post(key, http)))
                        key += 1
                    await asyncio.sleep(0.003)
                await asyncio.gather(*tasks)
            await watch.stop()

        async def read(settle: float) -> dict[str, int]:
            tail = await TopicTail(kafka_bootstrap, topic).start()
            try:
                settled = await tail.settle(settle)
                assert settled, f"transactions still open {settle}s after the API was killed"
                seen: dict[str, int] = {}
                for _, _, value in await tail.read(settle=0):
                    event_id = msgspec.json.decode(value)["event_id"]
                    seen[event_id] = seen.get(event_id, 0) + 1
                return seen
            finally:
                await tail.stop()

        async def written() -> set[str]:
            tail = await TopicTail(kafka_bootstrap, topic, committed=False).start()
            try:
                return {msgspec.json.decode(value)["event_id"] for _, _, value in await tail.read()}
            finally:
                await tail.stop()

        # A kill catches a transaction with written records only sometimes (most of a
        # request's time is spent before its records are produced): kill again, with a
        # fresh process, until one did. What it had written the coordinator aborts within
        # transaction.timeout.ms (7 s) plus its check interval (10 s): in the log, never
        # read committed.
        aborted: set[str] = set()
        for attempt in range(8):
            if attempt:
                api = ApiProcess(kafka_bootstrap, topic, tokens, tmp_path, **env).wait_connected()
            loop.run(flow_then_kill(api, attempt * 10_000_000), timeout=90)
            api.stop()
            seen = loop.run(read(60), timeout=120)
            aborted = loop.run(written()) - set(seen)
            if aborted:
                break
        accepted = [k for k, a in answers.items() if a == 202]
        unanswered = [k for k in requests if answers.get(k) != 202]
        whole = sum(1 for k in unanswered if requests[k][0]["event_id"] in seen)
        print(f"api killed {attempt + 1} time(s): {len(accepted)} accepted, {len(unanswered)} unanswered ({whole} of "
              f"them landed whole); {len(aborted)} events written by aborted transactions")  # fmt: skip
        assert aborted, "no kill left a transaction with written records: nothing half-produced was tested"
        assert all(n == 1 for n in seen.values()), "an event landed twice"
        partial = []
        for key in requests:
            ids = [e["event_id"] for e in requests[key]]
            landed = sum(1 for i in ids if i in seen)
            if key in accepted:
                assert landed == len(ids), f"request {key} was answered 202 but {landed}/{len(ids)} landed"
            elif landed not in (0, len(ids)):
                partial.append((key, landed, len(ids)))
        assert not partial, f"half-accepted requests (key, landed, of): {partial}"

        # The retries of every unanswered request, through another API process, land once.
        second = ApiProcess(kafka_bootstrap, topic, tokens, tmp_path, **env).wait_connected()
        with httpx.Client(base_url=second.url, timeout=30) as http:
            for key in unanswered:
                response = http.post("/v1/companies/acme/events", content=ndjson(requests[key]),
                                     headers={"authorization": f"Bearer {token}",
                                              "content-type": "application/x-ndjson"})  # fmt: skip
                assert response.status_code == 202, response.text
        after = loop.run(read(30), timeout=60)
        for key in requests:
            for e in requests[key]:
                assert e["event_id"] in after, f"{e['event_id']} never landed"
        duplicates = sum(n - 1 for n in after.values())
        # Records, not rows: the retry of a request that had landed whole writes it again,
        # and the worker skips each seq it already applied.
        print(f"after the retries: {len(after)} events, {duplicates} records written twice (skipped by the worker)")
    finally:
        api.stop()
        if second is not None:
            second.stop()
        loop.close()
