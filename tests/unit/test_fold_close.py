"""``run_close`` (the compactor's close of an abandoned run) in the fold: it takes no
agent seq, a resumed run keeps every event and ordinal, and any replay, crash or
restart gives the same rows."""

from __future__ import annotations

from datetime import timedelta

import msgspec
from fold_support import T0, Script, Store, ev
from hypothesis import given
from hypothesis import strategies as st
from stepstream.core import wire
from stepstream.core.fold import Limits, RunFold
from stepstream.core.records import RunState
from test_fold_properties import PROPS, ingest, scenarios, worker


def close(seq: int, run: str = "r1", minutes: int = 60) -> wire.RunClose:
    return wire.RunClose(
        v=1, event_id=f"close-{seq}", company_id="acme", run_id=run, seq=seq, ts=T0 + timedelta(minutes=minutes),
        payload=wire.RunClosePayload(status="abandoned", reason="idle"),
    )  # fmt: skip


def run_all(events, fold: RunFold | None = None) -> tuple[Store, RunFold]:
    fold = fold or RunFold("acme", "r1")
    store = Store()
    for i, event in enumerate(events):
        store.write(fold.push(event, float(i)))
    store.write(fold.flush())
    return store, fold


def test_a_close_ends_thinking_marks_open_calls_and_takes_no_seq():
    s = Script()
    s("run_start", agent_name="bot")
    s("tool_call", call_id="c1", tool="sh", arguments={"q": 1})
    s.think("pondering ", "more")
    store, fold = run_all([*s.events, close(3)])
    run = store.runs[("acme", "r1")]
    assert (run.status, run.ended_at) == ("abandoned", "2026-11-29T11:00:00.000000Z")
    assert store.steps[("acme", "r1", 0)].status == "abandoned"  # the open tool call
    thinking = store.steps[("acme", "r1", 1)]
    assert (thinking.kind, thinking.status) == ("thinking", "ok")
    assert store.deeps[("acme", "r1", 1)].reasoning == "pondering more"
    state = store.states[("acme", "r1")]
    # The stored last_seq moved (so the store takes the state), the agent seq did not.
    assert (state.last_seq, state.closes, state.open_calls) == (4, 1, {"tool:c1": 0})


def test_a_resumed_run_keeps_every_event_and_ordinal():
    s = Script()
    s("run_start", agent_name="bot")
    s("tool_call", call_id="c1", tool="sh", arguments={})
    s.think("a")
    before = list(s.events)
    s("tool_result", call_id="c1", output="late but kept")  # seq 3: the seq the close did not take
    s.think("b")
    s("run_end", status="completed")
    store, fold = run_all([*before, close(2), *s.events[3:]])
    run = store.runs[("acme", "r1")]
    assert run.status == "completed" and run.step_count == 3
    assert store.steps[("acme", "r1", 0)].status == "ok"  # the result completed its own ordinal
    assert store.deeps[("acme", "r1", 0)].output == "late but kept"  # a JSON value
    assert [store.steps[("acme", "r1", i)].kind for i in range(3)] == ["tool", "thinking", "thinking"]
    state = store.states[("acme", "r1")]
    assert (state.last_seq - state.closes, state.closes) == (5, 1)
    assert fold.stale == 0


def test_a_resumed_run_record_is_running_again():
    s = Script()
    s("run_start", agent_name="bot")
    fold = RunFold("acme", "r1")
    fold.push(s.events[0], 0.0)
    assert fold.push(close(0), 1.0).run.status == "abandoned"  # type: ignore[union-attr]
    out = fold.push(ev("state_change", 1, key="k", value=1, ts=T0), 2.0)  # an older ts: still a change
    assert out is not None and out.run is not None and (out.run.status, out.run.ended_at) == ("running", None)


def test_stale_and_repeated_closes_change_nothing():
    s = Script()
    s("run_start", agent_name="bot")
    s("state_change", key="k", value=1)
    fold = RunFold("acme", "r1")
    for i, e in enumerate(s.events):
        fold.push(e, float(i))
    assert fold.push(close(0), 5.0) is None  # the agent moved on since the compactor looked
    assert fold.push(close(1), 5.0) is not None
    assert fold.push(close(1), 6.0) is None  # a replayed close
    fold.push(ev("run_end", 2, status="completed"), 7.0)
    assert fold.push(close(2), 8.0) is None  # a finished run is never abandoned
    assert fold.stale == 3 and fold.state.closes == 1


def test_a_restored_fold_counts_agent_seqs_past_its_closes():
    s = Script()
    s("run_start", agent_name="bot")
    fold = RunFold("acme", "r1")
    fold.push(s.events[0], 0.0)
    state = fold.push(close(0), 1.0).state  # type: ignore[union-attr]
    restored = RunFold("acme", "r1", msgspec.json.decode(msgspec.json.encode(state), type=RunState))
    assert restored.push(ev("state_change", 0, key="k", value=1), 2.0) is None  # a duplicate stays one
    out = restored.push(ev("state_change", 1, key="k", value=1), 3.0)
    assert out is not None and out.state is not None and (out.state.last_seq, out.state.closes) == (2, 1)


@st.composite
def with_closes(draw):
    lim, scripts, deliveries = draw(scenarios())
    events = list(deliveries)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(events)))
        runs = sorted({e.run_id for e in events[:at]})
        if not runs:
            continue
        run = draw(st.sampled_from(runs))
        # What the compactor saw: the run's last applied agent seq (sometimes an older one).
        seen = max(e.seq for e in events[:at] if e.run_id == run and not isinstance(e, wire.RunClose))
        seq = seen if draw(st.booleans()) or seen == 0 else draw(st.integers(0, seen))
        event = close(seq, run, minutes=draw(st.integers(1, 90)))
        events[at:at] = [event] * draw(st.integers(1, 2))
    return lim, events


@PROPS
@given(with_closes(), st.data())
def test_closes_replay_to_the_same_rows_after_crashes_and_restarts(scenario, data):
    lim, events = scenario
    reference, _ = ingest(events, lim)
    n = len(events)
    positions = st.sets(st.integers(0, max(0, n - 1)), max_size=6)
    plan = {"crash": data.draw(positions), "idle": data.draw(positions), "commit": data.draw(positions)}
    assert worker(events, lim, plan, data.draw(st.booleans())).snapshot() == reference.snapshot()
    cut = data.draw(st.integers(0, n))
    again, _ = ingest(events[:cut] + events[: data.draw(st.integers(0, cut))] + events[cut:], lim)
    assert again.snapshot() == reference.snapshot()


@PROPS
@given(with_closes())
def test_closes_lose_no_agent_event(scenario):
    lim, events = scenario
    lim = msgspec.structs.replace(lim, max_steps=500)  # so a new thinking ordinal is never dropped
    with_, _ = ingest(events, lim)
    without, _ = ingest([e for e in events if not isinstance(e, wire.RunClose)], lim)
    for key, state in without.states.items():
        closed = with_.states[key]
        assert closed.last_seq - closed.closes == state.last_seq  # every agent event applied
        kinds = lambda store: sorted(  # noqa: E731
            s.kind for k, s in store.steps.items() if k[:2] == key and s.kind != "thinking"
        )
        assert kinds(with_) == kinds(without)
        texts = lambda store: "".join(  # noqa: E731
            d.reasoning or "" for k, d in sorted(store.deeps.items()) if k[:2] == key and d.kind == "thinking"
        )
        if not any(d.clipped for k, d in {**with_.deeps, **without.deeps}.items() if k[:2] == key):
            assert texts(with_) == texts(without)
        run, plain = with_.runs[key], without.runs[key]
        assert (run.input_tokens, run.last_event_at, run.agent_name) == (plain.input_tokens, plain.last_event_at, plain.agent_name)
        if run.status != "abandoned":
            assert run.status == plain.status
