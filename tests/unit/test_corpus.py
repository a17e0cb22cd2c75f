"""The shared corpus generator: deterministic, valid, realistic, and honest about
its secrets (masked on every step, all kept in the deep companions)."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest
from fold_support import fold_all
from stepstream.core import wire
from stepstream.emitter.corpus import CANARY, generate_events


@pytest.fixture(scope="module")
def corpus() -> list[wire.Event]:
    return generate_events(11, runs=120, companies=4)


def test_deterministic_and_seeded():
    assert generate_events(3, runs=10, companies=2) == generate_events(3, runs=10, companies=2)
    assert generate_events(3, runs=10, companies=2) != generate_events(4, runs=10, companies=2)


def test_valid_wire_events_in_per_run_order(corpus):
    last: dict[tuple[str, str], int] = {}
    for event in corpus:
        assert wire.decode_event(wire.encode_event(event)) == event
        key = (event.company_id, event.run_id)
        assert event.seq == last.get(key, -1) + 1
        last[key] = event.seq
    assert len(last) == 120 and len({k[0] for k in last}) == 4
    assert len({e.event_id for e in corpus}) == len(corpus)


def test_realistic_mix(corpus):
    kinds = Counter(type(e).__name__ for e in corpus)
    assert kinds["ThinkingDelta"] / len(corpus) > 0.7
    assert all(
        kinds[name] > 0
        for name in (
            "RunStart",
            "LlmRequest",
            "LlmResponse",
            "ToolCall",
            "ToolResult",
            "StateChange",
            "Error",
            "RunEnd",
        )
    )
    deltas = [e.payload.text for e in corpus if isinstance(e, wire.ThinkingDelta)]
    assert all(5 <= len(t) <= 80 for t in deltas)
    assert any(not t.isascii() for t in deltas) and any(any(ord(c) > 0xFFFF for c in t) for t in deltas)
    ends = [e for e in corpus if isinstance(e, wire.RunEnd)]
    assert 0 < len(ends) < 120 and any(e.payload.status == "failed" and e.payload.failure for e in ends)
    assert any(isinstance(e, wire.ToolResult) and e.payload.is_error for e in corpus)
    # Runs interleave: a run's events are not contiguous.
    first_runs = [e.run_id for e in corpus[:200]]
    assert len(set(first_runs)) > 5


def test_some_outputs_exceed_the_cap():
    events = generate_events(5, runs=60, companies=2, large_output_rate=0.05)
    big = [
        e
        for e in events
        if isinstance(e, wire.ToolResult) and isinstance(e.payload.output, str) and len(e.payload.output) > 65536
    ]
    assert big


def test_duplicates_and_redeliveries_are_copies_of_earlier_events():
    clean = generate_events(9, runs=10, companies=2)
    noisy = generate_events(9, runs=10, companies=2, duplicates=0.1, redeliveries=3)
    assert len(noisy) > len(clean)
    seen = set()
    for event in noisy:
        seen.add(event.event_id)
    assert seen == {e.event_id for e in clean}
    store_clean, _ = fold_all(clean)
    store_noisy, _ = fold_all(noisy)
    assert store_noisy.snapshot() == store_clean.snapshot()


def _planted(event: wire.Event) -> int:
    p = event.payload
    if isinstance(event, wire.ToolCall):
        return msgspec.json.encode(p.arguments).decode().count(CANARY)
    if isinstance(event, wire.StateChange):
        return msgspec.json.encode(p.value).decode().count(CANARY)
    if isinstance(event, wire.Error):
        return p.message.count(CANARY)
    return 0


def test_canaries_masked_on_steps_and_kept_in_deep(corpus):
    store, outs = fold_all(corpus)
    visible = msgspec.json.encode([[o.steps, o.run, o.state] for o in outs]).decode()
    assert CANARY not in visible
    planted = sum(_planted(e) for e in corpus)
    kept = sum(msgspec.json.encode([d.arguments, d.output]).decode().count(CANARY) for d in store.deeps.values())
    assert planted > 100 and kept == planted
    assert "[redacted]" in visible
