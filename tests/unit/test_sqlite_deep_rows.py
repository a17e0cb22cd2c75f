"""The SQLite writer's deep parameter rows: clip and encode in one pass
(``sqlite_operations.clipped_deep_params``) give the rows of the port's clip
(``semantics.clip_batch``) encoded field by field, and name the same cuts."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from stepstream.core.limits import Limits
from stepstream.core.records import DeepRecord
from stepstream.sinks.semantics import clip_batch
from stepstream.sinks.sqlite_operations import DEEP_JSON_NAMES, clipped_deep_params

PROPS = settings(max_examples=300, deadline=None, print_blob=True)
chars = st.sampled_from(["a", "é", "日", "😀", "\n", "\x00", '"', "\\"])
texts = st.lists(chars, max_size=40).map("".join)
values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
records = st.builds(
    DeepRecord,
    company_id=st.sampled_from(["c1", "c2"]),
    run_id=st.sampled_from(["r1", "r2"]),
    step_seq=st.integers(0, 5),
    kind=st.sampled_from(["thinking", "tool", "llm"]),
    ts=st.just("2026-11-29T10:00:00.000000Z"),
    reasoning=st.none() | texts,
    reasoning_offset=st.integers(0, 40),
    arguments=values,
    output=values,
    clipped=st.booleans(),
    call_event=st.none() | st.dictionaries(texts, texts, max_size=2),
    result_event=st.none() | st.dictionaries(texts, texts, max_size=2),
)
limits = st.builds(
    Limits, reasoning_chars=st.integers(12, 60), output_chars=st.integers(0, 60), arguments_chars=st.integers(0, 60)
)


def reference(deeps: list[DeepRecord], limit: Limits) -> tuple[list[tuple[Any, ...]], list[str]]:
    """Clip with the port's rule, then encode every JSON field of each row."""
    cut: list[str] = []
    rows = []
    fields = DeepRecord.__struct_fields__
    for deep in clip_batch(deeps, limit, cut.append):
        row = list(msgspec.structs.astuple(deep))
        for name in DEEP_JSON_NAMES:
            i = fields.index(name)
            if row[i] is not None:
                row[i] = msgspec.json.encode(row[i]).decode()
        rows.append(tuple(row))
    return rows, cut


@PROPS
@given(st.lists(records, max_size=6), limits)
def test_one_pass_rows_equal_the_clip_then_the_encoding(deeps, limit):
    cut: list[str] = []
    rows = clipped_deep_params(deeps, limit, cut)
    expected_rows, expected_cut = reference(deeps, limit)
    assert rows == expected_rows
    assert cut == expected_cut


def test_the_default_caps_apply_without_limits():
    deep = DeepRecord(company_id="c", run_id="r", step_seq=0, kind="tool", ts="t", output="x" * 70_000)
    cut: list[str] = []
    (row,) = clipped_deep_params([deep], None, cut)
    assert cut == ["output"]
    assert len(msgspec.json.decode(row[DeepRecord.__struct_fields__.index("output")])) == Limits().output_chars
