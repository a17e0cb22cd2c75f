"""The port the ingest route writes through: append records to the raw topic, durably.

:class:`EventLog` is one method: :meth:`~EventLog.append` returns only once the log
holds every record (for Kafka: each acknowledged by ``acks=all``), or raises
:class:`LogUnavailable` (answered 503 with its ``retry_after``). A raise says nothing
about which records landed: some may have, and a client retry sends them again,
which is harmless downstream (the worker skips a run's ``seq`` it already applied;
the event ids are the client's). :class:`MemoryEventLog` is the reference and the
fake of the tests that are about HTTP, not Kafka.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from stepstream.errors import StepstreamError

__all__ = ["EventLog", "LogUnavailable", "MemoryEventLog", "Record"]

Record = tuple[bytes | None, bytes]  # (key, value); a None key: any partition


class LogUnavailable(StepstreamError):
    """The log cannot take the records now (broker away, producer full, no
    acknowledgement in time). ``retry_after`` in seconds; ``cause`` is a fixed word
    for the metrics (``unavailable``, ``full``, ``timeout``)."""

    retriable = True

    def __init__(self, message: str, *, cause: str, retry_after: float) -> None:
        super().__init__(message)
        self.cause = cause
        self.retry_after = retry_after


class EventLog(Protocol):
    async def append(
        self, records: Sequence[Record], *, topic: str | None = None, headers: Sequence[tuple[str, bytes]] = ()
    ) -> None:
        """Return once every record is durable (in ``topic``, default the raw topic,
        each with ``headers``), in order per key; else raise :class:`LogUnavailable`."""
        ...


class MemoryEventLog:
    """Appends to a list (and, with a ``topic`` or ``headers``, to ``sent`` as
    ``(topic, headers, record)``); ``unavailable`` makes every append raise."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.sent: list[tuple[str | None, tuple[tuple[str, bytes], ...], Record]] = []
        self.unavailable = False

    async def append(
        self, records: Sequence[Record], *, topic: str | None = None, headers: Sequence[tuple[str, bytes]] = ()
    ) -> None:
        if self.unavailable:
            raise LogUnavailable("the log is unavailable", cause="unavailable", retry_after=1)
        if topic is None and not headers:
            self.records.extend(records)
        else:
            self.sent.extend((topic, tuple(headers), record) for record in records)
