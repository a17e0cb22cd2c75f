"""What an ingest request's body holds: wire events, one per line or per array item.

:func:`read_events` turns a whole body (already bounded by the route) into the Kafka
records to produce, ``(key, value)`` in body order, or refuses the whole request:

* :class:`NotABatch` (400): a ``application/json`` body that is not one JSON array;
* :class:`ForeignCompany` (403): an event whose ``company_id`` is not the path's; it
  names the first such line, never the value;
* :class:`LinesRefused` (400): lines that are not valid wire v1 events, each with the
  wire rules' reason (:data:`stepstream.core.wire.DECODE_REASONS`, the names of the
  dead letters) and a detail naming the field, never the value;
* :class:`TooManyEvents` (413): more than ``max_events`` events.

A foreign company wins over decode errors: nothing of a refused request is produced
either way. "Line" is the 1-based line of an NDJSON body (blank lines count, are
skipped) or the 1-based item of a JSON array.

The value produced is the line's own bytes (an NDJSON line without its ``\\r\\n``, an
array item as it was written), exactly what an agent producing to the raw topic would
have sent; the key is ``{company_id}/{run_id}`` of the decoded event.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from stepstream.core.redact import scrub
from stepstream.core.wire import decode_event, partition_key
from stepstream.errors import WireError

__all__ = [
    "ForeignCompany",
    "LineError",
    "LinesRefused",
    "MAX_LISTED_ERRORS",
    "NDJSON",
    "JSON",
    "NotABatch",
    "Refused",
    "TooManyEvents",
    "read_events",
]

NDJSON = "application/x-ndjson"
JSON = "application/json"
MAX_LISTED_ERRORS = 100  # lines listed in a 400; the count says how many there were
DETAIL_CHARS = 200

Record = tuple[bytes, bytes]


class LineError(msgspec.Struct, frozen=True):
    """One refused line: where, the wire rule's reason, what was wrong (never the value)."""

    line: int
    reason: str
    detail: str


class Refused(Exception):
    """The whole request is refused; nothing of it is produced."""


class NotABatch(Refused):
    def __init__(self, reason: str) -> None:
        super().__init__(f"the body is not a JSON array of events ({reason})")
        self.reason = reason


class ForeignCompany(Refused):
    def __init__(self, line: int) -> None:
        super().__init__(f"line {line}: company_id is not the company of the path")
        self.line = line


class LinesRefused(Refused):
    def __init__(self, errors: list[LineError], count: int) -> None:
        super().__init__(f"{count} line(s) are not valid wire v1 events")
        self.errors = errors
        self.count = count


class TooManyEvents(Refused):
    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} events in one request")
        self.limit = limit


_array = msgspec.json.Decoder(list[msgspec.Raw])


def _ndjson_lines(body: bytes) -> Iterator[tuple[int, bytes]]:
    for number, line in enumerate(body.split(b"\n"), start=1):
        if line.endswith(b"\r"):
            line = line[:-1]
        if line.strip():
            yield number, line


def _array_items(body: bytes) -> Iterator[tuple[int, bytes]]:
    try:
        items = _array.decode(body)
    except msgspec.ValidationError:
        raise NotABatch("not_object") from None  # JSON, but not an array
    except msgspec.DecodeError as exc:
        raise NotABatch("not_utf8" if "UTF-8" in str(exc) else "not_json") from None
    except RecursionError:
        raise NotABatch("too_deep") from None
    for number, item in enumerate(items, start=1):
        yield number, bytes(item)


def read_events(body: bytes, media_type: str, company: str, *, max_event_bytes: int, max_events: int) -> list[Record]:
    """The records of ``body`` (``media_type`` :data:`NDJSON` or :data:`JSON`) for
    ``company``; raises a :class:`Refused` (module docstring)."""
    lines = _array_items(body) if media_type == JSON else _ndjson_lines(body)
    records: list[Record] = []
    errors: list[LineError] = []
    error_count = 0
    foreign: int | None = None
    for seen, (number, line) in enumerate(lines):
        if seen >= max_events:
            raise TooManyEvents(max_events)
        try:
            event = decode_event(line, max_bytes=max_event_bytes)
        except WireError as exc:
            error_count += 1
            if len(errors) < MAX_LISTED_ERRORS:
                errors.append(LineError(number, exc.reason, scrub(exc.detail, DETAIL_CHARS)))
            continue
        if event.company_id != company:
            if foreign is None:
                foreign = number
            continue
        records.append((partition_key(event.company_id, event.run_id), line))
    if foreign is not None:
        raise ForeignCompany(foreign)
    if error_count:
        raise LinesRefused(errors, error_count)
    return records
