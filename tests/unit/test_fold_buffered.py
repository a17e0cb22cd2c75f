"""``core.fold.BUFFERED``: the one shared Output of a delta that only joined the tail.
It is what an in-order buffered delta returns, and nothing ever changes it: not a delta
after a gap (which gets ``seq_gap``), not a flush, not a late delta."""

from __future__ import annotations

from fold_support import ev
from hypothesis import given, settings
from hypothesis import strategies as st
from stepstream.core.fold import BUFFERED, Limits, Output, RunFold

EMPTY = Output([], [], None, None, [], [])


def test_an_in_order_buffered_delta_returns_the_shared_output():
    fold = RunFold("acme", "r1", None, Limits(), lazy=True)
    fold.push(ev("run_start", 0, agent_name="a"), 0.0)
    assert fold.push(ev("thinking_delta", 1, text="hmm"), 0.0) is BUFFERED
    assert fold.push(ev("thinking_delta", 2, text=" more"), 0.0) is BUFFERED


def test_a_delta_after_a_gap_gets_its_own_output():
    fold = RunFold("acme", "r1", None, Limits(), lazy=False)
    fold.push(ev("run_start", 0, agent_name="a"), 0.0)
    out = fold.push(ev("thinking_delta", 3, text="after a gap"), 0.0)
    assert out is not BUFFERED and out.seq_gap
    assert BUFFERED == EMPTY


@settings(max_examples=150, deadline=None, print_blob=True)
@given(
    st.lists(st.tuples(st.sampled_from(["delta", "tool", "gap", "late", "flush"]), st.integers(1, 3)), max_size=30),
    st.booleans(),
)
def test_nothing_changes_the_shared_output(steps, lazy):
    fold = RunFold("acme", "r1", None, Limits(flush_bytes=16, flush_deltas=3), lazy=lazy)
    fold.push(ev("run_start", 0, agent_name="a"), 0.0)
    seq, skipped = 0, []
    for action, n in steps:
        if action == "flush":
            fold.flush("idle")
            continue
        if action == "late" and skipped:
            late = skipped.pop()
            fold.push(ev("thinking_delta", late, text="late"), 0.0)
            continue
        if action == "gap":
            skipped.extend(range(seq + 1, seq + 1 + n))
            seq += n
        seq += 1
        if action == "tool":
            fold.push(ev("tool_call", seq, call_id=f"c{seq}", tool="t", arguments={"q": "x" * n}), 0.0)
        else:
            fold.push(ev("thinking_delta", seq, text="y" * n), 0.0)
        assert BUFFERED == EMPTY
