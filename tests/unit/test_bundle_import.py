"""Import (issue 13): bundles recorded by stepfork's own recorder verify here and
import as a new run; ours round-trip (export -> import -> export) to the same events."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from stepfork.recorder import record
from stepfork.trace.models import EventStatus
from stepfork.trace.validation import validate_bundle

from stepstream.bundle import verify_bundle
from stepstream.bundle.importer import ImportRefused, bundle_events
from stepstream.cli import main


def _recorded(tmp_path: Path) -> Path:
    out = tmp_path / "rec.sftrace"
    with record("ref-agent", output=out) as session:
        req = session.record_llm_request(model="gpt-x", provider="openai", input={"messages": ["hi ü"]})
        session.record_llm_response(req, {"text": "hello"}, prompt_tokens=3, completion_tokens=2)
        call = session.record_tool_call(name="search", input={"q": "w", "api_key": "sk-not-a-real-key"})
        session.record_tool_result(call, ["r1", 2.5], status=EventStatus.OK)
        session.record_state_change(key="cursor", before=None, after={"page": 1})
    return out


def test_a_stepfork_recording_verifies_and_imports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = _recorded(tmp_path)
    assert verify_bundle(bundle).status == "verified"
    events, status = bundle_events(bundle, "acme", "r-imp")
    assert status == "verified"
    types = [type(e).__struct_config__.tag for e in events]
    assert types == ["run_start", "llm_request", "llm_response", "tool_call", "tool_result", "state_change", "run_end"]
    assert events[2].payload.call_id == events[1].event_id and events[4].payload.call_id == events[3].event_id
    assert [e.seq for e in events] == list(range(len(events)))
    assert {e.run_id for e in events} == {"r-imp"}

    url = f"sqlite:///{tmp_path}/s.db"
    assert main(["import", str(bundle), "--company", "acme", "--run-id", "r-imp", "-o", str(tmp_path / "e.jsonl"),
                 "--ingest", "--steps-sink", url]) == 0  # fmt: skip
    assert main(["export", "--steps-sink", url, "--company", "acme", "--run", "r-imp", "-o", str(tmp_path)]) == 0
    again = tmp_path / "r-imp.sftrace"
    assert validate_bundle(again, strict=True, verify_integrity=True).valid
    ids = [json.loads(line)["id"] for line in (again / "events.jsonl").read_text().splitlines()]
    assert ids == [e.event_id for e in events]  # the recorder's own ids, in its order


def test_our_bundle_round_trips(tmp_path: Path) -> None:
    bundle = _recorded(tmp_path)
    url = f"sqlite:///{tmp_path}/s.db"
    main(["import", str(bundle), "--company", "acme", "--run-id", "one", "-o", str(tmp_path / "1.jsonl"),
          "--ingest", "--steps-sink", url])  # fmt: skip
    main(["export", "--steps-sink", url, "--company", "acme", "--run", "one", "-o", str(tmp_path)])
    first = [json.loads(line) for line in (tmp_path / "one.sftrace" / "events.jsonl").read_text().splitlines()]
    main(["import", str(tmp_path / "one.sftrace"), "--company", "acme", "--run-id", "two",
          "-o", str(tmp_path / "2.jsonl"), "--ingest", "--steps-sink", url])  # fmt: skip
    main(["export", "--steps-sink", url, "--company", "acme", "--run", "two", "-o", str(tmp_path)])
    second = [json.loads(line) for line in (tmp_path / "two.sftrace" / "events.jsonl").read_text().splitlines()]
    strip = lambda events: [{k: v for k, v in e.items() if k != "run_id"} for e in events]  # noqa: E731
    assert strip(first) == strip(second)


def test_a_tampered_bundle_is_refused(tmp_path: Path) -> None:
    bundle = _recorded(tmp_path)
    data = bytearray((bundle / "events.jsonl").read_bytes())
    data[10] ^= 1
    (bundle / "events.jsonl").write_bytes(bytes(data))
    with pytest.raises(ImportRefused, match="mismatch"):
        bundle_events(bundle, "acme")
    assert main(["import", str(bundle), "--company", "acme", "-o", str(tmp_path / "x.jsonl")]) == 3
