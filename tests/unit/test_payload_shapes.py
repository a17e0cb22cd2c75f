"""Payload shapes of the ``.sftrace`` manifest (issue 9): ``environment`` any JSON
object (a string is accepted), ``failure`` a string or ``{type, message, step?}``,
both kept structured on the run record."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from fold_support import ev
from stepstream.core import wire
from stepstream.core.fold import RunFold
from stepstream.core.records import Failure, RunRecord
from stepstream.errors import WireError

EXAMPLES = Path(__file__).resolve().parents[2] / "schemas" / "examples"


def run_of(*messages: bytes) -> RunRecord:
    events = [wire.decode_event(m) for m in messages]
    fold = RunFold(events[0].company_id, events[0].run_id)
    outs = [fold.push(e, 0.0) for e in events]
    return [o.run for o in outs if o is not None and o.run is not None][-1]


def test_golden_environment_object_is_kept_structured():
    run = run_of((EXAMPLES / "run_start_environment_object.json").read_bytes())
    assert run.environment == {"region": "eu", "python": "3.11.7", "os": "linux", "tags": ["canary"]}
    assert run_of((EXAMPLES / "run_start.json").read_bytes()).environment == "prod"  # a string is accepted


def test_golden_failure_shapes():
    assert run_of((EXAMPLES / "run_end_failure_object.json").read_bytes()).failure == Failure(
        type="ToolError", message="boom", step=3
    )
    assert run_of((EXAMPLES / "run_end_failed.json").read_bytes()).failure == Failure(
        type="unknown", message="tool billing.lookup returned 503 three times"
    )
    missing = run_of((EXAMPLES / "run_end_failed_without_failure.json").read_bytes())
    assert missing.status == "failed" and missing.failure is not None and missing.failure.type == "unknown"
    assert missing.failure.message  # the .sftrace manifest needs a non-empty message


def test_a_completed_run_needs_no_failure():
    fold = RunFold("acme", "r1")
    assert fold.push(ev("run_end", 0, status="completed"), 0.0).run.failure is None


def test_secrets_in_the_shapes_stay_off_the_run_record():
    env = {"region": "eu", "api_key": "sk-live-abcdefghijklmnopqrstuv"}
    failure = wire.FailurePayload(type="AuthError", message="rejected Bearer abcdefghijklmnop12345")
    fold = RunFold("acme", "r1")
    start = fold.push(ev("run_start", 0, agent_name="a", environment=env), 0.0).run
    end = fold.push(ev("run_end", 1, status="failed", failure=failure), 0.0).run
    text = msgspec.json.encode([start, end]).decode()
    assert "abcdefghijklmnop" not in text and start.environment["region"] == "eu"
    assert end.environment is None  # written once, with its run_start


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({"status": "failed", "failure": {"message": "no type"}}, "missing_field"),
        ({"status": "failed", "failure": {"type": "", "message": "x"}}, "invalid_value"),
        ({"status": "failed", "failure": {"type": "E", "message": "x", "step": -1}}, "out_of_range"),
        ({"status": "failed", "failure": 12}, "wrong_type"),
    ],
)
def test_malformed_failures_are_dead_lettered_with_a_reason(payload, reason):
    message = msgspec.json.encode(
        {"v": 1, "event_id": "e", "company_id": "acme", "run_id": "r1", "seq": 0, "ts": "2026-11-29T10:00:00Z",
         "type": "run_end", "payload": payload}  # fmt: skip
    )
    with pytest.raises(WireError) as info:
        wire.decode_event(message)
    assert info.value.reason == reason


@pytest.mark.parametrize("environment", [["a"], 3, True])
def test_an_environment_that_is_not_an_object_or_a_string_is_wrong_type(environment):
    message = msgspec.json.encode(
        {"v": 1, "event_id": "e", "company_id": "acme", "run_id": "r1", "seq": 0, "ts": "2026-11-29T10:00:00Z",
         "type": "run_start", "payload": {"agent_name": "a", "environment": environment}}  # fmt: skip
    )
    with pytest.raises(WireError) as info:
        wire.decode_event(message)
    assert info.value.reason == "wrong_type"


def test_an_environment_nested_too_deep_is_rejected():
    deep: object = 1
    for _ in range(120):
        deep = {"k": deep}
    message = msgspec.json.encode(
        {"v": 1, "event_id": "e", "company_id": "acme", "run_id": "r1", "seq": 0, "ts": "2026-11-29T10:00:00Z",
         "type": "run_start", "payload": {"agent_name": "a", "environment": deep}}  # fmt: skip
    )
    with pytest.raises(WireError) as info:
        wire.decode_event(message)
    assert info.value.reason == "too_deep"
