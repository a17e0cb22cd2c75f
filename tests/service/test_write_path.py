"""The worker's write path under dead-letter and store faults (issue 19 items 1, 2, 12),
on the memory stores with a stand-in for faust's dead-letter topic (the real broker is
in tests/integration/test_faults.py):

* a dead letter of ~1 MB (under ``max_event_bytes``, over faust's default producer
  limit) and an ``oversize`` one of 3 MB go to the topic, the worker goes on (item 1);
* a dead-letter copy the broker does not acknowledge stops the process before anything
  later is written, and a failed write stays failed (item 2);
* readiness follows the write path: the dead-letter wait counts as a write in
  progress, and a state read that succeeds while a write is retried does not make the
  stores look available (item 12).
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

import pytest
from aiokafka.errors import MessageSizeTooLargeError, NotEnoughReplicasError
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.structs import TopicPartition
from faust.exceptions import ProducerSendError

import stepstream.ingest.app as app_module
from stepstream.config import load_settings
from stepstream.core.wire import RunStart, RunStartPayload, ToolCall, ToolCallPayload, encode_event, partition_key
from stepstream.errors import SinkUnavailable
from stepstream.ingest.app import IngestWorker, create_app
from stepstream.metrics import Metrics
from stepstream.pipeline import Ledger, Pipeline, StoreFailed
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore

T0 = datetime(2026, 11, 29, 12, tzinfo=timezone.utc)
TP = TopicPartition("events", 0)


def _ev(seq: int, run: str = "r1"):
    common = dict(v=1, event_id=f"{run}-{seq}", company_id="acme", run_id=run, seq=seq, ts=T0 + timedelta(seconds=seq))
    if seq == 0:
        return RunStart(**common, payload=RunStartPayload(agent_name="a"))
    return ToolCall(**common, payload=ToolCallPayload(call_id=f"c{seq}", tool="sh", arguments={"n": seq}))


class Record(NamedTuple):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


def records(values: list[bytes], first: int = 0) -> list[Record]:
    key = partition_key("acme", "r1")
    return [Record("events", 0, first + i, key, v, [("poison-kind", b"test")]) for i, v in enumerate(values)]


class ProducerTopic:
    """faust's dead-letter topic as the aiokafka producer behaves: a record over
    ``max_request_size`` is refused at once (wrapped by faust in ProducerSendError),
    the broker's acknowledgement (``ack``: an exception, ``"hang"`` or ``None``) comes
    through the returned future."""

    def __init__(self, max_request_size: int, ack: Any = None) -> None:
        self.max_request_size = max_request_size
        self.ack = ack
        self.sent: list[tuple[bytes | None, bytes, dict]] = []

    async def send(self, *, key, value, headers):
        size = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)
        if size > self.max_request_size:
            try:
                raise MessageSizeTooLargeError(f"The message is {size} bytes when serialized")
            except MessageSizeTooLargeError as exc:
                raise ProducerSendError(f"Error while sending: {exc!r}") from exc
        future = asyncio.get_running_loop().create_future()
        if isinstance(self.ack, BaseException):
            future.set_exception(self.ack)
        elif self.ack != "hang":
            self.sent.append((key, value, dict(headers)))
            future.set_result(None)
        return future


class Died(BaseException):
    """``die`` was called (the real one ends the process with status 70)."""


@pytest.fixture
def died(monkeypatch) -> list[str]:
    calls: list[str] = []

    def die(reason: str, exc: BaseException | None = None) -> None:
        calls.append(f"{reason}: {exc!r}")
        raise Died(reason)

    monkeypatch.setattr(app_module, "die", die)
    return calls


async def _worker(dlq: Any, **overrides: Any) -> IngestWorker:
    settings = load_settings({"steps_sink": "memory://", "deep_sink": "memory://", **overrides}, environ={})
    worker = IngestWorker(settings, Metrics(), dlq)
    await worker.start()
    return worker


async def _state(worker: IngestWorker, run: str = "r1"):
    return (await worker._stores[0].load_states("acme", [run])).get(run)


def _current(tp: Any) -> bool:
    return True


class Consumer:
    async def commit(self, tps: Any = None) -> bool:
        return True


# -- item 1: a dead letter over ~1,000,000 bytes ------------------------------------------


async def test_a_dead_letter_of_a_megabyte_and_an_oversize_one_do_not_stop_the_worker(died):
    from stepstream.ingest.dead_letters import HEAD_BYTES

    settings = load_settings({"steps_sink": "memory://", "deep_sink": "memory://"}, environ={})
    # The producer limit the worker's faust app really configures.
    limit = create_app(settings).conf.producer_max_request_size
    assert limit > settings.max_event_bytes + 65_536
    dlq = ProducerTopic(limit)
    worker = await _worker(dlq)
    megabyte = b'{"v": 1, "padding": "' + b"x" * 1_040_000 + b'"}'  # under max_event_bytes, not an event
    oversize = b"{" + b"x" * 3_000_000
    batch = records([encode_event(_ev(0)), megabyte, oversize, encode_event(_ev(1))])
    try:
        assert not await worker.on_records({TP: batch}, _current)
        await worker.pipeline.flush()
    finally:
        for store in worker._stores:
            await store.close()
    assert not died
    whole, bounded = dlq.sent
    assert whole[1] == megabyte and whole[2]["stepstream-source"] == b"events/0/1"
    assert bounded[0] == partition_key("acme", "r1") and len(bounded[1]) == HEAD_BYTES
    assert bounded[2]["stepstream-reason"] == b"oversize" and bounded[2]["stepstream-size"] == b"3000001"
    assert bounded[2]["stepstream-source"] == b"events/0/2" and bounded[2]["poison-kind"] == b"test"
    assert worker.ledger.watermark(TP) == 4


async def test_any_other_dead_letter_send_failure_is_a_controlled_exit(died):
    class Broken(ProducerTopic):
        async def send(self, **kw):
            raise ProducerSendError("Error while sending: KafkaConnectionError()")

    worker = await _worker(Broken(10**7))
    with pytest.raises(Died):
        await worker.on_records({TP: records([encode_event(_ev(0)), b"not json"])}, _current)
    assert len(died) == 1 and "DeadLetterFailed" in died[0]
    assert worker.ledger.watermark(TP) == 0


# -- item 2: a failed dead-letter acknowledgement ------------------------------------------


async def test_a_failed_dead_letter_acknowledgement_stops_before_anything_later_is_written(died):
    worker = await _worker(ProducerTopic(10**7, ack=NotEnoughReplicasError()), batch_seconds=0.01)
    # Batch 1: a run_start, a poison message, a tool call; its dead letter is refused.
    await worker.on_records({TP: records([encode_event(_ev(0)), b"not json", encode_event(_ev(1))])}, _current)
    with pytest.raises(Died):
        for _ in range(200):
            await asyncio.sleep(0.02)
            await worker.tick()
    assert "DeadLetterFailed" in died[-1]
    # Had the process gone on (a graceful stop, a fetch after the failure), batch 2 would
    # carry a state covering batch 1's events: the replay would skip them for good.
    await worker.on_records({TP: records([encode_event(_ev(2))], first=3)}, _current)
    for attempt in (worker.tick, lambda: worker.shutdown(Consumer())):
        with pytest.raises(Died):
            await attempt()
    assert await _state(worker) is None, "a batch was written after a failed one"
    assert worker.ledger.watermark(TP) == 0


async def test_a_failed_write_stays_failed_and_nothing_later_is_written():
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    confirmations = 0

    async def confirm() -> None:
        nonlocal confirmations
        confirmations += 1
        if confirmations == 1:
            raise NotEnoughReplicasError()

    ledger = Ledger()
    pipe = Pipeline(steps, deep, ledger=ledger, batch_records=10_000, before_durable=confirm)
    ledger.delivered(TP, 0, 1)
    await pipe.push(_ev(0), TP, 0)
    await pipe.push(_ev(1), TP, 1)
    await pipe.flush(wait=False)
    ledger.delivered(TP, 2, 2)
    await pipe.push(_ev(2), TP, 2)
    for _ in range(3):  # every later flush, drain and tick: the same failure, nothing written
        for call in (pipe.flush, pipe.drain, pipe.tick):
            with pytest.raises(StoreFailed):
                await call()
    assert confirmations == 1
    assert await steps.load_states("acme", ["r1"]) == {}
    assert ledger.watermark(TP) == 0


# -- item 12: readiness follows the write path ----------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_the_dead_letter_wait_counts_as_a_write_in_progress():
    clock = Clock()
    acknowledged = asyncio.Event()

    async def confirm() -> None:
        await acknowledged.wait()

    pipe = Pipeline(MemoryStepStore(), MemoryDeepStore(), ledger=Ledger(), clock=clock, before_durable=confirm)
    await pipe.push(_ev(0), TP, 0)
    await pipe.flush(wait=False)
    await asyncio.sleep(0.01)
    assert pipe.writer.healthy()
    clock.now = 6.0  # the broker has not acknowledged for 6 s
    assert not pipe.writer.healthy(), "/ready would answer 200 while the batch waits on its dead letters"
    acknowledged.set()
    await pipe.wait_written()
    assert pipe.writer.healthy()


class FlakyWrites(MemoryStepStore):
    failing = True

    async def write(self, *args: Any, **kw: Any) -> Any:
        if self.failing:
            raise SinkUnavailable("database is locked")
        return await super().write(*args, **kw)


async def test_a_state_read_does_not_mark_the_stores_available_while_a_write_is_retried():
    metrics = Metrics()
    steps = FlakyWrites()

    async def sleep(seconds: float) -> None:
        await asyncio.sleep(0.005)

    pipe = Pipeline(steps, MemoryDeepStore(), ledger=Ledger(), metrics=metrics, sleep=sleep)
    available = lambda: metrics.registry.get_sample_value("stepstream_store_available")  # noqa: E731
    await pipe.push(_ev(0), TP, 0)
    await pipe.flush(wait=False)
    await asyncio.sleep(0.05)
    assert not pipe.writer.healthy() and available() == 0
    await pipe.load([("acme", "r2")])  # a read that succeeds while the write is retried
    assert not pipe.writer.healthy() and available() == 0, "a read marked the stores available"
    steps.failing = False
    await pipe.wait_written()
    assert pipe.writer.healthy() and available() == 1
