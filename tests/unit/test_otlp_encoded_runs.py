"""The bridge's bytes: each event encoded once (``trace.encoded_runs``, ``wire.renumbered``)
is byte for byte what encoding the numbered events of ``runs_of`` gives."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepstream.core import wire
from stepstream.otlp.decode import decode_request
from stepstream.otlp.identity import IdentityPolicy
from stepstream.otlp.trace import encoded_runs, map_spans, runs_of

FIXTURES = Path(__file__).parent / "otlp_fixtures"
POLICY = IdentityPolicy(default_company="acme")


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.iterdir() if p.suffix in (".pb", ".json")))
@pytest.mark.parametrize("max_event_bytes", [None, 600])
def test_encoded_runs_are_the_encoded_numbered_events(name, max_event_bytes):
    mapped = map_spans(decode_request((FIXTURES / name).read_bytes()).spans, None, POLICY, max_event_bytes)
    expected = {key: [wire.encode_event(event) for event in run] for key, run in runs_of(mapped.events).items()}
    assert encoded_runs(mapped) == expected and expected


@given(text=st.text(), seq=st.integers(min_value=0, max_value=2**53))
def test_renumbered_is_the_event_encoded_with_that_seq(text, seq):
    # The payload may hold the very bytes renumbered looks for: only the envelope's count.
    event = wire.Error(
        v=1, event_id="e-1", company_id="acme", run_id="run-1", seq=0, ts=datetime(2025, 1, 1, tzinfo=timezone.utc),
        payload=wire.ErrorPayload(message=',"seq":0,"ts":' + text, kind="x"),
    )  # fmt: skip
    assert wire.renumbered(wire.encode_event(event), seq) == wire.encode_event(msgspec.structs.replace(event, seq=seq))


def test_renumbered_refuses_bytes_without_a_zero_seq():
    with pytest.raises(ValueError):
        wire.renumbered(b'{"seq":1}', 2)
