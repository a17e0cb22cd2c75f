"""Replay (issue 13): a run against its own recording shows no divergence; each kind
of change is reported at the right position; hashless recordings never verify."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from fold_support import Script, fold_all

from stepstream.bundle import build_bundle
from stepstream.bundle.export import write_bundle
from stepstream.bundle.replay import live_calls, recorded_calls, replay
from stepstream.cli import main
from stepstream.core import wire


def _events() -> list[wire.Event]:
    s = Script()
    s("run_start", agent_name="a")
    s("llm_request", call_id="l1", provider="openai", model="gpt-4o", input={"messages": ["plan"], "api_key": "sk-x"})
    s("llm_response", call_id="l1", output="ok")
    s("tool_call", call_id="t1", tool="search", arguments={"q": "weather", "big": "z" * 40_000})
    s("tool_result", call_id="t1", output="sunny")
    s("tool_call", call_id="t2", tool="fetch", arguments={"url": "https://example.com"})
    s("tool_result", call_id="t2", output="<html>")
    s("llm_request", call_id="l2", provider="openai", model="gpt-4o", input={"messages": ["answer"]})
    s("llm_response", call_id="l2", output="done")
    s("run_end", status="completed")
    return [wire.decode_event(wire.encode_event(e)) for e in s.events]


@pytest.fixture
def recording(tmp_path: Path) -> Path:
    store, _ = fold_all(_events())
    [run] = store.runs.values()
    bundle = build_bundle(run, list(store.deeps.values()), company_id="acme", step_seqs=None)
    return write_bundle(bundle, tmp_path / "rec.sftrace")


def _changed(index: int, **changes) -> list[wire.Event]:
    events = _events()
    e = events[index]
    payload = msgspec.structs.replace(e.payload, **changes)
    events[index] = msgspec.structs.replace(e, payload=payload)
    return events


def test_same_run_has_no_divergence(recording: Path) -> None:
    report = replay(recorded_calls(recording), live_calls(_events()))
    assert (report.status, report.calls, report.divergence) == ("verified", 4, None)


@pytest.mark.parametrize(
    ("index", "changes", "position", "field"),
    [
        (3, {"tool": "lookup"}, 1, "tool"),
        (1, {"model": "gpt-5"}, 0, "model"),
        (7, {"provider": "anthropic"}, 3, "provider"),
        (7, {"input": {"messages": ["other answer"]}}, 3, "input"),
        (5, {"arguments": {"url": "https://example.org"}}, 2, "input"),
    ],
)
def test_each_change_is_reported_at_its_position(recording: Path, index, changes, position, field) -> None:
    report = replay(recorded_calls(recording), live_calls(_changed(index, **changes)))
    assert report.status == "diverged"
    assert (report.divergence.position, report.divergence.field) == (position, field)


def test_order_and_missing_calls(recording: Path) -> None:
    events = _events()
    swapped = [*events[:3], *events[5:7], *events[3:5], *events[7:]]
    for seq, e in enumerate(swapped):
        swapped[seq] = msgspec.structs.replace(e, seq=seq)
    report = replay(recorded_calls(recording), live_calls(swapped))
    assert (report.divergence.position, report.divergence.field) == (1, "tool")
    report = replay(recorded_calls(recording), live_calls(events[:7]))
    assert (report.divergence.position, report.divergence.field) == (3, "missing")


def test_hashless_recording_is_never_verified(recording: Path, tmp_path: Path, capsys) -> None:
    path = recording / "events.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for e in lines:
        e.pop("input_hash", None)
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    (recording / "integrity.json").unlink()
    report = replay(recorded_calls(recording), live_calls(_events()))
    assert (report.status, report.computed) == ("match_unverified", [0, 1, 2, 3])
    live = tmp_path / "live.jsonl"
    live.write_bytes(b"".join(wire.encode_event(e) + b"\n" for e in _events()))
    assert main(["replay", str(recording), "--against", str(live)]) == 0
    assert "match_unverified" in capsys.readouterr().out
    live.write_bytes(b"".join(wire.encode_event(e) + b"\n" for e in _changed(1, model="m2")))
    assert main(["replay", str(recording), "--against", str(live)]) == 1
    assert "diverged at call 0: model" in capsys.readouterr().out
