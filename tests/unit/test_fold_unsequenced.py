"""Unsequenced events (ids ``otlp:...``, made from spans): numbered on arrival, a
redelivery skipped by id, across restarts from any durable snapshot."""

from __future__ import annotations

from pathlib import Path

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from fold_support import Store, fold_all, restart_from_every_snapshot
from stepstream.core import wire
from stepstream.core.fold import Limits, RunFold
from stepstream.core.records import RunState
from stepstream.otlp.decode import decode_request
from stepstream.otlp.identity import IdentityPolicy
from stepstream.otlp.trace import map_spans, runs_of

FIXTURES = Path(__file__).parent / "otlp_fixtures"
POLICY = IdentityPolicy(default_company="acme")


def _messages() -> list[list[wire.Event]]:
    """Each span of the three fixtures as its own message, mapped as the OTLP stage maps
    a message (one run per trace, numbered within the message)."""
    messages = []
    for family in ("genai", "openinference", "traceloop"):
        for span in decode_request((FIXTURES / f"{family}.pb").read_bytes()).spans:
            for events in runs_of(map_spans([span], None, POLICY).events).values():
                messages.append(events)
    return messages


MESSAGES = _messages()


def test_numbered_on_arrival_and_redelivery_skipped():
    events = [e for message in MESSAGES for e in message]
    once, _ = fold_all(events)
    twice, _ = fold_all(events + events[::-1] + events)
    assert twice.snapshot() == once.snapshot()
    state = next(iter(once.states.values()))
    assert state.last_seq == sum(1 for e in events if e.run_id == state.run_id) - 1
    assert len(state.applied_ids) == state.last_seq + 1


def test_a_restored_state_still_skips_what_was_applied():
    events = [e for message in MESSAGES for e in message if e.run_id == MESSAGES[0][0].run_id]
    fold = RunFold("acme", events[0].run_id)
    for e in events:
        fold.push(e, 0.0)
    state = msgspec.json.decode(msgspec.json.encode(fold.state), type=RunState)
    again = RunFold("acme", events[0].run_id, state)
    assert all(again.push(e, 0.0) is None for e in events)


def test_the_remembered_ids_are_bounded():
    limits = Limits(applied_ids=3)
    fold = RunFold("acme", "r")
    fold = RunFold("acme", "r", limits=limits)
    ts = wire.datetime(2026, 1, 1, tzinfo=__import__("datetime").timezone.utc)
    errors = [
        wire.Error(v=1, event_id=f"otlp:t:s{i}:error", company_id="acme", run_id="r", seq=0, ts=ts,
                   payload=wire.ErrorPayload(message="m"))  # fmt: skip
        for i in range(5)
    ]
    for e in errors:
        assert fold.push(e, 0.0) is not None
    assert len(fold.state.applied_ids) == 3
    assert fold.push(errors[-1], 0.0) is None  # remembered
    assert fold.push(errors[0], 0.0) is not None  # forgotten: applied again


@settings(max_examples=40, deadline=None)
@given(
    order=st.permutations(range(len(MESSAGES))),
    again=st.lists(st.tuples(st.integers(0, len(MESSAGES) - 1), st.integers(0, len(MESSAGES))), max_size=6),
)
def test_redelivered_messages_anywhere_change_no_row(order, again):
    """A message re-sent at any later point (a Collector retry, a bridge re-run after a
    crash) leaves the rows of the arrival order without it, and a restart from any
    durable snapshot converges to them."""
    deliveries = [MESSAGES[i] for i in order]
    reference, outs = fold_all([e for m in deliveries for e in m])
    with_again = list(deliveries)
    for index, at in sorted(again, key=lambda pair: pair[1], reverse=True):
        position = min(at, len(with_again))
        if MESSAGES[index] in with_again[:position]:  # a redelivery comes after the original
            with_again.insert(position, MESSAGES[index])
    events = [e for m in with_again for e in m]
    store, outs = fold_all(events)
    assert store.snapshot()[:3] == reference.snapshot()[:3]  # steps, deeps, runs
    restart_from_every_snapshot(events, Limits(), store, outs)


def test_a_held_delta_is_not_in_the_clean_state():
    ts = wire.datetime(2026, 1, 1, tzinfo=__import__("datetime").timezone.utc)
    delta = wire.ThinkingDelta(v=1, event_id="otlp:t:s:reasoning", company_id="acme", run_id="r", seq=0, ts=ts,
                               payload=wire.ThinkingDeltaPayload(text="hmm"))  # fmt: skip
    fold = RunFold("acme", "r", lazy=True)
    fold.push(delta, 0.0)
    assert fold.pending
    assert fold.durable_state().applied_ids == ()  # a crash now replays the delta
    assert wire.id_hash(delta.event_id) in fold.flush().state.durable_state().applied_ids
