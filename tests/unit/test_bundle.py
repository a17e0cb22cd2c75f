"""The .sftrace bundle (issue 13): built from folded runs, judged by the reference
implementation (``stepfork``: its validator, loader and integrity check)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stepfork.trace.canonical import canonical_json_bytes
from stepfork.trace.integrity import IntegrityStatus, verify_bundle_integrity
from stepfork.trace.storage import load_trace
from stepfork.trace.validation import validate_bundle

from stepstream.bundle import BundleRefused, THINKING_KEY, build_bundle, verify_bundle
from stepstream.bundle.export import write_bundle
from stepstream.core import wire
from stepstream.core.canonical import CanonicalError, canonical_bytes
from stepstream.core.caps import CLIP_MARKER
from stepstream.core.limits import Limits
from stepstream.core.records import RunRecord
from stepstream.emitter.corpus import generate_events
from fold_support import Script, fold_all

CANARY = "CANARY-9f2d-hunter2-secret"
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
GH_TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
SECRETS = (CANARY, AWS_KEY, GH_TOKEN)


def _varied_run(run: str = "r1", *, status: str = "failed") -> list:
    s = Script(run=run)
    s("run_start", agent_name="bot", environment={"python": "3.11", "os": "linux", "region": "eu", "api_key": CANARY})
    s.think("Let me think ", "about ünïcødé 🚀 and ", f"the key {AWS_KEY}")
    s("llm_request", call_id="c1", provider="openai", model="gpt-4o",
      input={"messages": [{"role": "user", "content": "hi \u2028 there"}], "password": CANARY},
      params={"temperature": 0.7, "api_key": CANARY})  # fmt: skip
    s("llm_response", call_id="c1", output={"text": "ok", "big": 2**70, "f": 1e16, "g": 0.1, "n": -0.0,
                                            "huge": 1.7976931348623157e308, "tiny": 5e-324, "neg": -(2**63)},
      usage={"input_tokens": 12, "output_tokens": 5}, stop_reason="stop")  # fmt: skip
    s("tool_call", call_id="t1", tool="search", arguments={"q": "weather", "token": CANARY, GH_TOKEN: 1,
                                                           "url": f"https://user:{CANARY}@db.example.com/x"})  # fmt: skip
    s("tool_result", call_id="t1", output="x" * 70_000)  # clipped
    s("tool_call", call_id="t2", tool="fail", arguments={})
    s("tool_result", call_id="t2", output={"error": "boom"}, is_error=True)
    s("state_change", key="cursor", value={"page": 2, "list": [1, 2.5, None, True]})
    s("state_change", key="session_token", value=CANARY)
    s("tool_call", call_id="t3", tool=f"login-{GH_TOKEN}", arguments={"user": "bob"})
    s("error", message=f"upstream timed out with {AWS_KEY}", kind=f"err {GH_TOKEN}")
    if status == "failed":
        s("run_end", status="failed", failure={"type": "ToolError", "message": "gave up"})
    elif status == "completed":
        s("run_end", status="completed")
    return s.events


def _bundle_of(events: list, company: str = "acme"):
    events = [wire.decode_event(wire.encode_event(e)) for e in events]  # as the worker gets them
    store, _ = fold_all(events, Limits())
    out = []
    for (c, r), run in store.runs.items():
        deeps = [d for (dc, dr, _), d in store.deeps.items() if (dc, dr) == (c, r)]
        seqs = [k[2] for k in store.steps if k[:2] == (c, r)]
        out.append((run, build_bundle(run, deeps, company_id=c, step_seqs=seqs)))
    return out


def _write(tmp_path: Path, bundle, name: str) -> Path:
    return write_bundle(bundle, tmp_path / f"{name}.sftrace")


def _reference_accepts(path: Path, bundle) -> None:
    result = validate_bundle(path, strict=True, verify_integrity=True)
    assert result.valid, result.issues
    assert verify_bundle_integrity(path).status is IntegrityStatus.VERIFIED
    trace = load_trace(path)
    lines = bundle.files["events.jsonl"].decode().split("\n")
    assert lines.pop() == "" and len(lines) == len(bundle.files["events.jsonl"].decode().splitlines())
    ours = [json.loads(line) for line in lines]
    assert [e.id for e in trace.events] == [e["id"] for e in ours]
    assert [str(e.type) for e in trace.events] == [e["type"] for e in ours]
    assert verify_bundle(path).status == "verified"


@pytest.mark.parametrize("status", ["failed", "completed", "running"])
def test_varied_run_is_valid_under_the_reference(tmp_path: Path, status: str) -> None:
    [(run, bundle)] = _bundle_of(_varied_run(status=status))
    path = _write(tmp_path, bundle, "run")
    _reference_accepts(path, bundle)
    trace = load_trace(path)
    assert str(trace.status) == ("running" if status == "running" else status)
    types = [str(e.type) for e in trace.events]
    assert types[0] == "run_start" and types.count("run_start") == 1
    assert ("run_end" in types) == (status != "running")
    thinking = [e for e in trace.events if str(e.type) == "state_change" and e.key == THINKING_KEY]
    assert len(thinking) == 1 and thinking[0].after.startswith("Let me think about ünïcødé 🚀")
    assert thinking[0].id == "r1-1"  # the first delta's id
    request = next(e for e in trace.events if str(e.type) == "llm_request")
    assert (request.provider, request.model, request.id) == ("openai", "gpt-4o", "r1-4")
    response = next(e for e in trace.events if str(e.type) == "llm_response")
    assert (response.prompt_tokens, response.completion_tokens) == (12, 5)
    assert response.output["big"] == 2**70 and response.output["f"] == 1e16
    sidecar = json.loads(bundle.files["stepstream.json"])
    clipped = [c for c in sidecar["clipped"]]
    assert clipped and all(c["field"] == "output" for c in clipped)
    clipped_event = next(e for e in trace.events if e.id == clipped[0]["event_id"])
    assert clipped_event.output.endswith(CLIP_MARKER)
    failed = next(e for e in trace.events if str(e.type) == "tool_result" and e.output == {"error": "boom"})
    assert str(failed.status) == "error"
    if status == "failed":
        manifest = json.loads(bundle.files["manifest.json"])
        assert manifest["failure"]["type"] == "ToolError"
    manifest = json.loads(bundle.files["manifest.json"])
    assert manifest["environment"] == {"python": "3.11", "os": "linux"}


def test_corpus_bundles_are_valid_under_the_reference(tmp_path: Path) -> None:
    events = generate_events(13, runs=12, companies=2, large_output_rate=0.2, failure_rate=0.3, end_missing=0.2)
    bundles = _bundle_of(events)
    assert len(bundles) == 12
    for i, (run, bundle) in enumerate(bundles):
        path = _write(tmp_path, bundle, f"b{i}")
        _reference_accepts(path, bundle)


def test_reference_cli_validates_an_export(tmp_path: Path) -> None:
    [(run, bundle)] = _bundle_of(_varied_run())
    path = _write(tmp_path, bundle, "cli")
    exe = Path(sys.executable).with_name("stepfork")
    done = subprocess.run([str(exe), "validate", str(path), "--verify-integrity"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_secret_in_any_file(tmp_path: Path) -> None:
    [(run, bundle)] = _bundle_of(_varied_run())
    for name, data in bundle.files.items():
        text = data.decode("utf-8")
        for secret in SECRETS:
            assert secret not in text, (name, secret)
    entries = json.loads(bundle.files["redactions.json"])["entries"]
    assert entries and all(e["replacement"] == "[REDACTED]" for e in entries)
    paths = {e["path"] for e in entries}
    assert "/input/password" in paths and "/input/token" in paths and "/input/url" in paths
    assert {"/after", "/name", "/error_type", "/message"} <= paths
    assert "[redacted]" not in bundle.files["events.jsonl"].decode()


def test_one_byte_changed_is_named(tmp_path: Path) -> None:
    [(run, bundle)] = _bundle_of(_varied_run())
    original = _write(tmp_path, bundle, "orig")
    for name in ("manifest.json", "events.jsonl", "redactions.json", "stepstream.json"):
        size = len(bundle.files[name])
        for offset in (0, size // 2, size - 2):
            copy = tmp_path / f"t-{name}-{offset}.sftrace"
            shutil.copytree(original, copy)
            data = bytearray((copy / name).read_bytes())
            data[offset] = (data[offset] + 1) % 256
            (copy / name).write_bytes(bytes(data))
            verdict = verify_bundle(copy)
            assert (verdict.status, verdict.file) == ("mismatch", name), verdict
            assert verdict.exit_code == 3


def test_without_integrity_is_legacy_and_broken_is_invalid(tmp_path: Path) -> None:
    [(run, bundle)] = _bundle_of(_varied_run())
    path = _write(tmp_path, bundle, "legacy")
    (path / "integrity.json").unlink()
    verdict = verify_bundle(path)
    assert (verdict.status, verdict.exit_code) == ("unverified_legacy", 5)
    assert verify_bundle_integrity(path).status is IntegrityStatus.UNVERIFIED_LEGACY
    (path / "events.jsonl").write_bytes(b"{}\n\n")
    assert verify_bundle(path).status == "invalid"
    (path / "events.jsonl").unlink()
    assert (verify_bundle(path).status, verify_bundle(path).exit_code) == ("invalid", 4)


def test_payload_hash_mismatch_without_integrity_is_named(tmp_path: Path) -> None:
    [(run, bundle)] = _bundle_of(_varied_run())
    path = _write(tmp_path, bundle, "h")
    (path / "integrity.json").unlink()
    lines = (path / "events.jsonl").read_text().splitlines()
    for i, line in enumerate(lines):
        event = json.loads(line)
        if event["type"] == "tool_call":
            event["input"] = {"changed": True}
            lines[i] = json.dumps(event)
            break
    (path / "events.jsonl").write_text("\n".join(lines) + "\n")
    verdict = verify_bundle(path)
    assert (verdict.status, verdict.file, verdict.line) == ("mismatch", "events.jsonl", i + 1)


def test_pruned_and_purged_runs_are_refused() -> None:
    store, _ = fold_all([wire.decode_event(wire.encode_event(e)) for e in _varied_run()], Limits())
    [run] = store.runs.values()
    deeps = list(store.deeps.values())
    seqs = [k[2] for k in store.steps]
    pruned = RunRecord(**{**{f: getattr(run, f) for f in run.__struct_fields__}, "deep_pruned_at": "2026-12-01T00:00:00.000000Z"})
    with pytest.raises(BundleRefused) as info:
        build_bundle(pruned, deeps, company_id="acme", step_seqs=seqs)
    assert info.value.reason == "pruned"
    with pytest.raises(BundleRefused) as info:
        build_bundle(run, deeps[:2], company_id="acme", step_seqs=seqs)
    assert info.value.reason == "purged"


def test_abandoned_run_exports_as_failed_with_an_error_event(tmp_path: Path) -> None:
    store, _ = fold_all([wire.decode_event(wire.encode_event(e)) for e in _varied_run(status="running")[:3]], Limits())
    [run] = store.runs.values()
    run.status, run.ended_at = "abandoned", "2026-01-01T00:00:01.000000Z"
    bundle = build_bundle(run, list(store.deeps.values()), company_id="acme", step_seqs=None)
    path = _write(tmp_path, bundle, "abandoned")
    _reference_accepts(path, bundle)
    manifest = json.loads(bundle.files["manifest.json"])
    assert manifest["status"] == "failed" and manifest["failure"]["type"] == "abandoned"
    assert json.loads(bundle.files["stepstream.json"])["run_status"] == "abandoned"


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_json_values)
def test_canonical_bytes_equal_the_reference(value) -> None:
    try:
        ours = canonical_bytes(value)
    except CanonicalError:
        with pytest.raises(Exception):
            canonical_json_bytes(value)
        return
    assert ours == canonical_json_bytes(value)


def test_canonical_refuses_non_json() -> None:
    for bad in (math.nan, math.inf, {1: 2}, {"a": {1, 2}}, "\ud800"):
        with pytest.raises(CanonicalError):
            canonical_bytes(bad)


_payloads = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=15,
)


@settings(max_examples=40, deadline=None)
@given(args=st.dictionaries(st.text(max_size=10), _payloads, max_size=4), output=_payloads, value=_payloads)
def test_arbitrary_payloads_export_valid_bundles(args, output, value) -> None:
    import tempfile

    s = Script()
    s("run_start", agent_name="p")
    s("tool_call", call_id="t", tool="x", arguments=args)
    s("tool_result", call_id="t", output=output)
    s("state_change", key="k", value=value)
    s("run_end", status="completed")
    [(run, bundle)] = _bundle_of(s.events)
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), bundle, "p")
        _reference_accepts(path, bundle)
