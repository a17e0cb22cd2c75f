"""Output shapes and stored timestamps."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stepstream.core.shapes import shape, shape_chars
from stepstream.core.timefmt import format_ts, parse_ts


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ([1] * 12, "12 items"), ([1], "1 item"), ([], "0 items"),
        ({"a": 1, "b": 2, "c": 3}, "3 fields"), ({"a": 1}, "1 field"), ({}, "0 fields"),
        ("x" * 140, "140 characters"), ("x", "1 character"), ("", "0 characters"),
        ("x" * 4200, "4.2k characters"), ("x" * 4299, "4.2k characters"), ("x" * 1000, "1k characters"),
        ("x" * 999, "999 characters"), ("x" * 65536, "65.5k characters"), ("😀" * 3, "3 characters"),
        (1, "number"), (2.5, "number"), (True, "boolean"), (False, "boolean"), (None, "null"),
    ],
)  # fmt: skip
def test_shapes(value, expected):
    assert shape(value) == expected


def test_large_counts():
    assert shape_chars(1_200_000) == "1.2M characters"
    assert shape_chars(999_999) == "999.9k characters"
    assert shape_chars(1_000_000) == "1M characters"


def test_format_ts_is_utc_with_microseconds_and_z():
    t = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=timezone(timedelta(hours=-5)))
    assert format_ts(t) == "2026-01-02T08:04:05.000006Z"
    assert format_ts(datetime(2026, 1, 2)) == "2026-01-02T00:00:00.000000Z"  # naive is UTC


ZONES = st.sampled_from([timezone.utc, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))])
MOMENTS = st.datetimes(min_value=datetime(1000, 1, 1), max_value=datetime(9000, 1, 1), timezones=ZONES)


@settings(deadline=None, print_blob=True)
@given(MOMENTS, MOMENTS)
def test_format_round_trips_and_sorts_as_text(a, b):
    assert parse_ts(format_ts(a)) == a
    assert (format_ts(a) < format_ts(b)) == (a < b)


@settings(deadline=None, print_blob=True)
@given(st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 29), timezones=ZONES))
def test_format_ts_fast_path_writes_the_isoformat_text(t):
    # format_ts takes msgspec's encoder for UTC times with a fraction; every path
    # must write what isoformat writes, fixed width.
    utc = t.astimezone(timezone.utc)
    assert format_ts(t) == utc.isoformat(timespec="microseconds")[:-6] + "Z"
    assert len(format_ts(t)) == 27
