"""``stepstream export`` and ``verify`` end to end: ingest-file into SQLite and into a
file store (the envelopes go through a real backend), export, the reference
validates, ``verify`` exit codes; pruned runs refused."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from stepfork.trace.storage import load_trace
from stepfork.trace.validation import validate_bundle

from stepstream.cli import main
from stepstream.core import wire
from stepstream.emitter.corpus import generate_events
from stepstream.sinks.factory import open_step_store

CANARY = "CANARY-7c1e-sup3r-secret"


def _events_file(tmp_path: Path) -> tuple[Path, list[wire.Event]]:
    events = generate_events(7, runs=4, companies=1, failure_rate=0.5, large_output_rate=0.3)
    first = events[0]
    last_seq = max(e.seq for e in events if e.run_id == first.run_id)
    extra = wire.ToolCall(v=1, event_id="canary-call", company_id=first.company_id, run_id=first.run_id,
                          seq=last_seq + 1, ts=first.ts,
                          payload=wire.ToolCallPayload(call_id="cc", tool="login",
                                                       arguments={"password": CANARY}))  # fmt: skip
    events = [*events, extra]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(wire.encode_event(e) + b"\n" for e in events))
    return path, events


@pytest.mark.parametrize("scheme", ["sqlite", "file"])
def test_export_then_verify(tmp_path: Path, scheme: str, capsys: pytest.CaptureFixture[str]) -> None:
    events_path, events = _events_file(tmp_path)
    url = f"sqlite:///{tmp_path}/s.db" if scheme == "sqlite" else f"file://{tmp_path}/store"
    assert main(["ingest-file", str(events_path), "--steps-sink", url, "--no-progress"]) in (0, 1)
    runs = list(dict.fromkeys((e.company_id, e.run_id) for e in events))
    for company, run in runs:
        out = tmp_path / "out"
        assert main(["export", "--steps-sink", url, "--company", company, "--run", run, "-o", str(out)]) == 0
        bundle = out / f"{run}.sftrace"
        result = validate_bundle(bundle, strict=True, verify_integrity=True)
        assert result.valid, result.issues
        trace = load_trace(bundle)
        ids = [e.id for e in trace.events]
        wire_ids = {e.event_id for e in events if e.run_id == run}
        assert sum(i in wire_ids for i in ids) >= len(ids) - 2  # only run_start/run_end may be synthesized
        assert main(["verify", str(bundle)]) == 0
        for name in ("manifest.json", "events.jsonl", "redactions.json", "integrity.json", "stepstream.json"):
            assert CANARY not in (bundle / name).read_text(encoding="utf-8")
        assert main(["export", "--steps-sink", url, "--company", company, "--run", run, "-o", str(out)]) == 2
    capsys.readouterr()
    bundle = tmp_path / "out" / f"{runs[0][1]}.sftrace"
    (bundle / "integrity.json").unlink()
    assert main(["verify", str(bundle)]) == 5
    (bundle / "manifest.json").unlink()
    assert main(["verify", str(bundle)]) == 4
    assert "invalid" in capsys.readouterr().err
    shutil.rmtree(bundle)
    assert main(["verify", str(bundle)]) == 4


def test_unknown_and_pruned_runs_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events_path, events = _events_file(tmp_path)
    url = f"sqlite:///{tmp_path}/s.db"
    main(["ingest-file", str(events_path), "--steps-sink", url, "--no-progress"])
    company, run = events[0].company_id, events[0].run_id
    assert main(["export", "--steps-sink", url, "--company", company, "--run", "nope", "-o", str(tmp_path)]) == 3
    assert "refused (unknown)" in capsys.readouterr().err

    async def prune() -> None:
        store = await open_step_store(url)
        try:
            await store.mark_deep_pruned(company, [run], "2026-12-01T00:00:00.000000Z")
        finally:
            await store.close()

    asyncio.run(prune())
    assert main(["export", "--steps-sink", url, "--company", company, "--run", run, "-o", str(tmp_path)]) == 3
    assert "refused (pruned)" in capsys.readouterr().err
    assert not (tmp_path / f"{run}.sftrace").exists()


def test_tampered_export_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events_path, events = _events_file(tmp_path)
    url = f"sqlite:///{tmp_path}/s.db"
    main(["ingest-file", str(events_path), "--steps-sink", url, "--no-progress"])
    company, run = events[0].company_id, events[0].run_id
    out = tmp_path / "x.sftrace"
    assert any(e.event_id == "canary-call" for e in events)
    assert main(["export", "--steps-sink", url, "--company", company, "--run", run, "-o", str(out)]) == 0
    capsys.readouterr()
    data = bytearray((out / "events.jsonl").read_bytes())
    data[len(data) // 3] ^= 0x01
    (out / "events.jsonl").write_bytes(bytes(data))
    assert main(["verify", str(out)]) == 3
    assert "mismatch (events.jsonl)" in capsys.readouterr().err
    exe = Path(sys.executable).with_name("stepfork")
    done = subprocess.run([str(exe), "validate", str(out), "--verify-integrity"], capture_output=True, text=True)
    assert done.returncode != 0
    assert json.loads((out / "manifest.json").read_text())["run_id"] == run
