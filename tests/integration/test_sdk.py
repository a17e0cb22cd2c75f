"""The producer SDK (``stepstream.emitter``) against the real broker: concurrent runs
from threads and tasks arrive complete and in order, an exception ends a run failed,
leaving a tracer (or the interpreter) flushes, and a stopped broker makes a full queue
drop and count instead of blocking."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer

from stepstream.config import load_settings
from stepstream.core.wire import decode_event
from stepstream.emitter import Tracer
from stepstream.emitter.corpus import generate_events
from stepstream.emitter.demo import run_demo
from stepstream.kafka.topics import ensure_topics

pytestmark = pytest.mark.integration


async def read_topic(bootstrap: str, topic: str, expected: int, timeout: float = 30.0) -> list[tuple[int, bytes, dict[str, Any]]]:
    """Every message of ``topic`` as ``(partition, key, decoded JSON)``, in offset order
    per partition; waits until ``expected`` have arrived (fails past ``timeout``)."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    out: list[tuple[int, bytes, dict[str, Any]]] = []
    try:
        deadline = time.monotonic() + timeout
        while len(out) < expected and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for tp, records in batches.items():
                out.extend((tp.partition, r.key, msgspec.json.decode(r.value)) for r in records)
        # A little longer: more than expected must fail the test, not hide.
        for tp, records in (await consumer.getmany(timeout_ms=300)).items():
            out.extend((tp.partition, r.key, msgspec.json.decode(r.value)) for r in records)
    finally:
        await consumer.stop()
    assert len(out) == expected, f"read {len(out)} messages, expected {expected}"
    return out


def by_run(messages: list[tuple[int, bytes, dict[str, Any]]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    runs: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    partitions: dict[tuple[str, str], set[int]] = defaultdict(set)
    for partition, key, event in messages:
        run = (event["company_id"], event["run_id"])
        assert key == f"{run[0]}/{run[1]}".encode()
        partitions[run].add(partition)
        runs[run].append(event)
    assert all(len(p) == 1 for p in partitions.values()), "a run spans partitions"
    return runs


def work(run: Any, steps: int) -> None:
    for i in range(steps):
        run.llm_request(f"c{i}", provider="anthropic", model="claude-sonnet-4", input=[{"role": "user", "content": "hi"}])
        run.thinking(f"thinking {i} — déjà vu 🙂")
        run.llm_response(f"c{i}", {"content": "ok"}, usage={"input_tokens": 10, "output_tokens": 3})
        run.tool_call(f"t{i}", "db.query", {"sql": "SELECT 1", "password": "hunter2"})
        run.tool_result(f"t{i}", [{"id": i}], is_error=i % 5 == 4)
    run.state_change("cursor", steps)
    run.error("upstream timed out", kind="timeout")


async def test_concurrent_runs_from_threads_and_tasks_arrive_complete_and_in_order(
    kafka_bootstrap: str, kafka_topic_factory: Any
) -> None:
    topic = await kafka_topic_factory(4, prefix="sdk")
    tracer = Tracer(f"kafka://{kafka_bootstrap}", topic)

    def thread_body(n: int) -> None:
        for r in range(3):
            with tracer.run(f"co-{n % 3}", f"thread-{n}.{r}", agent_name="threaded") as run:
                work(run, 8)

    async def task_body(n: int) -> None:
        async with tracer.run("co-async", f"task-{n}", agent_name="async", environment={"region": "eu"}) as run:
            for i in range(8):
                run.thinking(f"delta {i}")
                await asyncio.sleep(0)
            work(run, 4)

    shared = tracer.run("co-shared", "shared-by-threads", agent_name="shared")
    shared.start()

    def shared_body(n: int) -> None:
        for i in range(100):
            shared.thinking(f"{n}:{i}")

    threads = [threading.Thread(target=thread_body, args=(n,)) for n in range(6)]
    threads += [threading.Thread(target=shared_body, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    await asyncio.gather(*(task_body(n) for n in range(10)))
    for t in threads:
        t.join()
    shared.end()
    assert await tracer.aflush(30)
    stats = tracer.stats()
    await tracer.aclose()

    per_thread_run = 1 + 8 * 5 + 2 + 1
    per_task_run = 1 + 8 + 4 * 5 + 2 + 1
    expected = 6 * 3 * per_thread_run + 10 * per_task_run + 1 + 400 + 1
    assert (stats.queued, stats.sent, stats.dropped, stats.failed, stats.pending) == (expected, expected, 0, 0, 0)

    runs = by_run(await read_topic(kafka_bootstrap, topic, expected))
    assert len(runs) == 6 * 3 + 10 + 1
    event_ids = set()
    for (company, run_id), events in runs.items():
        assert [e["seq"] for e in events] == list(range(len(events))), f"{company}/{run_id} out of order"
        assert events[0]["type"] == "run_start" and events[-1]["type"] == "run_end"
        assert events[-1]["payload"] == {"status": "completed"}
        for e in events:
            event_ids.add(e["event_id"])
            if company != "co-async":  # an object environment waits for the engine's wire change
                decode_event(msgspec.json.encode(e))  # valid wire v1
        timestamps = [e["ts"] for e in events]
        assert timestamps == sorted(timestamps) and all(ts.endswith("Z") for ts in timestamps)
    assert len(event_ids) == expected
    shared_texts = [e["payload"]["text"] for e in runs[("co-shared", "shared-by-threads")] if e["type"] == "thinking_delta"]
    for n in range(4):  # each thread's calls keep their order within the shared run
        assert [t for t in shared_texts if t.startswith(f"{n}:")] == [f"{n}:{i}" for i in range(100)]
    assert runs[("co-async", "task-0")][0]["payload"]["environment"] == {"region": "eu"}


async def test_an_exception_ends_the_run_failed_with_a_failure_object(kafka_bootstrap: str, kafka_topic_factory: Any) -> None:
    topic = await kafka_topic_factory(2, prefix="sdk-fail")
    async with Tracer(kafka_bootstrap, topic) as tracer:
        with pytest.raises(ValueError, match="bad invoice"):
            with tracer.run("acme", "sync-fails", agent_name="bot") as run:
                run.thinking("about to fail")
                raise ValueError("bad invoice")
        with pytest.raises(KeyError):
            async with tracer.run("acme", "async-fails", agent_name="bot") as run:
                run.tool_call("t1", "fs.read", {"path": "/x"})
                raise KeyError("missing")
        with tracer.run("acme", "explicit", agent_name="bot") as run:
            run.end("failed", "gave up")
        with pytest.raises(RuntimeError, match="has ended"):
            run.thinking("too late")
    runs = by_run(await read_topic(kafka_bootstrap, topic, 3 + 3 + 2))
    assert runs[("acme", "sync-fails")][-1]["payload"] == {
        "status": "failed", "failure": {"type": "ValueError", "message": "bad invoice"},
    }  # fmt: skip
    assert runs[("acme", "async-fails")][-1]["payload"] == {
        "status": "failed", "failure": {"type": "KeyError", "message": "'missing'"},
    }  # fmt: skip
    assert runs[("acme", "explicit")][-1]["payload"] == {"status": "failed", "failure": "gave up"}


async def test_leaving_the_tracer_and_the_interpreter_flush(kafka_bootstrap: str, kafka_topic_factory: Any, tmp_path: Path) -> None:
    topic = await kafka_topic_factory(1, prefix="sdk-exit")
    with Tracer(kafka_bootstrap, topic) as tracer:
        with tracer.run("acme", "with-exit", agent_name="bot") as run:
            for i in range(300):
                run.thinking(f"{i}")
    assert tracer.stats().sent == 302  # leaving `with` flushed: nothing waited for above
    # A script that never flushes nor closes: interpreter shutdown does it.
    script = tmp_path / "agent.py"
    script.write_text(
        "import sys\n"
        "from stepstream.emitter import Tracer\n"
        "tracer = Tracer(sys.argv[1], sys.argv[2])\n"
        "run = tracer.run('acme', 'atexit', agent_name='bot')\n"
        "run.start()\n"
        "for i in range(500):\n"
        "    run.thinking(str(i))\n"
        "run.end()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSTREAM_")}
    proc = subprocess.run([sys.executable, str(script), kafka_bootstrap, topic], env=env, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    runs = by_run(await read_topic(kafka_bootstrap, topic, 302 + 502))
    assert [e["seq"] for e in runs[("acme", "atexit")]] == list(range(502))


def test_a_stopped_broker_fills_the_queue_drops_and_counts_never_blocks() -> None:
    with socket.socket() as s:  # a port nothing listens on: the broker is down
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tracer = Tracer(f"kafka://127.0.0.1:{port}", "stepstream.events", max_queue=100, request_timeout_ms=2000)
    run = tracer.run("acme", "no-broker", agent_name="bot")
    slowest = 0.0
    started = time.perf_counter()
    run.start()
    for i in range(999):
        t = time.perf_counter()
        run.thinking(f"delta {i}")
        slowest = max(slowest, time.perf_counter() - t)
    took = time.perf_counter() - started
    stats = tracer.stats()
    assert (stats.queued, stats.dropped, stats.sent, stats.pending) == (100, 900, 0, 100)
    assert tracer.dropped == 900
    assert took < 1.0 and slowest < 0.1, f"calls blocked: {took:.3f}s in all, slowest {slowest:.3f}s"
    t = time.perf_counter()
    assert tracer.close(timeout=0.5) is False
    assert time.perf_counter() - t < 8
    stats = tracer.stats()
    assert (stats.failed, stats.pending) == (100, 0)
    run.thinking("after close")  # dropped and counted, never raised into the agent
    assert tracer.dropped == 901


def test_a_broker_stopped_mid_run_never_blocks_the_agent(tmp_path: Path) -> None:
    """A broker of its own (the shared one must stay up): events flow, the broker
    stops, and the agent's calls still return at once; the queue fills, then drops."""
    repo = Path(__file__).resolve().parents[2]
    kafka = [str(repo / "deploy" / "kafka" / "kafka.sh")]
    data = str(tmp_path / "kafka")
    up = subprocess.run([*kafka, "up", "--port", "0", "--data", data], capture_output=True, text=True, timeout=180)
    assert up.returncode == 0, up.stderr[-2000:]
    bootstrap = up.stdout.strip()
    try:
        # The SDK never creates topics (the worker does): an unknown topic fails each send.
        asyncio.run(ensure_topics(load_settings({"broker": bootstrap, "topic": "sdk-stopped", "partitions": 1}, environ={})))
        tracer = Tracer(bootstrap, "sdk-stopped", max_queue=100, request_timeout_ms=3000)
        run = tracer.run("acme", "broker-dies", agent_name="bot")
        run.start()
        for i in range(10):
            run.thinking(f"before {i}")
        assert tracer.flush(30), tracer.stats()
        assert tracer.stats().sent == 11
    finally:
        down = subprocess.run([*kafka, "down", "--data", data], capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr[-2000:]
    slowest = 0.0
    started = time.perf_counter()
    for i in range(999):
        t = time.perf_counter()
        run.thinking(f"after {i}")
        slowest = max(slowest, time.perf_counter() - t)
    took = time.perf_counter() - started
    assert took < 1.0 and slowest < 0.1, f"calls blocked: {took:.3f}s in all, slowest {slowest:.3f}s"
    stats = tracer.stats()
    assert (stats.queued, stats.sent, stats.dropped) == (111, 11, 899)
    assert tracer.close(timeout=1.0) is False
    stats = tracer.stats()
    assert (stats.sent, stats.failed, stats.pending) == (11, 100, 0)


async def test_demo_sends_through_the_sdk_with_a_kafka_url(kafka_bootstrap: str, tmp_path: Path) -> None:
    topic = f"stepstream.test.demo.{os.getpid()}.{time.monotonic_ns()}"
    settings = load_settings({"broker": f"kafka://{kafka_bootstrap}", "topic": topic, "partitions": 2}, environ={})
    out = tmp_path / "demo.jsonl"
    assert await run_demo(settings, runs=6, companies=2, seed=11, out=out) == 0
    corpus = generate_events(11, runs=6, companies=2)
    written = [msgspec.json.decode(line) for line in out.read_bytes().splitlines()]
    assert len(written) == len(corpus)
    runs = by_run(await read_topic(kafka_bootstrap, topic, len(corpus)))
    assert sorted(e["event_id"] for events in runs.values() for e in events) == sorted(e["event_id"] for e in written)
    for events in runs.values():
        assert [e["seq"] for e in events] == list(range(len(events)))
    # The same runs, events and payloads as the corpus; the SDK assigned ids and times.
    decoded = [decode_event(msgspec.json.encode(w)) for w in written]
    assert sorted((e.company_id, e.run_id, e.seq, type(e).__name__) for e in corpus) == sorted(
        (e.company_id, e.run_id, e.seq, type(e).__name__) for e in decoded
    )
