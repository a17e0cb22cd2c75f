"""Wire format v1: the decoder, its error kinds, the golden examples and the schema drift."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepstream import schemagen
from stepstream.core import wire
from stepstream.errors import WireError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "schemas" / "examples").glob("*.json"))


def _good(**over) -> dict:
    event = {
        "v": 1,
        "event_id": "e-1",
        "company_id": "acme",
        "run_id": "r:1",
        "seq": 0,
        "ts": "2026-11-29T10:00:00Z",
        "type": "tool_call",
        "parent_id": None,
        "payload": {"call_id": "c1", "tool": "sh", "arguments": {"cmd": "ls"}},
    }
    event.update(over)
    return event


def _reason(data: bytes) -> str:
    with pytest.raises(WireError) as info:
        wire.decode_event(data)
    return info.value.reason


def test_golden_examples_cover_every_type_and_decode():
    assert EXAMPLES, "schemas/examples is empty"
    seen = set()
    for path in EXAMPLES:
        raw = path.read_bytes()
        event = wire.decode_event(raw)
        seen.add(event.__struct_config__.tag)
        # Decoding is lossless for what the contract defines.
        again = json.loads(wire.encode_event(event))
        original = json.loads(raw)
        for key in ("event_id", "company_id", "run_id", "seq", "type"):
            assert again[key] == original[key], (path.name, key)
        # Optional payload fields left at their default are omitted on re-encode.
        for key, value in again["payload"].items():
            assert original["payload"][key] == value, (path.name, key)
        assert wire.decode_event(wire.encode_event(event)) == event
    assert seen == set(wire.EVENT_TYPE_NAMES)


def test_committed_schemas_match_the_structs():
    for name, text in schemagen.render().items():
        committed = ROOT / "schemas" / name
        assert committed.exists(), f"{name} missing: run `make schemas`"
        assert committed.read_text(encoding="utf-8") == text, (
            f"schemas/{name} drifted from the Structs: run `make schemas` and commit"
        )


def test_decodes_every_type_to_its_struct():
    event = wire.decode_event(json.dumps(_good()).encode())
    assert isinstance(event, wire.ToolCall)
    assert event.payload.arguments == {"cmd": "ls"}
    assert event.ts.utcoffset().total_seconds() == 0


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"not json at all", "not_json"),
        (b'{"v":1,', "not_json"),
        (b"", "not_json"),
        (json.dumps(_good(payload={"call_id": "c", "tool": "t", "arguments": {"x": "\udcff"}}), ensure_ascii=False).encode("utf-8", "surrogateescape"), "not_utf8"),
        (b"[1,2,3]", "not_object"),
        (b'"a string"', "not_object"),
        (json.dumps(_good(type="llm_dream")).encode(), "unknown_type"),
        (json.dumps({k: v for k, v in _good().items() if k != "run_id"}).encode(), "missing_field"),
        (json.dumps(_good(payload={"call_id": "c", "tool": "t"})).encode(), "missing_field"),
        (json.dumps({k: v for k, v in _good().items() if k != "type"}).encode(), "missing_field"),
        (json.dumps(_good(seq="7")).encode(), "wrong_type"),
        (json.dumps(_good(payload={"call_id": "c", "tool": "t", "arguments": []})).encode(), "wrong_type"),
        (json.dumps(_good(ts=12345)).encode(), "wrong_type"),
        (json.dumps(_good(company_id="acme corp")).encode(), "bad_id"),
        (json.dumps(_good(company_id="x" * 65)).encode(), "bad_id"),
        (json.dumps(_good(run_id="r/1")).encode(), "bad_id"),
        (json.dumps(_good(event_id="")).encode(), "bad_id"),
        (json.dumps(_good(v=2)).encode(), "bad_version"),
        (json.dumps(_good(v="1")).encode(), "wrong_type"),
        (json.dumps(_good(seq=-1)).encode(), "out_of_range"),
        (json.dumps(_good(ts="yesterday")).encode(), "invalid_value"),
        (json.dumps(_good(ts="2026-11-29T10:00:00")).encode(), "invalid_value"),
        (json.dumps(_good(type="run_end", payload={"status": "paused"})).encode(), "invalid_value"),
    ],
)
def test_bad_input_gets_a_named_reason(data, reason):
    assert _reason(data) == reason


def _nested(levels: int) -> bytes:
    """A tool call whose message nests exactly ``levels`` arrays and objects (the
    event object is 1, its payload 2, the arguments object 3)."""
    inner = b"[" * (levels - 3) + b"]" * (levels - 3)
    event = _good(payload={"call_id": "c", "tool": "t", "arguments": {"a": "@"}})
    return json.dumps(event).encode().replace(b'"@"', inner)


@pytest.mark.parametrize(
    ("over", "reason"),
    [
        ({"ts": "0001-01-01T00:30:00+01:00"}, "out_of_range"),  # decodes, but overflows in UTC
        ({"ts": "9999-12-31T23:30:00-01:00"}, "out_of_range"),
        ({"ts": "1969-12-31T23:59:59.999999Z"}, "out_of_range"),
        ({"ts": "1970-01-01T00:59:59.999999+01:00"}, "out_of_range"),
        ({"ts": "9999-12-30T00:00:00.000001Z"}, "out_of_range"),
        ({"ts": "1970-01-01T00:00:00Z"}, None),
        ({"ts": "1969-12-31T19:00:00-05:00"}, None),
        ({"ts": "9999-12-30T00:00:00Z"}, None),
        ({"seq": 2**53 - 1}, None),
        ({"seq": 2**53}, "out_of_range"),
        ({"seq": 10**20}, "out_of_range"),
        ({"type": "llm_response", "payload": {"call_id": "c", "output": 1, "usage": {"input_tokens": 10**12}}}, None),
        ({"type": "llm_response", "payload": {"call_id": "c", "output": 1, "usage": {"input_tokens": 2**63}}}, "out_of_range"),
        ({"type": "llm_response", "payload": {"call_id": "c", "output": 1, "usage": {"output_tokens": 10**12 + 1}}}, "out_of_range"),
        ({"type": "llm_response", "payload": {"call_id": "c", "output": 1, "usage": {"reasoning_tokens": -1}}}, "out_of_range"),
    ],
)  # fmt: skip
def test_bounds(over, reason):
    data = json.dumps(_good(**over)).encode()
    if reason is None:
        wire.decode_event(data)
    else:
        assert _reason(data) == reason


def test_a_number_json_cannot_hold_as_a_float_is_out_of_range():
    data = json.dumps(_good(payload={"call_id": "c", "tool": "t", "arguments": {"x": "@"}})).encode()
    assert _reason(data.replace(b'"@"', b"1e400")) == "out_of_range"


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview, lambda b: b.decode()])
def test_nesting_is_bounded_for_every_input_kind(kind):
    assert isinstance(wire.decode_event(kind(_nested(wire.MAX_NESTING))), wire.ToolCall)
    assert _reason(kind(_nested(wire.MAX_NESTING + 1))) == "too_deep"
    assert _reason(kind(_nested(990))) == "too_deep"  # decodes, but encoding it in the fold would not
    assert _reason(kind(_nested(5000))) == "too_deep"  # past msgspec's own recursion limit


def test_many_brackets_that_do_not_nest_are_fine():
    wide = [[[]] for _ in range(500)]  # 1,000 brackets, four levels deep
    arguments = {"w": wide, "s": "[" * 300}
    event = wire.decode_event(json.dumps(_good(payload={"call_id": "c", "tool": "t", "arguments": arguments})).encode())
    assert len(event.payload.arguments["w"]) == 500


def test_nesting_in_an_ignored_field_is_bounded_by_msgspec():
    deep = b"[" * 5000 + b"]" * 5000
    data = json.dumps(_good(extra="@")).encode().replace(b'"@"', deep)
    assert _reason(data) == "too_deep"


def test_json_fields_names_every_payload_field_that_holds_any_json():
    for cls in wire.EVENT_TYPES:
        payload = msgspec.structs.fields(_payload_type(cls))
        free = tuple(f.name for f in payload if "Any" in repr(f.type))
        assert wire.JSON_FIELDS.get(cls, ()) == free, cls.__name__


def _payload_type(cls: type) -> type:
    return next(f.type for f in msgspec.structs.fields(cls) if f.name == "payload")


def test_reasons_are_unique_and_name_the_new_ones():
    assert len(set(wire.DECODE_REASONS)) == len(wire.DECODE_REASONS)
    assert {"out_of_range", "too_deep", "seq_jump", "bad_key", "unfoldable"} <= set(wire.DECODE_REASONS)


def test_error_names_the_field():
    with pytest.raises(WireError) as info:
        wire.decode_event(json.dumps(_good(run_id="has space")).encode())
    assert "$.run_id" in str(info.value)
    assert info.value.reason in wire.DECODE_REASONS


@pytest.mark.parametrize(
    ("over", "reason", "detail"),
    [
        ({"type": "run_end", "payload": {"status": "sk-CANARYCANARYCANARY"}}, "invalid_value",
         "Invalid enum value - at `$.payload.status`"),
        ({"type": "sk-CANARYCANARYCANARY"}, "unknown_type", "Invalid value - at `$.type`"),
        ({"v": 7777777}, "bad_version", "Invalid enum value - at `$.v`"),
    ],
)  # fmt: skip
def test_no_message_quotes_the_rejected_value(over, reason, detail):
    with pytest.raises(WireError) as info:
        wire.decode_event(json.dumps(_good(**over)).encode())
    assert (info.value.reason, info.value.detail) == (reason, detail)
    assert "CANARY" not in str(info.value) and "7777777" not in str(info.value)


def test_oversize_is_rejected_before_parsing():
    data = json.dumps(_good()).encode()
    assert _reason_with_limit(data, len(data) - 1) == "oversize"
    assert isinstance(wire.decode_event(data, max_bytes=len(data)), wire.ToolCall)


def _reason_with_limit(data: bytes, limit: int) -> str:
    with pytest.raises(WireError) as info:
        wire.decode_event(data, max_bytes=limit)
    return info.value.reason


def test_partition_key_keeps_a_run_together():
    assert wire.partition_key("acme", "r:1") == b"acme/r:1"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_wire_error(data):
    try:
        wire.decode_event(data)
    except WireError as exc:
        assert exc.reason in wire.DECODE_REASONS


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    args=st.dictionaries(st.text(max_size=10), _json_values, max_size=5),
    seq=st.integers(0, 2**40),
    run_id=st.from_regex(r"[A-Za-z0-9._:-]{1,128}", fullmatch=True),
)
def test_round_trip_preserves_the_event(args, seq, run_id):
    event = wire.decode_event(json.dumps(_good(seq=seq, run_id=run_id, payload={"call_id": "c", "tool": "t", "arguments": args})).encode())
    assert wire.decode_event(wire.encode_event(event)) == event
    assert msgspec.json.decode(wire.encode_event(event))["payload"]["arguments"] == args


_IDS = {"company_id": st.from_regex(r"[A-Za-z0-9._-]{1,64}", fullmatch=True),
        "run_id": st.from_regex(r"[A-Za-z0-9._:-]{1,128}", fullmatch=True)}  # fmt: skip


def _wire_schema_validator():
    import jsonschema

    schema = json.loads((ROOT / "schemas" / "wire-v1.schema.json").read_text())
    return jsonschema.Draft202012Validator(schema)


@settings(max_examples=100, deadline=None)
@given(field=st.sampled_from(sorted(_IDS)), data=st.data(), tail=st.sampled_from(["\n", "\r\n", "\n\n", " "]))
def test_an_id_with_a_trailing_newline_is_refused_by_the_worker_and_the_schema(field, data, tail):
    """The patterns are matched whole: ``$`` in Python's ``re`` also matches before a
    final newline, so ``acme\\n`` passed the worker while the contract refused it."""
    good = data.draw(_IDS[field])
    event = _good(**{field: good})
    assert wire.decode_event(json.dumps(event).encode()).__getattribute__(field) == good
    bad = _good(**{field: good + tail})
    assert _reason(json.dumps(bad).encode()) == "bad_id"
    validator = _wire_schema_validator()
    assert validator.is_valid(event)
    assert not validator.is_valid(bad)  # Python's jsonschema searches too: the schema's pattern is whole
