"""The run environment (issue 19, item 8): written once, with its run_start, capped in
UTF-8 bytes of its compact JSON, and never in a fold's state."""

from __future__ import annotations

import msgspec
from fold_support import Script, ev, fold_all
from hypothesis import given
from hypothesis import strategies as st
from stepstream.core.caps import CLIP_MARKER, json_body_bytes
from stepstream.core.fold import Limits, RunFold
from stepstream.core.records import RunRecord, RunState

BIG = {f"var_{i:04d}": "x" * 250 for i in range(3400)}  # ~900 KB of compact JSON


def _size(value) -> int:
    return len(msgspec.json.encode(value))


def test_the_environment_rides_only_on_its_run_starts_record_and_never_in_a_state():
    fold = RunFold("acme", "r1")
    start = fold.push(ev("run_start", 0, agent_name="a", environment={"os": "linux"}), 0.0)
    assert start.run.environment == {"os": "linux"}
    assert start.state.run.environment is None and b"linux" not in msgspec.json.encode(start.state)
    later = fold.push(ev("state_change", 1, key="k", value=1), 0.0)
    assert later.run.environment is None and later.state.run.environment is None
    assert fold.state.run.environment is None


def test_an_environment_over_the_cap_is_clipped_in_bytes_and_counted():
    limits = Limits()
    fold = RunFold("acme", "r1")
    out = fold.push(ev("run_start", 0, agent_name="a", environment=BIG), 0.0)
    env = out.run.environment
    assert isinstance(env, str) and env.endswith(CLIP_MARKER)
    assert limits.environment_bytes - 8 < _size(env) <= limits.environment_bytes < _size(BIG)  # as stored
    assert env.startswith('{"var_0000":"xxx') and out.clipped == ["environment"]
    assert _size(out.state) < 1024


def test_an_environment_within_the_cap_stays_structured():
    limits = Limits(environment_bytes=39)
    env = {"python": "3.12", "os": "linux", "x": "é"}  # 39 bytes of compact JSON
    assert _size(env) == 39
    out = RunFold("acme", "r1", limits=limits).push(ev("run_start", 0, agent_name="a", environment=env), 0.0)
    assert out.run.environment == env and out.clipped == []
    out = RunFold("acme", "r1", limits=Limits(environment_bytes=38)).push(
        ev("run_start", 0, agent_name="a", environment=env), 0.0
    )
    assert out.run.environment == '{"python":"3.12","o…[clipped]'  # 38 bytes as JSON: quotes escaped
    assert out.clipped == ["environment"]
    assert json_body_bytes(env, 13) == ("", True)  # not even the marker fits


def test_a_state_stored_with_an_environment_by_the_previous_version_loads_and_drops_it():
    old = RunState(company_id="acme", run_id="r1", last_seq=0, next_ordinal=0,
                   run=RunRecord(company_id="acme", run_id="r1", agent_name="a", environment=BIG))  # fmt: skip
    stored = msgspec.json.decode(msgspec.json.encode(old), type=RunState)
    fold = RunFold("acme", "r1", stored)
    out = fold.push(ev("state_change", 1, key="k", value=1), 0.0)
    assert out.run.agent_name == "a" and out.run.environment is None  # the store keeps its own
    assert _size(out.state) < 1024


def test_a_replayed_run_start_writes_nothing():
    fold = RunFold("acme", "r1")
    fold.push(ev("run_start", 0, agent_name="a", environment=BIG), 0.0)
    restored = RunFold("acme", "r1", msgspec.json.decode(msgspec.json.encode(fold.state), type=RunState))
    assert restored.push(ev("run_start", 0, agent_name="a", environment=BIG), 0.0) is None


def test_a_late_run_start_under_an_open_tail_writes_its_environment_with_the_flush():
    fold = RunFold("acme", "r1", lazy=True)
    fold.push(ev("state_change", 1, key="k", value=1), 0.0)
    fold.push(ev("thinking_delta", 2, text="hmm"), 0.0)  # a pending tail
    late = fold.push(ev("run_start", 0, agent_name="a", environment={"os": "linux"}), 0.0)
    assert late.late and late.state is None and late.run is None
    flushed = fold.flush("idle")
    assert type(flushed.run) is RunRecord and flushed.run.environment == {"os": "linux"}
    assert fold.durable_state().run.environment is None


def test_a_second_run_start_replaces_the_environment_and_one_without_keeps_it():
    s = Script()
    s("run_start", agent_name="a", environment={"os": "linux"})
    s("state_change", key="k", value=1)
    s("run_start", agent_name="b")
    store, _ = fold_all(s.events)
    assert store.runs[("acme", "r1")].environment == {"os": "linux"}
    s("run_start", agent_name="c", environment="prod")
    store, _ = fold_all(s.events)
    assert store.runs[("acme", "r1")].environment == "prod"


@given(value=st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                          lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=20),
       cap=st.integers(14, 200))  # fmt: skip  (the marker as JSON is 14 bytes)
def test_json_body_bytes_is_the_value_or_its_clipped_text(value, cap):
    body, cut = json_body_bytes(value, cap)
    text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
    if cut:
        assert _size(body) <= cap < _size(value)
        assert isinstance(body, str) and body.endswith(CLIP_MARKER) and text.startswith(body[: -len(CLIP_MARKER)])
        longer = text[: len(body) - len(CLIP_MARKER) + 1] + CLIP_MARKER
        assert _size(longer) > cap or longer == body  # the longest head that fits
        assert json_body_bytes(body, cap) == (body, False)  # idempotent
    else:
        assert body == value and _size(value) <= cap
