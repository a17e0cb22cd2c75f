"""``core.merge``: the one definition of the write semantics, and the law that makes
the batch's coalescing safe (``merge_deep`` equals two writes in order)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stepstream.core.merge import apply_deep, apply_reasoning, can_merge_deep, merge_deep
from stepstream.core.records import DeepRecord

text = st.text(st.sampled_from("ab😀é\x00"), max_size=8)


def chunk(body: str | None, at: int, n: int = 0, **fields) -> DeepRecord:
    return DeepRecord(company_id="c", run_id="r", step_seq=0, kind="thinking", ts=f"t{n}", reasoning=body,
                      reasoning_offset=at, **fields)  # fmt: skip


def test_apply_reasoning_edges():
    assert apply_reasoning("abcdef", 2, "XY") == "abXYef"  # overwrites its own span
    assert apply_reasoning("abc", 1, "X") == "aXc" and apply_reasoning("abc", 0, "") == "abc"  # never shortens
    assert apply_reasoning("abc", 9, "X") == "abcX"  # past the end: appended, nothing lost
    assert apply_reasoning(None, 5, "X") == "X" and apply_reasoning("", 5, "X") == "X"  # no text yet: taken whole
    assert apply_reasoning("abc", 1, None) == "abc"


@settings(max_examples=300, deadline=None)
@given(text, text, st.integers(0, 8), text, st.integers(0, 8), st.data())
def test_merge_deep_equals_two_writes_in_order(stored, first, first_at, second, cut, data):
    first_at = min(first_at, len(stored))
    a = chunk(first, first_at, 1, arguments=data.draw(st.none() | st.just({"x": 1})), clipped=data.draw(st.booleans()))
    b = chunk(second, first_at + min(cut, len(first)), 2, output=data.draw(st.none() | st.just([1])))
    row = chunk(stored, 0) if stored else None
    assert can_merge_deep(a, b)
    assert apply_deep(apply_deep(row, a), b) == apply_deep(row, merge_deep(a, b))


def test_merge_deep_refuses_a_gap():
    a, b = chunk("ab", 0), chunk("x", 5)
    assert not can_merge_deep(a, b)
    with pytest.raises(ValueError):
        merge_deep(a, b)
    assert merge_deep(None, b) is b


def test_sinks_semantics_reexports_the_core_definition():
    from stepstream.core import merge
    from stepstream.sinks import semantics

    assert semantics.apply_deep is merge.apply_deep and semantics.apply_reasoning is merge.apply_reasoning
    assert semantics.merge_step is merge.merge_step
