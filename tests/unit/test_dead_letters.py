"""Dead-letter copies and the policy for a failing send (ingest/dead_letters.py, issue 19
item 1): a copy is never larger than the producer and the topic are sized for, an
``oversize`` message goes as a bounded copy (head, size, offset, key, reason), a size
refusal from the producer or the broker is answered with the bounded copy, and every
other failure is :class:`DeadLetterFailed` (the worker exits 70)."""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

import pytest
from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError, NotEnoughReplicasError
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from faust.exceptions import ProducerSendError

from stepstream.ingest.dead_letters import (
    HEAD_BYTES,
    KEY_BYTES,
    DeadLetterFailed,
    DeadLetters,
    dead_letter_copy,
    max_copy_bytes,
    max_request_bytes,
)
from stepstream.pipeline import StoreFailed

MAX_EVENT = 1_048_576


class Record(NamedTuple):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


def record(value: bytes, key: bytes | None = b"acme/r1", headers=(("poison-kind", b"x"),), offset: int = 7) -> Record:
    return Record("events", 2, offset, key, value, list(headers))


def size(key, value, headers) -> int:
    return DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)


def test_an_oversize_message_is_copied_bounded_with_its_head_size_offset_key_and_reason():
    value = b"{" + b"x" * 3_000_000
    key, copied, headers, bounded = dead_letter_copy(record(value), "oversize", "message is 3000001 bytes",
                                                     max_event_bytes=MAX_EVENT)  # fmt: skip
    h = dict(headers)
    assert bounded and key == b"acme/r1" and copied == value[:HEAD_BYTES]
    assert h["stepstream-reason"] == b"oversize"
    assert h["stepstream-size"] == b"3000001"
    assert h["stepstream-source"] == b"events/2/7"
    assert h["stepstream-bounded"] == b"value"
    assert h["poison-kind"] == b"x"  # the original headers, when they fit


def test_a_message_up_to_max_event_bytes_is_copied_whole_and_fits_the_producer():
    value = b"v" * MAX_EVENT
    key, copied, headers, bounded = dead_letter_copy(record(value), "not_json", "d" * 5_000, max_event_bytes=MAX_EVENT)
    assert not bounded and copied == value and "stepstream-size" not in dict(headers)
    assert size(key, copied, headers) <= max_request_bytes(MAX_EVENT)


@pytest.mark.parametrize(
    "rec",
    [
        record(b"v" * 50_000_000),
        record(b"v" * MAX_EVENT, key=b"k" * 2_000_000),
        record(b"v" * MAX_EVENT, headers=[("h", b"x" * 2_000_000)]),
        record(b"v" * MAX_EVENT, headers=[("h", b"")] * 200_000),
    ],
    ids=["huge-value", "huge-key", "huge-header", "many-headers"],
)
def test_no_copy_is_larger_than_the_producer_and_topic_limit(rec):
    key, value, headers, bounded = dead_letter_copy(rec, "not_json", "d" * 5_000, max_event_bytes=MAX_EVENT)
    assert bounded
    assert len(key or b"") <= KEY_BYTES
    assert size(key, value, headers) <= max_copy_bytes(MAX_EVENT) < max_request_bytes(MAX_EVENT)


class Topic:
    """A faust topic's ``send`` as the aiokafka producer behaves: the producer refuses a
    record over ``max_request_size`` at once (faust wraps it in ProducerSendError); the
    broker's answer comes later, through the returned future."""

    def __init__(self, max_request_size: int, broker_max: int | None = None, ack: Any = None) -> None:
        self.max_request_size = max_request_size
        self.broker_max = broker_max
        self.ack = ack  # an exception the broker answers with, "hang", or None
        self.sent: list[tuple[bytes | None, bytes, dict]] = []

    async def send(self, *, key, value, headers):
        n = size(key, value, headers)
        if n > self.max_request_size:
            try:
                raise MessageSizeTooLargeError(f"The message is {n} bytes when serialized")
            except MessageSizeTooLargeError as exc:
                raise ProducerSendError(f"Error while sending: {exc!r}") from exc
        future = asyncio.get_running_loop().create_future()
        if self.broker_max is not None and n > self.broker_max:
            future.set_exception(MessageSizeTooLargeError())
        elif isinstance(self.ack, BaseException):
            future.set_exception(self.ack)
        elif self.ack != "hang":
            self.sent.append((key, value, dict(headers)))
            future.set_result(None)
        return future


async def test_a_producer_size_refusal_is_answered_with_the_bounded_copy():
    topic = Topic(max_request_size=1_000_000)  # faust's default, below max_event_bytes
    confirmed: list[str] = []
    letters = DeadLetters(topic, max_event_bytes=MAX_EVENT, budget_seconds=5, confirmed=confirmed.append)
    await letters.send(record(b"v" * 1_040_000), "bad_id", "company_id: bad id")
    await letters.confirm()
    ((key, value, headers),) = topic.sent
    assert value == b"v" * HEAD_BYTES and headers["stepstream-size"] == b"1040000" and key == b"acme/r1"
    assert confirmed == ["bad_id"]


async def test_a_broker_size_refusal_is_answered_with_the_bounded_copy():
    # A dead-letter topic created before these limits (max.message.bytes 1 MB).
    topic = Topic(max_request_size=max_request_bytes(MAX_EVENT), broker_max=1_048_588)
    letters = DeadLetters(topic, max_event_bytes=MAX_EVENT, budget_seconds=5)
    await letters.send(record(b"v" * MAX_EVENT, headers=[("trace", b"t" * 4_000)]), "not_json", "truncated")
    await letters.confirm()
    ((_, value, headers),) = topic.sent
    assert len(value) == HEAD_BYTES and headers["stepstream-size"] == str(MAX_EVENT).encode()


@pytest.mark.parametrize(
    "ack", [NotEnoughReplicasError(), KafkaTimeoutError(), RuntimeError("connection reset"), "hang"],
    ids=["not-enough-replicas", "timeout", "other", "no-answer"],
)
async def test_any_other_acknowledgement_failure_is_dead_letter_failed(ack):
    letters = DeadLetters(Topic(max_request_bytes(MAX_EVENT), ack=ack), max_event_bytes=MAX_EVENT, budget_seconds=0.2)
    await letters.send(record(b"{}"), "not_object", "not an object")
    with pytest.raises(DeadLetterFailed) as caught:
        await letters.confirm()
    assert isinstance(caught.value, StoreFailed)  # the worker's exit-70 path


async def test_a_send_that_fails_for_another_reason_is_dead_letter_failed():
    class Broken(Topic):
        async def send(self, **kw):
            raise ProducerSendError("Error while sending: KafkaConnectionError()")

    letters = DeadLetters(Broken(max_request_bytes(MAX_EVENT)), max_event_bytes=MAX_EVENT, budget_seconds=1)
    with pytest.raises(DeadLetterFailed):
        await letters.send(record(b"{}"), "not_object", "not an object")
    assert letters.pending == 0


async def test_a_bounded_copy_refused_again_is_dead_letter_failed():
    letters = DeadLetters(Topic(10_000), max_event_bytes=MAX_EVENT, budget_seconds=1)
    with pytest.raises(DeadLetterFailed):
        await letters.send(record(b"v" * 500_000), "not_json", "x")
