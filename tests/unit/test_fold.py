"""The step engine, rule by rule (CONTRACT.md section 2, seeds/deep-trace.md)."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone

import msgspec
import pytest
from fold_support import T0, Script, Store, ev, fold_all, records_json
from stepstream.core.caps import CLIP_MARKER
from stepstream.core.fold import Limits, Output, RunFold
from stepstream.core.records import Failure
from stepstream.core.records import RunRecord, RunState
from stepstream.errors import WireError


def push_all(fold: RunFold, events, now: float = 0.0) -> list[Output]:
    return [out for out in (fold.push(e, now) for e in events) if out is not None]


def test_limits_defaults_are_the_contract():
    lim = Limits()
    assert (lim.reasoning_chars, lim.output_chars, lim.arguments_chars) == (65536, 65536, 32768)
    assert (lim.max_steps, lim.flush_bytes, lim.idle_seconds) == (500, 2048, 5.0)
    assert (lim.flush_deltas, lim.max_seq_jump) == (512, 1_000_000)


# -- thinking fold -------------------------------------------------------------


def test_consecutive_deltas_fold_to_one_step_and_buffer_without_state():
    s = Script()
    s("run_start", agent_name="bot")
    s.think("Let me ", "think ", "about it.")
    fold = RunFold("acme", "r1")
    start = fold.push(s.events[0], 0.0)
    assert start is not None and start.state is not None and start.run is not None
    for e in s.events[1:]:
        out = fold.push(e, 0.0)
        # Buffered: an Output (not None: the event was applied) with nothing to write yet.
        assert out == Output() and out.state is None
    assert fold.pending
    assert fold.state.thinking_ordinal == 0 and fold.state.thinking_chars == 0


def test_tool_call_closing_thinking_yields_reasoning_then_tool_step():
    s = Script()
    s.think("I should ", "look it up.")
    call = s("tool_call", call_id="c1", tool="search", arguments={"q": "x"})
    fold = RunFold("acme", "r1")
    push_all(fold, s.events[:-1])
    out = fold.push(call, 1.0)
    assert [(r.step_seq, r.kind) for r in out.steps] == [(0, "thinking"), (1, "tool")]
    assert [(r.step_seq, r.kind) for r in out.deeps] == [(0, "thinking"), (1, "tool")]
    thinking, tool = out.steps
    assert thinking.status == "ok" and thinking.label == "reasoning" and thinking.output_shape == "20 characters"
    assert thinking.ended_at == "2026-11-29T10:00:00.001000Z"  # the last delta, not the call
    assert out.deeps[0].reasoning == "I should look it up." and out.deeps[0].reasoning_offset == 0
    assert tool.status == "running" and tool.label == "search" and tool.arguments == {"q": "x"}
    assert out.flushes == ["close"]
    assert out.state is not None and out.state.thinking_ordinal is None and out.state.open_calls == {"tool:c1": 1}


def test_unmatched_result_closes_thinking_and_is_a_step_of_its_own():
    s = Script()
    s.think("hmm")
    s("tool_result", call_id="ghost", output={"a": 1}, is_error=True)
    store, outs = fold_all(s.events)
    last = outs[-1]
    assert [r.kind for r in last.steps] == ["thinking", "tool"]
    assert store.deeps[("acme", "r1", 0)].reasoning == "hmm"
    step = store.steps[("acme", "r1", 1)]
    assert (step.label, step.status, step.call_id, step.output_shape) == (
        "unmatched result",
        "error",
        "ghost",
        "1 field",
    )
    assert step.started_at == step.ended_at is not None


def test_run_end_flushes_and_closes_thinking():
    s = Script()
    s("run_start", agent_name="bot")
    s.think("final ", "words")
    s("run_end", status="completed")
    store, outs = fold_all(s.events, flush_end=False)
    end = outs[-1]
    assert end.flushes == ["close"] and end.state is not None
    assert store.steps[("acme", "r1", 0)].status == "ok"
    assert store.deeps[("acme", "r1", 0)].reasoning == "final words"
    run = store.runs[("acme", "r1")]
    assert run.status == "completed" and run.step_count == 1 and run.ended_at == "2026-11-29T10:00:00.003000Z"


def test_idle_flush_makes_tail_durable_but_keeps_the_step_open():
    s = Script()
    s.think("part one, ")
    s.think("part two")
    s("tool_call", call_id="c", tool="t", arguments={})
    fold = RunFold("acme", "r1", limits=Limits(idle_seconds=5.0))
    store = Store()
    store.write(fold.push(s.events[0], 10.0))
    assert fold.flush_idle(14.9) is None  # not idle long enough
    out = fold.flush_idle(15.0)
    assert out is not None and out.flushes == ["idle"] and out.state is not None
    assert out.state.thinking_ordinal == 0 and out.state.thinking_chars == 10 and out.state.last_seq == 0
    assert out.steps[0].status == "running" and out.steps[0].ended_at is None
    store.write(out)
    assert fold.flush_idle(100.0) is None and fold.flush() is None  # nothing pending
    store.write(fold.push(s.events[1], 16.0))  # continues the same ordinal
    closing = fold.push(s.events[2], 17.0)
    assert [r.step_seq for r in closing.steps] == [0, 1]
    assert closing.deeps[0].reasoning == "part two" and closing.deeps[0].reasoning_offset == 10
    store.write(closing)
    assert store.deeps[("acme", "r1", 0)].reasoning == "part one, part two"
    assert store.steps[("acme", "r1", 0)].status == "ok"
    # The same events without the idle flush give the same rows.
    reference, _ = fold_all(s.events)
    assert store.steps == reference.steps and store.deeps == reference.deeps


def test_forced_flush_keeps_the_step_open_too():
    s = Script()
    s.think("abc")
    s.think("def")
    fold = RunFold("acme", "r1")
    fold.push(s.events[0], 0.0)
    out = fold.flush()
    assert out is not None and out.flushes == ["close"] and out.steps[0].status == "running"
    fold.push(s.events[1], 0.0)
    out = fold.flush("close")
    assert out.steps[0].step_seq == 0 and out.deeps[0].reasoning == "def" and out.deeps[0].reasoning_offset == 3


def test_size_flush_reemits_under_the_same_ordinal_every_2048_bytes():
    s = Script()
    for _ in range(10):
        s.think("x" * 500)
    s("run_end", status="completed")
    store, outs = fold_all(s.events)
    sized = [o for o in outs if "size" in o.flushes]
    # 500, 1000, 1500, 2000, 2500 -> flush; again at 2500 pending -> flush
    assert len(sized) == 2
    assert [o.deeps[0].reasoning_offset for o in sized] == [0, 2500]
    assert all(o.steps[0].step_seq == 0 and o.steps[0].status == "running" for o in sized)
    assert sized[0].steps[0].output_shape == "2.5k characters" and sized[1].steps[0].output_shape == "5k characters"
    assert all(o.state is not None for o in sized)
    deep = store.deeps[("acme", "r1", 0)]
    assert deep.reasoning == "x" * 5000 and not deep.clipped
    assert store.steps[("acme", "r1", 0)].output_shape == "5k characters"


def test_size_flush_counts_utf8_bytes_not_characters():
    s = Script()
    s.think("é" * 1023)  # 2046 bytes
    s.think("😀")  # 4 more bytes: 2050 >= 2048
    fold = RunFold("acme", "r1")
    assert fold.push(s.events[0], 0.0).state is None
    out = fold.push(s.events[1], 0.0)
    assert out.flushes == ["size"] and out.deeps[0].reasoning == "é" * 1023 + "😀"
    assert out.steps[0].output_shape == "1k characters" and not fold.pending


def test_empty_delta_still_makes_a_step():
    s = Script()
    s.think("")
    store, _ = fold_all(s.events)
    assert store.steps[("acme", "r1", 0)].output_shape == "0 characters"
    assert store.deeps[("acme", "r1", 0)].reasoning == ""


def test_every_delta_counts_toward_the_size_flush():
    s = Script()
    s.think(*[""] * 1100)  # a trickle of empty deltas: 0 bytes, but 512 deltas flush like 2 KiB
    fold = RunFold("acme", "r1")
    outs = [fold.push(e, float(i)) for i, e in enumerate(s.events)]
    flushed = [i for i, o in enumerate(outs) if o.flushes]
    assert flushed == [511, 1023]
    assert all(outs[i].flushes == ["size"] and outs[i].state is not None for i in flushed)
    assert outs[1023].state.last_seq == 1023 and fold.pending  # 76 deltas pending again


def test_the_delta_count_and_the_byte_count_flush_whichever_comes_first():
    lim = Limits(flush_bytes=10, flush_deltas=3)
    s = Script()
    s.think("a", "b", "c", "0123456789", "d", "", "")
    store, outs = fold_all(s.events, lim, flush_end=False)
    flushed = [o for o in outs if o.flushes]
    assert [o.deeps[0].reasoning for o in flushed] == ["abc", "0123456789", "d"]
    assert [o.flushes for o in flushed] == [["size"]] * 3 and outs.index(flushed[1]) == 3
    # Only the events decide (test_fold_properties folds with small flush_deltas too,
    # through crashes, restarts and idle flushes).
    again, outs_again = fold_all(s.events, lim, flush_end=False)
    assert again.snapshot() == store.snapshot() and outs_again == outs


# -- rejected events --------------------------------------------------------------


def fingerprint(fold: RunFold) -> dict:
    """Everything a fold holds, copied (``fold.state`` omits the pending tail)."""
    return {name: copy.deepcopy(getattr(fold, name)) for name in RunFold.__slots__}


def busy_fold(limits: Limits = Limits()) -> RunFold:
    """A fold with a run record, an open call and a pending thinking tail."""
    s = Script()
    s("run_start", agent_name="bot")
    s("tool_call", call_id="c", tool="t", arguments={})
    s.think("pending ")
    fold = RunFold("acme", "r1", limits=limits)
    push_all(fold, s.events)
    assert fold.pending and fold.state.open_calls
    return fold


def test_a_seq_jump_is_rejected_before_anything_changes():
    fold = busy_fold(Limits(max_seq_jump=100))
    before = fingerprint(fold)
    with pytest.raises(WireError) as info:
        fold.push(ev("thinking_delta", 2 + 101, text="x"), 1.0)
    assert info.value.reason == "seq_jump" and "102" not in str(info.value)
    with pytest.raises(WireError):
        fold.push(ev("tool_result", 2**53 - 1, ts=T0, call_id="c", output=1), 1.0)
    assert fingerprint(fold) == before
    # The next events of the run still apply; a jump of exactly the limit is a gap.
    out = fold.push(ev("tool_result", 2 + 100, call_id="c", output=1), 1.0)
    assert out is not None and out.run.seq_gaps == 1 and out.state.last_seq == 102


def test_the_first_event_of_a_run_may_not_jump_either():
    fold = RunFold("acme", "r1")
    before = fingerprint(fold)
    with pytest.raises(WireError, match="seq_jump"):
        fold.push(ev("run_start", 1_000_000, agent_name="bot"), 0.0)  # last applied is -1
    assert fingerprint(fold) == before
    assert fold.push(ev("run_start", 999_999, agent_name="bot"), 0.0).state.last_seq == 999_999


@pytest.mark.parametrize(
    "ts",
    [
        datetime(1, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1))),
        datetime(9999, 12, 31, 23, 30, tzinfo=timezone(timedelta(hours=-1))),
        datetime(1969, 12, 31, 23, 59, 59, tzinfo=timezone.utc),
        datetime(9999, 12, 30, 0, 0, 1),  # naive: taken as UTC
    ],
)
def test_a_time_outside_the_window_is_rejected_before_anything_changes(ts):
    # decode_event rejects these already; events built in Python get the same answer.
    for event in (ev("thinking_delta", 3, ts=ts, text="x"), ev("tool_result", 3, ts=ts, call_id="c", output=1)):
        fold = busy_fold()
        before = fingerprint(fold)
        with pytest.raises(WireError) as info:
            fold.push(event, 1.0)
        assert info.value.reason == "out_of_range"
        assert fingerprint(fold) == before
        assert fold.flush() is not None  # and the fold still works


def test_token_totals_saturate_below_2_63():
    near = RunRecord(company_id="acme", run_id="r1", input_tokens=2**63 - 10, output_tokens=5)
    fold = RunFold("acme", "r1", RunState(company_id="acme", run_id="r1", run=near))
    out = fold.push(ev("llm_response", 0, call_id="l", output=1, usage=dict_usage(10**12, 10**12, 10**12)), 0.0)
    assert (out.run.input_tokens, out.run.output_tokens, out.run.reasoning_tokens) == (2**63 - 1, 10**12 + 5, 10**12)
    out = fold.push(ev("llm_response", 1, call_id="l", output=1, usage=dict_usage(10**12, 0, 0)), 0.0)
    assert out.run.input_tokens == 2**63 - 1


# -- caps ----------------------------------------------------------------------


def test_reasoning_cap_clips_with_marker_and_sticky_flag():
    lim = Limits(reasoning_chars=100, flush_bytes=30)
    s = Script()
    for i in range(20):
        s.think(f"{i:02d}-abcdefgh")  # 11 chars each
    s("run_end", status="completed")
    store, outs = fold_all(s.events, lim)
    deep = store.deeps[("acme", "r1", 0)]
    full = "".join(f"{i:02d}-abcdefgh" for i in range(20))
    assert deep.reasoning == full[: 100 - len(CLIP_MARKER)] + CLIP_MARKER and len(deep.reasoning) == 100
    assert deep.clipped
    assert sum(o.clipped.count("reasoning") for o in outs) == 1  # reported once, when it happens
    # After the clip, flushes carry no more text but still update the shape and ts.
    after = [d for o in outs for d in o.deeps if d.clipped and d.reasoning is None]
    assert after and all(d.reasoning is None for d in after)
    assert store.steps[("acme", "r1", 0)].output_shape == "220 characters"
    assert store.states[("acme", "r1")].thinking_ordinal is None


def test_clip_where_the_marker_starts_before_the_durable_text():
    lim = Limits(reasoning_chars=20, flush_bytes=1)  # every delta flushes
    s = Script()
    s.think("a" * 18, "bbbb")  # 18 durable, then 22 > 20: the marker starts at 20 - len(marker)
    store, outs = fold_all(s.events, lim)
    second = outs[1].deeps[0]
    assert second.reasoning == CLIP_MARKER and second.reasoning_offset == 20 - len(CLIP_MARKER)
    assert store.deeps[("acme", "r1", 0)].reasoning == "a" * (20 - len(CLIP_MARKER)) + CLIP_MARKER


def test_output_and_arguments_caps():
    lim = Limits(output_chars=50, arguments_chars=40)
    s = Script()
    s("tool_call", call_id="c", tool="t", arguments={"blob": "y" * 100})
    s("tool_result", call_id="c", output="z" * 100)
    store, outs = fold_all(s.events, lim)
    deep = store.deeps[("acme", "r1", 0)]
    # A structured value is counted (and clipped) as its compact JSON text, a string
    # output as its characters; a clipped body is a string ending with the marker.
    assert len(deep.arguments) == 40 and deep.arguments.startswith('{"blob":"yyy') and deep.arguments.endswith(CLIP_MARKER)
    assert len(deep.output) == 50 and deep.output == "z" * (50 - len(CLIP_MARKER)) + CLIP_MARKER
    assert deep.clipped
    assert outs[0].clipped == ["arguments"] and outs[1].clipped == ["output"]
    assert store.steps[("acme", "r1", 0)].output_shape == "100 characters"


# -- tool, llm, state, error steps ----------------------------------------------------


def test_tool_result_completes_its_call_field_by_field():
    s = Script()
    s("tool_call", call_id="c1", tool="http.get", arguments={"url": "u", "api_key": "k"})
    s("tool_result", call_id="c1", output=[1, 2, 3])
    fold = RunFold("acme", "r1")
    call, result = push_all(fold, s.events)
    step = result.steps[0]
    assert step.step_seq == 0 and step.status == "ok" and step.output_shape == "3 items"
    assert step.label is None and step.arguments is None and step.started_at is None  # kept by the store
    assert result.deeps[0].arguments is None and result.deeps[0].output == [1, 2, 3]
    assert call.deeps[0].arguments == {"url": "u", "api_key": "k"}
    assert call.steps[0].arguments == {"url": "u", "api_key": "[redacted]"}
    assert call.steps[0].input_shape == "2 fields"
    assert result.state.open_calls == {}
    store = Store()
    store.write(call)
    store.write(result)
    row = store.steps[("acme", "r1", 0)]
    assert (row.label, row.status, row.arguments["api_key"]) == ("http.get", "ok", "[redacted]")
    assert row.started_at < row.ended_at


def test_tool_error_result():
    s = Script()
    s("tool_call", call_id="c", tool="t", arguments={})
    s("tool_result", call_id="c", output="boom", is_error=True)
    store, _ = fold_all(s.events)
    assert store.steps[("acme", "r1", 0)].status == "error"


def test_llm_step_and_token_totals():
    s = Script()
    s("llm_request", call_id="l1", provider="openai", model="gpt-4.1", input=[{"role": "user", "content": "hi"}],
      params={"temperature": 0.1, "apiKey": "sk-zzz"})  # fmt: skip
    s("llm_response", call_id="l1", output={"content": "hello"}, usage=dict_usage(10, 5, 2))
    s("llm_response", call_id="nope", output="x", usage=dict_usage(1, 1, 1))  # unmatched still counts tokens
    store, outs = fold_all(s.events)
    step = store.steps[("acme", "r1", 0)]
    assert (step.kind, step.label, step.status, step.input_shape, step.output_shape) == (
        "llm",
        "openai/gpt-4.1",
        "ok",
        "1 item",
        "1 field",
    )
    assert step.arguments == {"temperature": 0.1, "apiKey": "[redacted]"}
    assert store.deeps[("acme", "r1", 0)].arguments == [{"role": "user", "content": "hi"}]
    assert store.deeps[("acme", "r1", 0)].output == {"content": "hello"}
    assert store.steps[("acme", "r1", 1)].label == "unmatched result"
    run = store.runs[("acme", "r1")]
    assert (run.input_tokens, run.output_tokens, run.reasoning_tokens) == (11, 6, 3)


def dict_usage(i: int, o: int, r: int):
    from stepstream.core.wire import Usage

    return Usage(input_tokens=i, output_tokens=o, reasoning_tokens=r)


def test_state_change_is_redacted_by_its_key():
    s = Script()
    s("state_change", key="session_token", value="abc")
    s("state_change", key="plan", value=["a", "b"])
    store, _ = fold_all(s.events)
    secret, plan = store.steps[("acme", "r1", 0)], store.steps[("acme", "r1", 1)]
    assert (secret.kind, secret.label, secret.arguments) == ("state", "session_token", {"session_token": "[redacted]"})
    assert plan.arguments == {"plan": ["a", "b"]} and plan.input_shape == "2 items" and plan.status == "ok"
    assert store.deeps[("acme", "r1", 0)].arguments == "abc"


def test_error_step_masks_credentials_in_the_message():
    s = Script()
    s("error", message="auth failed for Bearer abcdefghijkl123", kind="auth")
    s("error", message="plain")
    store, _ = fold_all(s.events)
    first, second = store.steps[("acme", "r1", 0)], store.steps[("acme", "r1", 1)]
    assert first.label == "auth" and first.status == "error"
    assert first.arguments == {"message": "auth failed for Bearer [redacted]"}
    assert second.label == "error"
    assert "abcdefghijkl123" in store.deeps[("acme", "r1", 0)].output


# -- run record --------------------------------------------------------------------


def test_run_record_fields():
    s = Script()
    s("run_start", agent_name="bot", environment="prod", metadata={"k": 1})
    s("tool_call", call_id="c", tool="t", arguments={})
    s("run_end", status="failed", failure="crashed with sk-abcdefghijklmnopqrstuvwx")
    store, _ = fold_all(s.events)
    run = store.runs[("acme", "r1")]
    assert (run.agent_name, run.environment, run.status) == ("bot", "prod", "failed")
    assert run.failure == Failure(type="unknown", message="crashed with [redacted]")
    assert run.started_at == "2026-11-29T10:00:00.000000Z" and run.ended_at == "2026-11-29T10:00:00.002000Z"
    assert run.last_event_at == run.ended_at and run.step_count == 1 and not run.truncated


def test_started_at_is_the_first_event_without_run_start_and_times_are_utc():
    plus2 = timezone(timedelta(hours=2))
    e = ev("tool_call", 0, ts=T0.astimezone(plus2), call_id="c", tool="t", arguments={})
    store, _ = fold_all([e])
    assert store.runs[("acme", "r1")].started_at == "2026-11-29T10:00:00.000000Z"
    assert store.steps[("acme", "r1", 0)].started_at == "2026-11-29T10:00:00.000000Z"


def test_run_is_emitted_only_when_changed():
    fold = RunFold("acme", "r1")
    e = ev("tool_call", 0, call_id="c", tool="t", arguments={})
    same_ts = ev("tool_result", 1, call_id="c", output=1, ts=e.ts)
    assert fold.push(e, 0).run is not None
    out = fold.push(same_ts, 0)
    assert out.run is None and out.state is not None  # nothing in the run record changed
    assert fold.push(ev("state_change", 2, key="k", value=1, ts=e.ts), 0).run.step_count == 2


# -- ordinals, truncation, idempotence -------------------------------------------------------


def test_truncation_keeps_steps_and_deeps_aligned():
    lim = Limits(max_steps=3)
    s = Script()
    s("run_start", agent_name="bot")
    s("tool_call", call_id="a", tool="t", arguments={})  # 0
    s.think("x", "y")  # 1
    s("tool_call", call_id="b", tool="t", arguments={})  # 2
    s("tool_call", call_id="c", tool="t", arguments={})  # dropped
    s.think("z", "w")  # dropped once
    s("tool_result", call_id="c", output=1)  # result of a dropped call: dropped too
    s("tool_result", call_id="a", output=1)  # completes ordinal 0
    s("state_change", key="k", value=1)  # dropped
    s("run_end", status="completed")
    store, outs = fold_all(s.events, lim)
    assert sorted(k[2] for k in store.steps) == [0, 1, 2] == sorted(k[2] for k in store.deeps)
    assert store.steps[("acme", "r1", 0)].status == "ok"
    run = store.runs[("acme", "r1")]
    assert run.truncated and run.dropped_steps == 3 and run.step_count == 3
    assert all(r.step_seq < 3 for o in outs for r in [*o.steps, *o.deeps])
    assert store.states[("acme", "r1")].thinking_ordinal is None


def test_the_default_ceiling_is_500_steps():
    s = Script()
    for i in range(300):
        s.think(f"thought {i}")
        s("state_change", key="i", value=i)
    store, _ = fold_all(s.events)
    assert sorted(k[2] for k in store.steps) == list(range(500)) == sorted(k[2] for k in store.deeps)
    run = store.runs[("acme", "r1")]
    assert run.truncated and run.step_count == 500 and run.dropped_steps == 100


def test_duplicates_change_nothing():
    s = Script()
    s("run_start", agent_name="bot")
    s.think("abc")
    s("tool_call", call_id="c", tool="t", arguments={})
    fold = RunFold("acme", "r1")
    push_all(fold, s.events)
    before = fold.state
    for e in s.events:
        assert fold.push(e, 99.0) is None
    assert fold.state == before and fold.stale == 3 and not fold.pending


def test_gap_is_applied_and_counted():
    fold = RunFold("acme", "r1")
    store = Store()
    for seq in (0, 1, 5, 6, 9):
        store.write(fold.push(ev("state_change", seq, key="k", value=seq), 0.0))
    late = fold.push(ev("state_change", 4, key="k", value=4), 0.0)  # fills the gap 2..4
    assert late.late and not late.seq_gap and late.steps[0].step_seq == 5
    store.write(late)
    assert fold.push(ev("state_change", 4, key="k", value=4), 0.0) is None  # now a duplicate
    assert fold.push(ev("state_change", 6, key="k", value=6), 0.0) is None
    run = store.runs[("acme", "r1")]
    assert run.seq_gaps == 2 and run.late_events == 1 and run.step_count == 6
    assert (fold.stale, fold.late) == (2, 1)
    assert fold.state.skipped_seqs == ((2, 3), (7, 8))
    first = RunFold("acme", "r2")
    out = first.push(ev("state_change", 3, run="r2", key="k", value=0), 0.0)
    assert out.run.seq_gaps == 1  # the run's first seen event is not seq 0


def test_event_of_another_run_is_rejected():
    fold = RunFold("acme", "r1")
    with pytest.raises(ValueError):
        fold.push(ev("state_change", 0, run="r2", key="k", value=1), 0.0)
    with pytest.raises(ValueError):
        RunFold("acme", "r1", RunState(company_id="acme", run_id="other"))


def test_restored_fold_continues_exactly():
    s = Script()
    s("run_start", agent_name="bot")
    s.think("one ", "two ")
    s("tool_call", call_id="c", tool="t", arguments={"a": 1})
    s.think("three")
    s("tool_result", call_id="c", output="r")
    s("run_end", status="completed")
    reference, outs = fold_all(s.events)
    durable = [o.state for o in outs if o.state is not None]
    assert len(durable) >= 4
    for snap in durable:
        store = Store()
        for o in outs:
            store.write(o)
            if o.state is snap:
                break
        fold = RunFold("acme", "r1", msgspec.json.decode(msgspec.json.encode(snap), type=RunState))
        for e in s.events:  # everything again: the applied ones are skipped
            store.write(fold.push(e, 0.0))
        store.write(fold.flush())
        assert store.snapshot() == reference.snapshot()


def test_state_holds_no_text_or_arguments():
    s = Script()
    s("tool_call", call_id="c", tool="t", arguments={"payload": "ARGCANARY"})
    s.think("THINKCANARY")
    fold = RunFold("acme", "r1")
    push_all(fold, s.events)
    text = msgspec.json.encode(fold.state).decode()
    assert "CANARY" not in text and fold.state.open_calls == {"tool:c": 0}


def test_steps_never_carry_thinking_text_or_raw_output():
    s = Script()
    s.think("THINKCANARY " * 300)
    s("tool_call", call_id="c", tool="t", arguments={})
    s("tool_result", call_id="c", output={"secret_sauce": "OUTCANARY"})
    s("llm_request", call_id="l", provider="p", model="m", input="INCANARY")
    s("llm_response", call_id="l", output="OUTCANARY")
    _, outs = fold_all(s.events)
    for o in outs:
        assert "CANARY" not in records_json(o)


def test_caps_count_what_a_reader_sees():
    """11,000 control characters are 11,000 characters (66,000 once JSON-escaped): a
    string is stored as the string, within the 65,536 cap, and unclipped."""
    s = Script()
    s("tool_call", call_id="c", tool="t", arguments={"k": "\x01" * 6000})
    s("tool_result", call_id="c", output="\x01" * 11_000)
    s("llm_request", call_id="l", provider="p", model="m", input="\n" * 30_000)
    store, outs = fold_all(s.events)
    tool, llm = store.deeps[("acme", "r1", 0)], store.deeps[("acme", "r1", 1)]
    assert tool.output == "\x01" * 11_000  # whole (the record is clipped for its arguments)
    # A structured value is measured by its compact JSON text: 6000 escapes of 6 characters.
    assert isinstance(tool.arguments, str) and tool.arguments.startswith('{"k":"\\u0001')
    assert len(tool.arguments) == 32_768 and outs[0].clipped == ["arguments"]
    assert llm.arguments == "\n" * 30_000 and not llm.clipped  # 60,000 once escaped, 30,000 as read


def test_clipped_bodies_are_valid_json_values():
    lim = Limits(output_chars=30, arguments_chars=30)
    s = Script()
    s("tool_call", call_id="c", tool="t", arguments={"a": list(range(50))})
    s("tool_result", call_id="c", output={"deep": {"er": "é" * 100}})
    store, _ = fold_all(s.events, lim)
    deep = store.deeps[("acme", "r1", 0)]
    for body in (deep.arguments, deep.output):
        assert isinstance(body, str) and len(body) == 30 and body.endswith(CLIP_MARKER)
        assert msgspec.json.decode(msgspec.json.encode(body)) == body
    assert deep.clipped
