"""Timestamps as stored: RFC 3339 in UTC with microseconds and a ``Z`` suffix.

``2026-11-29T10:00:00.000000Z``: fixed width, so stored times sort as text in
every backend. Every time the engine writes comes from an event's ``ts`` (never
the wall clock), so two folds of the same events write the same times.
"""

from __future__ import annotations

from datetime import datetime, timezone

__all__ = ["format_ts", "parse_ts"]

_UTC = timezone.utc


def format_ts(ts: datetime) -> str:
    """``ts`` in UTC as ``YYYY-MM-DDTHH:MM:SS.ffffffZ``. A naive ``ts`` is taken as UTC."""
    tz = ts.tzinfo
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
