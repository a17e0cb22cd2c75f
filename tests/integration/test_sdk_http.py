"""The SDK over HTTP: ``Tracer("http://...", token=...)`` through ``stepstream api
--ingest`` (a real process) to the real broker. Runs from threads and tasks arrive
complete and in ``seq`` order; 429s are waited out; refusals are counted in
``failed``; with the API stopped calls never block, the queue fills and drops, and
once the API is back the queue is delivered in order."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ingest_support import ApiProcess, HostLoop, TopicTail, create_topic, free_port
from stepstream.api.tokens import add_token
from stepstream.emitter import Tracer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def loop():
    host = HostLoop()
    yield host
    host.close()


@pytest.fixture
def setup(kafka_bootstrap: str, loop: HostLoop, tmp_path: Path):
    topic = loop.run(create_topic(kafka_bootstrap, partitions=3))
    tokens = tmp_path / "tokens.json"
    token, _ = add_token(tokens, "acme", ["ingest"], created="2026-12-01T12:00:00Z")
    return topic, tokens, token


def read_runs(loop: HostLoop, broker: str, topic: str, expected: int) -> dict[str, list[dict[str, Any]]]:
    async def read() -> list[tuple[int, bytes, bytes]]:
        tail = await TopicTail(broker, topic).start()
        try:
            return await tail.read()
        finally:
            await tail.stop()

    records = loop.run(read())
    assert len(records) == expected, f"{len(records)} records, expected {expected}"
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for _, key, value in records:
        event = msgspec.json.decode(value)
        assert key == f"{event['company_id']}/{event['run_id']}".encode()
        runs[event["run_id"]].append(event)
    return runs


def test_runs_from_threads_and_tasks_arrive_complete_and_in_order(kafka_bootstrap, loop, setup, tmp_path) -> None:
    topic, tokens, token = setup
    api = ApiProcess(kafka_bootstrap, topic, tokens, tmp_path).wait_connected()
    try:
        tracer = Tracer(api.url, token=token, batch_events=100)

        def thread_body(n: int) -> None:
            for r in range(2):
                with tracer.run("acme", f"thread-{n}.{r}", agent_name="threaded") as run:
                    for i in range(30):
                        run.thinking(f"{n}.{r}:{i}")
                        run.tool_call(f"t{i}", "db.query", {"sql": "SELECT 1"})
                        run.tool_result(f"t{i}", [{"id": i}])

        async def task_body(n: int) -> None:
            async with tracer.run("acme", f"task-{n}", agent_name="async") as run:
                for i in range(40):
                    run.thinking(f"task {n}:{i}")
                    await asyncio.sleep(0)

        async def tasks() -> None:
            await asyncio.gather(*(task_body(n) for n in range(6)))

        threads = [threading.Thread(target=thread_body, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        asyncio.run(tasks())
        for t in threads:
            t.join()
        # A run of another company: the token cannot write there (404), counted as failed.
        with tracer.run("globex", "not-mine", agent_name="intruder") as foreign:
            foreign.thinking("should never land")
        assert tracer.flush(30), tracer.stats()
        stats = tracer.stats()
        tracer.close()
        expected = 4 * 2 * (2 + 90) + 6 * (2 + 40)
        assert (stats.queued, stats.sent, stats.dropped, stats.failed, stats.pending) == (expected + 3, expected, 0, 3, 0)
        runs = read_runs(loop, kafka_bootstrap, topic, expected)
        assert len(runs) == 4 * 2 + 6 and "not-mine" not in runs
        for run_id, events in runs.items():
            assert [e["seq"] for e in events] == list(range(len(events))), f"{run_id} out of order"
            assert events[0]["type"] == "run_start" and events[-1]["type"] == "run_end"
            assert all(e["company_id"] == "acme" for e in events)
    finally:
        api.stop()


def test_429s_are_waited_out_and_every_event_arrives(kafka_bootstrap, loop, setup, tmp_path) -> None:
    topic, tokens, token = setup
    api = ApiProcess(kafka_bootstrap, topic, tokens, tmp_path, STEPSTREAM_INGEST_RATE_EVENTS="1500",
                     STEPSTREAM_INGEST_BURST_EVENTS="300", STEPSTREAM_INGEST_MAX_EVENTS="300").wait_connected()  # fmt: skip
    try:
        tracer = Tracer(api.url, token=token, batch_events=250)
        run = tracer.run("acme", "rate-limited", agent_name="bot")
        run.start()
        for i in range(1000):
            run.thinking(f"{i}")
        run.end()
        assert tracer.flush(60), tracer.stats()
        stats = tracer.stats()
        tracer.close()
        assert (stats.sent, stats.failed, stats.dropped) == (1002, 0, 0)
        runs = read_runs(loop, kafka_bootstrap, topic, 1002)
        assert [e["seq"] for e in runs["rate-limited"]] == list(range(1002))
        assert "stepstream_ingest_requests_total{outcome=\"rate\"}" in api.metrics()
    finally:
        api.stop()


def test_with_the_api_stopped_calls_never_block_and_are_counted(kafka_bootstrap, loop, setup, tmp_path) -> None:
    topic, tokens, token = setup
    port = free_port()  # nothing listens here yet: the API is down
    tracer = Tracer(f"http://127.0.0.1:{port}", token=token, max_queue=100, request_timeout_ms=2000)
    run = tracer.run("acme", "api-down", agent_name="bot")
    slowest = 0.0
    started = time.perf_counter()
    run.start()
    for i in range(999):
        t = time.perf_counter()
        run.thinking(f"delta {i}")
        slowest = max(slowest, time.perf_counter() - t)
    took = time.perf_counter() - started
    assert took < 1.0 and slowest < 0.1, f"calls blocked: {took:.3f}s in all, slowest {slowest:.3f}s"
    stats = tracer.stats()
    assert (stats.queued, stats.dropped, stats.sent, stats.pending) == (100, 900, 0, 100)
    # The API comes up on that port: the queue is delivered, in order, after the backoff.
    api = ApiProcess(kafka_bootstrap, topic, tokens, tmp_path, STEPSTREAM_API_PORT=str(port))
    try:
        api.wait_connected()
        assert tracer.flush(30), tracer.stats()
        assert tracer.stats().sent == 100
        # It stops again: calls still return at once; close() counts what is left as failed.
        api.stop()
        for i in range(50):
            t = time.perf_counter()
            run.thinking(f"after {i}")
            slowest = max(slowest, time.perf_counter() - t)
        assert slowest < 0.1
        t = time.perf_counter()
        assert tracer.close(timeout=1.0) is False
        assert time.perf_counter() - t < 10
        stats = tracer.stats()
        assert (stats.sent, stats.failed, stats.pending, stats.dropped) == (100, 50, 0, 900)
        runs = read_runs(loop, kafka_bootstrap, topic, 100)
        assert [e["seq"] for e in runs["api-down"]] == list(range(100))
    finally:
        api.stop()
