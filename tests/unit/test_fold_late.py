"""Late events (CONTRACT.md section 1): an event whose ``seq`` fills a gap the run
skipped is applied, not dropped; a duplicate is still skipped; both are counted.

The properties deliver one or more runs' events late, duplicated, with gaps and
crashes, and hold the fold to three things: it never raises, the same delivery
order gives the same rows (also across a crash and a replay from durable state),
and, when every event eventually arrives and no thinking delta is late, the rows
equal those of in-order delivery up to the numbering of the ordinals (which are
dense and follow arrival).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec
from fold_support import T0, Store, ev, restart_from_every_snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stepstream.core import wire
from stepstream.core.fold import Limits, RunFold
from test_fold_properties import ingest, ops, to_event, worker

PROPS = settings(max_examples=200, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
ROOMY = Limits(max_steps=10_000, flush_bytes=8, reasoning_chars=60, output_chars=40, arguments_chars=40)


def late_order(draw: Any, count: int, *, movable: list[bool]) -> list[int]:
    """A delivery order of ``range(count)``: some events (where ``movable``) are held
    back by a few positions; the others keep their relative order."""
    keys = []
    for i in range(count):
        delay = draw(st.integers(0, 6)) if movable[i] and draw(st.integers(0, 3)) == 0 else 0
        keys.append((i + delay + (0.5 if delay else 0), i))
    return [i for _, i in sorted(keys)]


@st.composite
def late_runs(draw: Any, *, complete: bool):
    """``(limits, in_order, deliveries)`` for up to three runs. ``complete``: every
    event arrives, no thinking delta is late, call ids are unique within a run and
    the limits leave room; otherwise anything goes (lost events, late deltas,
    repeated call ids, small caps and step ceilings)."""
    lim = ROOMY if complete else draw(st.builds(Limits, max_steps=st.integers(1, 12), flush_bytes=st.integers(1, 30),
                                                 reasoning_chars=st.integers(12, 60), late_ranges=st.integers(1, 4)))  # fmt: skip
    in_order: list[Any] = []
    deliveries: list[Any] = []
    for r in range(draw(st.integers(1, 3))):
        script = draw(st.lists(ops, min_size=1, max_size=18))
        if complete:
            # Unique call ids (a late call has one result to pair with), and at most one
            # run_start (first) and one run_end (anywhere), as agents send them.
            script = [op[:2] + (f"c{i}",) + op[3:] if op[0] in ("call", "result") else op for i, op in enumerate(script)]
            script = [op for op in _pair_ids(script) if op[0] not in ("start", "end")]
            first = 0
            if draw(st.booleans()):
                script.insert(0, ("start",))
                first = 1
            if draw(st.booleans()):
                end = ("end", draw(st.sampled_from(["completed", "failed"])))
                script.insert(draw(st.integers(first, len(script))), end)
        events = [to_event(f"r{r}", seq, op, 0) for seq, op in enumerate(script)]
        in_order += events
        movable = [not (complete and e.__struct_config__.tag == "thinking_delta") for e in events]
        order = late_order(draw, len(events), movable=movable)
        if not complete:
            lost = draw(st.sets(st.sampled_from(range(len(events))), max_size=3))
            order = [i for i in order if i not in lost]
        run_deliveries = [events[i] for i in order]
        for _ in range(draw(st.integers(0, 3))):  # re-deliveries of what already came
            at = draw(st.integers(0, len(run_deliveries)))
            run_deliveries[at:at] = run_deliveries[max(0, at - draw(st.integers(1, 4))) : at]
        deliveries = _interleave(draw, deliveries, run_deliveries)
    return lim, in_order, deliveries


def _pair_ids(script: list[tuple]) -> list[tuple]:
    """Give each result the id of the latest earlier call of its kind that has no
    result yet (or a fresh id): one result per call, as agents send them."""
    open_: dict[str, list[str]] = {"tool": [], "llm": []}
    out = []
    for op in script:
        if op[0] == "call":
            open_[op[1]].append(op[2])
        elif op[0] == "result":
            op = op[:2] + (open_[op[1]].pop() if open_[op[1]] else f"orphan{len(out)}",) + op[3:]
        out.append(op)
    return out


def _interleave(draw: Any, left: list, right: list) -> list:
    picks = draw(st.permutations([0] * len(left) + [1] * len(right)))
    li, ri = iter(left), iter(right)
    return [next(li) if p == 0 else next(ri) for p in picks]


def expected_counts(deliveries: list) -> tuple[int, int]:
    """(late, duplicates) the deliveries hold: a first arrival below a seq already
    seen is late, any second arrival a duplicate."""
    seen: dict[str, set[int]] = {}
    late = dups = 0
    for e in deliveries:
        mine = seen.setdefault(e.run_id, set())
        if e.seq in mine:
            dups += 1
        elif mine and e.seq < max(mine):
            late += 1
        mine.add(e.seq)
    return late, dups


def rows_without_ordinals(store: Store, run: str) -> list[str]:
    """Each (step, deep) pair of a run as text with its ordinal taken out, sorted."""
    keys = sorted(k for k in store.steps if k[1] == run)
    assert [k[2] for k in keys] == list(range(len(keys))), "ordinals are dense"
    assert sorted(k for k in store.deeps if k[1] == run) == keys, "a deep row per step"
    pairs = []
    for key in keys:
        step = msgspec.structs.replace(store.steps[key], step_seq=0)
        deep = msgspec.structs.replace(store.deeps[key], step_seq=0)
        pairs.append(msgspec.json.encode([step, deep]).decode())
    return sorted(pairs)


def fold_counting(deliveries: list, lim: Limits) -> tuple[Store, int, int]:
    store, folds = Store(), {}
    for e in deliveries:
        fold = folds.setdefault(e.run_id, RunFold("acme", e.run_id, None, lim))
        store.write(fold.push(e, 0.0))
    for fold in folds.values():
        store.write(fold.flush())
    return store, sum(f.late for f in folds.values()), sum(f.stale for f in folds.values())


@PROPS
@given(late_runs(complete=True))
def test_every_event_arriving_late_gives_the_in_order_rows(case):
    lim, in_order, deliveries = case
    reference, _ = ingest(in_order, lim)
    store, late, stale = fold_counting(deliveries, lim)
    assert (late, stale) == expected_counts(deliveries)
    for run in {e.run_id for e in in_order}:
        assert rows_without_ordinals(store, run) == rows_without_ordinals(reference, run)
        got, want = store.runs[("acme", run)], reference.runs[("acme", run)]
        assert msgspec.structs.replace(got, seq_gaps=0, late_events=0) == want
        assert store.states[("acme", run)].skipped_seqs == ()
        assert store.states[("acme", run)].awaiting_calls == {}


@PROPS
@given(late_runs(complete=False), st.data())
def test_late_duplicate_and_gapped_deliveries_are_deterministic(case, data):
    lim, _, deliveries = case
    reference, outs = ingest(deliveries, lim)  # never raises
    again, _ = ingest(deliveries, lim)
    assert again.snapshot() == reference.snapshot()
    n = len(deliveries)
    positions = st.sets(st.integers(0, max(0, n - 1)), max_size=5)
    plan = {"crash": data.draw(positions), "idle": data.draw(positions), "commit": data.draw(positions)}
    assert worker(deliveries, lim, plan, data.draw(st.booleans())).snapshot() == reference.snapshot()
    for state in (o.state for o in outs if o.state is not None):
        assert len(state.skipped_seqs) <= lim.late_ranges and len(state.awaiting_calls) <= lim.late_ranges


@PROPS
@given(late_runs(complete=False))
def test_restart_from_every_durable_snapshot_with_late_events(case):
    lim, _, deliveries = case
    reference, outs = ingest(deliveries, lim)
    restart_from_every_snapshot(deliveries, lim, reference, outs)


# -- one decision per event type (docs/engine.md, "Late events") -------------------


def _fold(*events: Any, lim: Limits = Limits()) -> tuple[RunFold, Store, list]:
    fold, store, outs = RunFold("acme", "r1", None, lim), Store(), []
    for e in events:
        out = fold.push(e, 0.0)
        outs.append(out)
        store.write(out)
    store.write(fold.flush())
    return fold, store, outs


def test_a_late_result_completes_its_call():
    call = ev("tool_call", 0, call_id="c", tool="sh", arguments={})
    result = ev("tool_result", 1, call_id="c", output="done")
    fold, store, outs = _fold(call, ev("state_change", 2, key="k", value=1), result)
    assert outs[1].seq_gap and outs[2].late
    step = store.steps[("acme", "r1", 0)]
    assert (step.status, step.output_shape, step.label) == ("ok", "4 characters", "sh")
    assert len(store.steps) == 2 and fold.late == 1


def test_a_late_call_fills_the_step_its_result_made():
    call = ev("tool_call", 1, call_id="c", tool="sh", arguments={"q": 1})
    result = ev("tool_result", 2, call_id="c", output="x", is_error=True)
    _, store, _ = _fold(ev("run_start", 0, agent_name="a"), result, call)
    step = store.steps[("acme", "r1", 0)]
    assert (step.label, step.status, step.arguments, step.started_at) == ("sh", "error", {"q": 1}, "2026-11-29T10:00:00.001000Z")
    assert store.deeps[("acme", "r1", 0)].arguments is not None and len(store.steps) == 1


def test_a_late_delta_is_a_closed_step_of_its_own_and_leaves_the_open_run_alone():
    d0, d1, d2, d3 = (ev("thinking_delta", s, text=t) for s, t in ((0, "ab"), (1, "LATE"), (2, "cd"), (3, "ef")))
    _, store, outs = _fold(d0, d2, d1, d3, lim=Limits(flush_bytes=1000))
    assert outs[1].seq_gap and outs[2].late  # seq 2 skipped 1 (closing "ab"); 1 then came late
    thinking = sorted((k[2], s.status, store.deeps[k].reasoning) for k, s in store.steps.items())
    assert thinking == [(0, "ok", "ab"), (1, "running", "cdef"), (2, "ok", "LATE")]


def test_a_gap_closes_the_open_thinking_run():
    _, store, outs = _fold(ev("thinking_delta", 0, text="a"), ev("thinking_delta", 2, text="b"))
    assert outs[1].seq_gap
    assert [(s.status, store.deeps[k].reasoning) for k, s in sorted(store.steps.items())] == [("ok", "a"), ("running", "b")]


def test_skipped_seqs_are_bounded_and_the_oldest_forgotten():
    lim = Limits(late_ranges=2)
    fold, _, outs = _fold(*(ev("state_change", s, key="k", value=s) for s in (0, 2, 4, 6)), lim=lim)
    assert fold.state.skipped_seqs == ((3, 3), (5, 5))
    assert fold.push(ev("state_change", 1, key="k", value=1), 0.0) is None  # forgotten: a duplicate
    assert fold.push(ev("state_change", 3, key="k", value=3), 0.0).late
    assert (fold.stale, fold.late, fold.state.skipped_seqs) == (1, 1, ((5, 5),))


def test_late_run_start_and_run_end():
    fold, store, _ = _fold(
        ev("state_change", 1, key="k", value=1),
        ev("run_end", 2, status="failed", failure=wire.FailurePayload(type="ToolError", message="boom", step=0)),
        ev("run_start", 0, agent_name="a", environment={"region": "eu"}),
    )
    run = store.runs[("acme", "r1")]
    assert (run.agent_name, run.environment, run.status, run.failure.type) == ("a", {"region": "eu"}, "failed", "ToolError")
    assert run.started_at == "2026-11-29T10:00:00.000000Z" and run.late_events == 1 and run.seq_gaps == 1


def test_an_in_order_event_leaves_the_skipped_record_alone():
    """The late-event record costs nothing per in-order event: the snapshot shares it."""
    fold = RunFold("acme", "r1")
    fold.push(ev("state_change", 0, key="k", value=0), 0.0)
    fold.push(ev("state_change", 5, key="k", value=0), 0.0)
    before = fold.state.skipped_seqs
    out = fold.push(ev("state_change", 6, key="k", value=0), 0.0)
    assert out.state.skipped_seqs is before
