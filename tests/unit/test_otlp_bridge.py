"""The OTLP stage's policies, with the producer and the dead-letter topic as recorders:
events produced per run in order, one dead-letter copy per reason, a produce that is not
acknowledged stops the worker (BridgeFailed), settings from the environment."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from stepstream.config import load_settings
from stepstream.core.wire import decode_event
from stepstream.ingest.otlp_bridge import BridgeFailed, OtlpBridge
from stepstream.otlp.identity import IdentityPolicy
from stepstream.pipeline import StoreFailed

FIXTURES = Path(__file__).parent / "otlp_fixtures"


class _Refusing:
    async def produce(self, runs):
        raise RuntimeError("the producer is closed")


def _record(value: bytes, headers=(), offset: int = 0):
    return SimpleNamespace(topic="otlp", partition=0, offset=offset, key=None, value=value, headers=list(headers))


class _Recorder:
    def __init__(self, acknowledge: bool = True) -> None:
        self.produced: list[tuple[bytes, bytes]] = []
        self.letters: list[tuple[int, str, str]] = []
        self.counts: dict[str, int] = {}
        self.acknowledge = acknowledge

    async def produce(self, runs: list[tuple[bytes, list[bytes]]]):
        futures = []
        for key, values in runs:
            for value in values:
                self.produced.append((key, value))
                future = asyncio.get_running_loop().create_future()
                if self.acknowledge:
                    future.set_result(None)
                futures.append(future)
        return futures

    async def dead_letter(self, record, reason: str, detail: str) -> None:
        self.letters.append((record.offset, reason, detail))

    def bridge(self, policy=IdentityPolicy(default_company="acme"), budget: float = 5.0) -> OtlpBridge:
        return OtlpBridge(
            "otlp", policy, self.produce, self.dead_letter, budget_seconds=budget, max_message_bytes=200_000,
            max_event_bytes=1_048_576, counted=lambda what, n: self.counts.__setitem__(what, self.counts.get(what, 0) + n),
        )  # fmt: skip


async def test_events_are_produced_per_run_keyed_and_in_order():
    recorder = _Recorder()
    data = (FIXTURES / "genai.pb").read_bytes()
    await recorder.bridge().handle([_record(data, [("stepstream-company", b"globex")])])
    keys = {key for key, _ in recorder.produced}
    (key,) = keys
    assert key.startswith(b"globex/") and len(key) == len(b"globex/") + 32
    events = [decode_event(value) for _, value in recorder.produced]
    assert [e.seq for e in events] == list(range(len(events)))
    assert all(e.event_id.startswith("otlp:") for e in events)
    assert recorder.counts == {"spans": 5, "events": len(events)} and not recorder.letters


async def test_one_dead_letter_per_reason_and_the_good_spans_go_on():
    recorder = _Recorder()
    spans = [
        {"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174", "name": "root"},
        {"traceId": "", "spanId": "eee19b7ec3c1b175"},
        {"traceId": "5b8efff798038103d269b633813fc60c", "spanId": ""},
    ]
    request = {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}
    records = [_record(json.dumps(request).encode(), offset=1), _record(b"\x0a\xff\xff", offset=2), _record(b"{" * 300_000, offset=3)]
    await recorder.bridge().handle(records)
    assert [(offset, reason) for offset, reason, _ in recorder.letters] == [(1, "no_trace_id"), (2, "bad_otlp"), (3, "oversize")]
    assert "2 span(s)" in recorder.letters[0][2]
    assert [decode_event(v).payload.__class__.__name__ for _, v in recorder.produced] == ["RunStartPayload", "RunEndPayload"]


async def test_no_company_is_a_dead_letter_not_a_guess():
    recorder = _Recorder()
    await recorder.bridge(IdentityPolicy()).handle([_record((FIXTURES / "traceloop.json").read_bytes())])
    assert [reason for _, reason, _ in recorder.letters] == ["no_company"] and not recorder.produced


async def test_an_unacknowledged_produce_stops_the_worker():
    recorder = _Recorder(acknowledge=False)
    with pytest.raises(BridgeFailed) as info:
        await recorder.bridge(budget=0.2).handle([_record((FIXTURES / "openinference.pb").read_bytes())])
    assert isinstance(info.value, StoreFailed)  # the worker's exit-70 path


async def test_a_refused_produce_stops_the_worker():
    recorder = _Recorder()
    bridge = recorder.bridge()
    bridge._produce = _Refusing().produce
    with pytest.raises(BridgeFailed, match="not sent"):
        await bridge.handle([_record((FIXTURES / "genai.pb").read_bytes())])


def test_settings_from_the_environment():
    settings = load_settings(environ={
        "STEPSTREAM_OTLP_TOPIC": "stepstream.otlp", "STEPSTREAM_OTLP_COMPANY": "acme",
        "STEPSTREAM_OTLP_TRUST_RESOURCE_COMPANY": "true",
    })  # fmt: skip
    assert (settings.otlp_topic, settings.otlp_company, settings.otlp_trust_resource_company) == ("stepstream.otlp", "acme", True)
    assert load_settings(environ={}).otlp_topic == ""  # off unless set
