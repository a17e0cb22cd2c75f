"""Hostile events: whatever a message holds, the worker can dead-letter it or store it.

For every generated message (extreme times and offsets, huge and negative numbers in
the envelope and the payload, NUL and non-BMP characters, lone surrogate escapes,
empty and huge strings, deep nesting), exactly one of these holds:

* ``decode_event`` raises ``WireError`` with a reason of ``DECODE_REASONS``;
* ``RunFold.push`` raises ``WireError`` and the fold is exactly as it was before;
* ``push`` succeeds and every record it (and the flushes after it) made encodes to
  JSON, round-trips, holds only integers a signed 64-bit column takes, and only
  timestamps in the stored fixed-width form, inside the window, which sort as text.

Nothing else may escape: an exception of any other type fails the test.
"""

from __future__ import annotations

import copy
import re
from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec
from fold_support import ev
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stepstream.core.fold import Limits, Output, RunFold
from stepstream.core.records import DeepRecord, RunState, StepRecord
from stepstream.core.timefmt import format_ts, parse_ts
from stepstream.core.wire import DECODE_REASONS, decode_event
from stepstream.errors import WireError

PROPS = settings(max_examples=300, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])

INT64 = range(-(2**63), 2**63)
STORED_TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
TS_FIELDS = ("started_at", "ended_at", "last_event_at", "ts", "thinking_started_at")

# -- what a hostile agent sends -------------------------------------------------------

EDGE_INTS = [
    0, -1, 1, 2**31, 2**53 - 1, 2**53, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**12, 10**12 + 1, 10**20, -(2**63) - 1,
]  # fmt: skip
ints = st.one_of(st.integers(0, 12), st.sampled_from(EDGE_INTS), st.integers(), st.integers(-(2**80), 2**80))
# Numbers only raw JSON text can spell.
raw_numbers = st.sampled_from([b"1e400", b"-1e400", b"1e-400", b"-0", b"1E5", b"123456789012345678901234567890.5"])
# Escapes: a lone surrogate (not valid text), a valid surrogate pair, NUL, the line separator.
raw_strings = st.sampled_from([b'"\\ud800"', b'"a\\udfffb"', b'"\\ud83d\\ude00"', b'"\\u0000"', b'"\\u2028"'])
SPECIAL = ["\x00", "😀", "𝔘", "\U0010ffff", "\ufeff", "\u2028", "[", "{", "é", "日"]
short_text = st.text(st.one_of(st.characters(exclude_categories=["Cs"]), st.sampled_from(SPECIAL)), max_size=24)
strings = st.one_of(
    short_text,
    short_text,
    short_text,
    st.sampled_from(["", "\x00", "x" * 300, "[" * 150, "{" * 150, "Bearer abcdefghijkl0123"]),
    st.integers(65_530, 65_540).map(lambda n: "😀" * n),  # around the caps, four UTF-8 bytes each
)


def nested(levels: int, array: bool) -> msgspec.Raw:
    if array:
        return msgspec.Raw(b"[" * levels + b"]" * levels)
    return msgspec.Raw(b'{"a":' * levels + b"1" + b"}" * levels)


levels = st.one_of(st.integers(1, 8), st.integers(95, 105), st.integers(900, 1100))  # around both limits
deep_values = st.builds(nested, levels, st.booleans())
scalars = st.one_of(
    st.none(), st.booleans(), ints, st.floats(allow_nan=False, allow_infinity=False), strings,
    raw_numbers.map(msgspec.Raw), raw_strings.map(msgspec.Raw),
)  # fmt: skip
json_values = st.recursive(
    scalars | deep_values,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(strings, kids, max_size=4),
    max_leaves=16,
)
objects = st.dictionaries(strings, json_values, max_size=4) | st.builds(nested, levels, st.just(False))
maybe = lambda strategy: st.none() | strategy  # noqa: E731
call_ids = st.one_of(st.just("c"), st.just("l"), strings)  # often one the prefixes opened

OFFSETS = st.integers(-1439, 1439).map(lambda m: timezone(timedelta(minutes=m)))
EDGE_TIMES = [
    "0001-01-01T00:30:00+01:00", "9999-12-31T23:30:00-01:00", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z",
    "1970-01-01T00:00:00Z", "1969-12-31T23:59:59.999999Z", "1970-01-01T00:59:59+01:00", "1969-12-31T19:00:00-05:00",
    "9999-12-30T00:00:00Z", "9999-12-30T00:00:00.000001Z", "9999-12-29T23:59:59.9999999Z", "2026-11-29t10:00:00z",
    "2026-11-29 10:00:00Z", "2026-11-29T10:00:00.123456789+23:59", "2026-02-29T10:00:00Z", "2026-11-29T10:00:60Z",
]  # fmt: skip
times = st.one_of(
    st.sampled_from(EDGE_TIMES),
    st.datetimes(datetime(1, 1, 1), datetime(9999, 12, 31, 23, 59, 59, 999999), timezones=OFFSETS).map(
        datetime.isoformat
    ),
    st.datetimes(datetime(2026, 11, 29), datetime(2026, 11, 30), timezones=st.just(timezone.utc)).map(
        lambda t: t.isoformat().replace("+00:00", "Z")
    ),
)

PAYLOADS: dict[str, Any] = {
    "run_start": st.fixed_dictionaries(
        {"agent_name": strings}, optional={"environment": maybe(strings | objects | json_values), "metadata": maybe(objects)}
    ),
    "llm_request": st.fixed_dictionaries(
        {"call_id": call_ids, "provider": strings, "model": strings, "input": json_values},
        optional={"params": maybe(objects)},
    ),
    "llm_response": st.fixed_dictionaries(
        {"call_id": call_ids, "output": json_values},
        optional={
            "usage": maybe(
                st.fixed_dictionaries(
                    {}, optional={k: ints for k in ("input_tokens", "output_tokens", "reasoning_tokens")}
                )
            ),
            "stop_reason": maybe(strings),
        },
    ),
    "thinking_delta": st.fixed_dictionaries({"text": strings}),
    "tool_call": st.fixed_dictionaries({"call_id": call_ids, "tool": strings, "arguments": objects}),
    "tool_result": st.fixed_dictionaries(
        {"call_id": call_ids, "output": json_values}, optional={"is_error": st.booleans()}
    ),
    "state_change": st.fixed_dictionaries({"key": strings, "value": json_values}),
    "error": st.fixed_dictionaries({"message": strings}, optional={"kind": maybe(strings)}),
    "run_end": st.fixed_dictionaries(
        {"status": st.sampled_from(["completed", "failed", "paused"])}, optional={
            "failure": maybe(
                strings
                | st.fixed_dictionaries(
                    {"type": strings, "message": strings}, optional={"step": ints, "extra": json_values}
                )
            )
        },
    ),
}


ENVELOPE = ("v", "event_id", "company_id", "run_id", "seq", "ts", "parent_id", "x_future_field")


@st.composite
def messages(draw, seq: Any = st.integers(0, 8)) -> bytes:
    """One message of run acme/r1 with a hostile payload; a few envelope fields
    (often none) are hostile too."""
    kind = draw(st.sampled_from(sorted(PAYLOADS)))
    hostile = draw(st.sets(st.sampled_from(ENVELOPE), max_size=3))
    event = {
        "v": draw(st.sampled_from([2, 0, 2**64, 1])) if "v" in hostile else 1,
        "event_id": draw(strings) if "event_id" in hostile else "e-1",
        "company_id": draw(st.sampled_from(["ACME.b-2", "acme corp", "acme"])) if "company_id" in hostile else "acme",
        "run_id": draw(st.sampled_from(["r:2", "r/1", "r1"])) if "run_id" in hostile else "r1",
        "seq": draw(ints if "seq" in hostile else seq),
        "ts": draw(times if "ts" in hostile else st.sampled_from(["2026-11-29T10:00:00Z", "2026-11-29T12:00:00+02:00"])),
        "type": kind,
        "payload": draw(PAYLOADS[kind]),
    }
    if "parent_id" in hostile:
        event["parent_id"] = draw(maybe(strings))
    if "x_future_field" in hostile:
        event["x_future_field"] = draw(json_values)  # unknown fields are ignored, whatever they hold
    return msgspec.json.encode(event)


# -- what the fold already holds ----------------------------------------------------------

PREFIXES = [
    [],
    [("run_start", {"agent_name": "bot"})],
    [("run_start", {"agent_name": "bot"}), ("tool_call", {"call_id": "c", "tool": "t", "arguments": {}}),
     ("thinking_delta", {"text": "pending "})],
    [("llm_request", {"call_id": "l", "provider": "p", "model": "m", "input": []}),
     ("thinking_delta", {"text": "a"}), ("thinking_delta", {"text": "b"})],
]  # fmt: skip


def started(prefix: int, limits: Limits) -> RunFold:
    fold = RunFold("acme", "r1", limits=limits)
    for seq, (kind, payload) in enumerate(PREFIXES[prefix]):
        fold.push(ev(kind, seq, **payload), 0.0)
    return fold


def fingerprint(fold: RunFold) -> dict[str, Any]:
    return {name: copy.deepcopy(getattr(fold, name)) for name in RunFold.__slots__}


# -- what every store must be able to take ------------------------------------------------


def ints_in(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, dict):
        return [i for item in [*value.keys(), *value.values()] for i in ints_in(item)]
    if isinstance(value, list):
        return [i for item in value for i in ints_in(item)]
    return []


def check_storable(out: Output | None) -> None:
    if out is None:
        return
    text = msgspec.json.encode([out.steps, out.deeps, out.run, out.state])
    assert msgspec.json.decode(text) is not None
    if out.state is not None:
        assert msgspec.json.decode(msgspec.json.encode(out.state), type=RunState) == out.state
    records = [*out.steps, *out.deeps, *([out.run] if out.run else []), *([out.state] if out.state else [])]
    for record in records:
        fields = msgspec.to_builtins(record)
        # A step's arguments are a payload value, stored as JSON text by every sink (any JSON
        # number is fine there); every other integer lands in an integer column.
        if isinstance(record, StepRecord):
            fields.pop("arguments", None)
        # So are deep bodies and a run's environment: JSON values, stored as JSON text.
        if isinstance(record, DeepRecord):
            fields.pop("arguments", None)
            fields.pop("output", None)
        for holder in (fields, fields.get("run") or {}):
            holder.pop("environment", None)
        assert all(i in INT64 for i in ints_in(fields)), record
        for name in TS_FIELDS:
            stamps = [fields.get(name), (fields.get("run") or {}).get(name)]
            for stamp in (s for s in stamps if s is not None):
                assert STORED_TS.fullmatch(stamp), stamp
                assert "1970-01-01T00:00:00.000000Z" <= stamp <= "9999-12-30T00:00:00.000000Z"
                assert format_ts(parse_ts(stamp)) == stamp


def push_or_reject(fold: RunFold, message: bytes, now: float) -> Output | None:
    """Decode and push one message the way the worker does; check the outcome."""
    try:
        event = decode_event(message)
    except WireError as exc:
        assert exc.reason in DECODE_REASONS
        return None
    if (event.company_id, event.run_id) != (fold.company_id, fold.run_id):
        fold = RunFold(event.company_id, event.run_id)
    before = fingerprint(fold)
    try:
        out = fold.push(event, now)
    except WireError as exc:
        assert exc.reason in DECODE_REASONS
        assert fingerprint(fold) == before, "a rejected event changed the fold"
        return None
    check_storable(out)
    return out


@PROPS
@given(prefix=st.integers(0, len(PREFIXES) - 1), message=messages())
def test_a_hostile_event_is_rejected_or_folds_to_storable_records(prefix, message):
    fold = started(prefix, Limits(max_seq_jump=1000))
    out = push_or_reject(fold, message, 1.0)
    check_storable(fold.flush_idle(1e9))
    check_storable(fold.flush())
    if out is not None and out.state is not None:
        state = msgspec.json.decode(msgspec.json.encode(out.state), type=RunState)
        restored = RunFold(state.company_id, state.run_id, state)
        end = ev("run_end", state.last_seq + 1, company=state.company_id, run=state.run_id, status="completed")
        check_storable(restored.push(end, 2.0))


@PROPS
@given(
    prefix=st.integers(0, len(PREFIXES) - 1),
    stream=st.lists(messages(seq=st.integers(0, 12)), min_size=1, max_size=8),
    flush_deltas=st.integers(1, 4),
)
def test_a_hostile_stream_never_breaks_a_fold(prefix, stream, flush_deltas):
    limits = Limits(max_seq_jump=5, flush_deltas=flush_deltas, flush_bytes=64, reasoning_chars=100)
    fold = started(prefix, limits)
    durable = None
    for i, message in enumerate(stream):
        outs = [push_or_reject(fold, message, float(i))]
        if i % 3 == 2:
            outs.append(fold.flush_idle(1e9))
        outs.append(fold.flush() if i == len(stream) - 1 else None)
        for out in outs:
            check_storable(out)
            if out is not None and out.state is not None and (out.state.company_id, out.state.run_id) == ("acme", "r1"):
                durable = out.state
    if durable is not None:  # the last durable state restores to the fold it describes
        restored = RunFold("acme", "r1", msgspec.json.decode(msgspec.json.encode(durable), type=RunState), limits)
        assert restored.state == fold.state


@settings(max_examples=300, deadline=None, print_blob=True)
@given(st.one_of(json_values, objects))
def test_any_json_message_decodes_or_gets_a_named_reason(value):
    try:
        decode_event(msgspec.json.encode(value))
    except WireError as exc:
        assert exc.reason in DECODE_REASONS
