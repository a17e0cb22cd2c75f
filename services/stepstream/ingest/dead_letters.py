"""Dead letters: the copy of a message the worker does not fold, how large it may be,
and the policy for every way sending it can fail.

A copy keeps the original key, value and headers and adds ``stepstream-reason``,
``stepstream-detail`` and ``stepstream-source`` (``topic/partition/offset``). A
copy is **bounded** when the whole one could be too large for any limit: an
``oversize`` message (its value is larger than ``max_event_bytes``, and with a
compressed batch it can be any size), a key over :data:`KEY_BYTES`, original headers
over :data:`HEADERS_BYTES`. A bounded copy keeps the value's first
:data:`HEAD_BYTES`, the key's first :data:`KEY_BYTES`, the original headers only if
they fit, and says what it cut: ``stepstream-size`` (the value's size in bytes) and
``stepstream-bounded`` (what was cut: ``value``, ``key``, ``headers``).

So no copy is larger than :func:`max_copy_bytes`, and the producer and the
dead-letter topic are sized to :func:`max_request_bytes` (``ensure_topics`` sets
``max.message.bytes`` when it creates the topic; both live in ``stepstream.kafka.topics``).

=====================================  =====================================================
sending a copy fails with              policy
=====================================  =====================================================
a size refusal (the producer's         the bounded copy is sent instead (a topic created
``MessageSizeTooLargeError`` or the    before these limits, with a smaller
broker's ``MESSAGE_TOO_LARGE``)        ``max.message.bytes``); a bounded copy refused again
                                       is a failure as below
anything else, or no broker            :class:`DeadLetterFailed` (a :class:`StoreFailed`):
acknowledgement within                 the worker exits 70 before anything later is
``budget_seconds``                     written or committed; Kafka rewinds and the restart
                                       dead-letters the message again
=====================================  =====================================================

A message's offset is durable (committable) only with the batch that carries it, and
that batch is written only after :meth:`DeadLetters.confirm` returned: the broker
holds every copy (a replay may dead-letter a message twice, never zero times).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from aiokafka.errors import MessageSizeTooLargeError, RecordListTooLargeError

from stepstream.core.redact import scrub
from stepstream.kafka.topics import (  # the copy's size bounds: the dead-letter topic is sized to them
    HEADERS_BYTES,
    KEY_BYTES,
    OWN_HEADERS_BYTES,
    max_copy_bytes,
    max_request_bytes,
)
from stepstream.pipeline import StoreFailed

log = logging.getLogger(__name__)

DETAIL_CHARS = 500  # the stepstream-detail header, scrubbed (core.redact.scrub)
HEAD_BYTES = 65_536  # of the value, in a bounded copy
HEADER_OVERHEAD_BYTES = 10  # per header: its two length varints and attributes

Headers = list[tuple[str, bytes]]


class DeadLetterFailed(StoreFailed):
    """A dead-letter copy was not sent or not acknowledged: stop, let Kafka rewind."""


def header_bytes(headers: Any) -> int:
    return sum(len(k.encode("utf-8", "replace")) + len(v or b"") + HEADER_OVERHEAD_BYTES for k, v in headers)


def dead_letter_copy(
    record: Any, reason: str, detail: str, *, max_event_bytes: int, bounded: bool = False
) -> tuple[bytes | None, bytes, Headers, bool]:
    """``(key, value, headers, bounded)`` of the copy of ``record``; bounded when asked
    or when the whole copy could exceed :func:`max_copy_bytes` (module docstring)."""
    key: bytes | None = record.key
    value: bytes = record.value if record.value is not None else b""
    original = [(k, v) for k, v in (record.headers or ()) if not k.startswith("stepstream-")]
    headers: Headers = [
        ("stepstream-reason", reason.encode()),
        ("stepstream-detail", scrub(detail, DETAIL_CHARS).encode("utf-8", "replace")),
        ("stepstream-source", f"{record.topic}/{record.partition}/{record.offset}".encode()),
    ]
    cut: list[str] = []
    if bounded or reason == "oversize" or len(value) > max_event_bytes:
        if len(value) > HEAD_BYTES:
            cut.append("value")
    if key is not None and len(key) > KEY_BYTES:
        cut.append("key")
    fits = header_bytes(original) <= HEADERS_BYTES
    if not fits:
        cut.append("headers")
    bounded = bounded or bool(cut)
    if bounded:
        headers += [
            ("stepstream-size", str(len(value)).encode()),
            ("stepstream-bounded", ",".join(cut).encode()),
        ]
        value = value[:HEAD_BYTES]
        key = key[:KEY_BYTES] if key is not None else None
    if fits:
        headers += original
    return key, value, headers, bounded


def _refused_for_size(exc: BaseException | None) -> bool:
    """Whether the producer or the broker refused a record for its size (faust wraps
    the producer's own refusal in ``ProducerSendError``)."""
    while exc is not None:
        if isinstance(exc, (MessageSizeTooLargeError, RecordListTooLargeError)):
            return True
        exc = exc.__cause__
    return False


class DeadLetters:
    """Sends copies to the dead-letter topic and confirms them before a batch is written.

    ``topic`` is a faust topic (``send`` returns the broker acknowledgement's future);
    ``confirmed(reason)`` is called once per copy the broker holds. Not re-entrant:
    the worker calls it under its lock, and :meth:`confirm` from the batch write.
    """

    def __init__(
        self,
        topic: Any,
        *,
        max_event_bytes: int,
        budget_seconds: float,
        confirmed: Callable[[str], None] = lambda reason: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._topic = topic
        self._max_event_bytes = max_event_bytes
        self._budget = budget_seconds
        self._confirmed = confirmed
        self._clock = clock
        # (acknowledgement, record, reason, detail, bounded), in the order sent
        self._pending: list[tuple[Any, Any, str, str, bool]] = []

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def send(self, record: Any, reason: str, detail: str) -> None:
        """Hand the copy of ``record`` to the producer (its acknowledgement is awaited
        by :meth:`confirm`). Raises :class:`DeadLetterFailed` when it cannot be sent."""
        future, bounded = await self._send(record, reason, detail, bounded=False)
        self._pending.append((future, record, reason, detail, bounded))
        log.warning(
            "dead letter %s/%s@%s: %s: %s%s", record.topic, record.partition, record.offset, reason,
            scrub(detail, 200), " (bounded copy)" if bounded else "",
        )  # fmt: skip

    async def confirm(self) -> None:
        """Wait until the broker holds every copy sent so far, for at most the budget
        in all; a copy refused for its size is sent again bounded. Raises
        :class:`DeadLetterFailed` (module docstring)."""
        pending, self._pending = self._pending, []
        deadline = self._clock() + self._budget
        for future, record, reason, detail, bounded in pending:
            try:
                await self._acknowledged(future, deadline, record)
            except DeadLetterFailed as failure:
                if bounded or not _refused_for_size(failure.__cause__):
                    raise
                log.warning("the broker refused the dead-letter copy of %s/%s@%s for its size; sending it bounded",
                            record.topic, record.partition, record.offset)  # fmt: skip
                again, _ = await self._send(record, reason, detail, bounded=True)
                await self._acknowledged(again, deadline, record)
            self._confirmed(reason)

    async def _send(self, record: Any, reason: str, detail: str, *, bounded: bool) -> tuple[Any, bool]:
        key, value, headers, bounded = dead_letter_copy(
            record, reason, detail, max_event_bytes=self._max_event_bytes, bounded=bounded
        )
        try:
            future = await asyncio.wait_for(self._topic.send(key=key, value=value, headers=headers), self._budget)
        except Exception as exc:  # noqa: BLE001 - every send failure is classified here
            if not bounded and _refused_for_size(exc):
                return await self._send(record, reason, detail, bounded=True)
            raise DeadLetterFailed(f"the dead-letter copy of {_where(record)} was not sent: {exc!r}") from exc
        return future, bounded

    async def _acknowledged(self, future: Any, deadline: float, record: Any) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(future), max(0.0, deadline - self._clock()))
        except TimeoutError as exc:
            raise DeadLetterFailed(
                f"the broker did not acknowledge the dead-letter copy of {_where(record)} within {self._budget:g}s"
            ) from exc
        except Exception as exc:  # noqa: BLE001 - every acknowledgement failure is classified here
            raise DeadLetterFailed(f"the broker refused the dead-letter copy of {_where(record)}: {exc!r}") from exc


def _where(record: Any) -> str:
    return f"{record.topic}/{record.partition}@{record.offset}"
