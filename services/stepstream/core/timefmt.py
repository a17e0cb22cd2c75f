"""Timestamps as stored: RFC 3339 in UTC with microseconds and a ``Z`` suffix.

``2026-11-29T10:00:00.000000Z``: fixed width, so stored times sort as text in
every backend. Every time the engine writes comes from an event's ``ts`` (never
the wall clock), so two folds of the same events write the same times.

**The window.** An event time must lie in [:data:`TS_MIN`, :data:`TS_MAX`]
(1970-01-01T00:00:00Z to 9999-12-30T00:00:00Z, inclusive, after conversion to
UTC): :func:`~stepstream.core.wire.decode_event` rejects any other as
``out_of_range``. Inside it :func:`format_ts` cannot fail and always writes a
four-digit year, and a day of margin below ``datetime.max`` keeps any later
conversion to a local time in range. Without it, ``0001-01-01T00:30:00+01:00``
decodes fine and then overflows when converted to UTC.
"""

from __future__ import annotations

from datetime import datetime, timezone

import msgspec

__all__ = ["TS_MAX", "TS_MIN", "WINDOW", "format_ts", "in_window", "parse_ts"]

_UTC = timezone.utc
_encode = msgspec.json.Encoder().encode  # RFC 3339 in C; "Z" for UTC, no fraction when it is 0

TS_MIN = datetime(1970, 1, 1, tzinfo=_UTC)
TS_MAX = datetime(9999, 12, 30, tzinfo=_UTC)
WINDOW = "from 1970-01-01T00:00:00Z to 9999-12-30T00:00:00Z"  # for messages


def in_window(ts: datetime) -> bool:
    """Whether ``ts`` lies in [:data:`TS_MIN`, :data:`TS_MAX`]. A naive ``ts`` is taken as UTC."""
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=_UTC)
    return TS_MIN <= ts <= TS_MAX


def format_ts(ts: datetime) -> str:
    """``ts`` in UTC as ``YYYY-MM-DDTHH:MM:SS.ffffffZ``. A naive ``ts`` is taken as UTC.
    Never fails for a ``ts`` in the window (:func:`in_window`)."""
    tz = ts.tzinfo
    if tz is _UTC and ts.microsecond:
        # The hot path (every decoded ``...Z`` time with a fraction): msgspec writes
        # exactly this form, ten times faster than isoformat.
        return _encode(ts)[1:-1].decode()
    if tz is None:
        return ts.isoformat(timespec="microseconds") + "Z"
    if tz is not _UTC:
        ts = ts.astimezone(_UTC)
    return ts.isoformat(timespec="microseconds")[:-6] + "Z"


def parse_ts(text: str) -> datetime:
    """The aware UTC datetime of a stored timestamp (inverse of :func:`format_ts`)."""
    value = datetime.fromisoformat(text)
    if value.tzinfo is None:
        return value.replace(tzinfo=_UTC)
    return value.astimezone(_UTC)
