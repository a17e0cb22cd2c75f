"""Payload shapes of the ``.sftrace`` manifest (issue 9): ``environment`` any JSON
object (a string is accepted), ``failure`` a string or ``{type, message, step?}``,
both kept structured on the run record; a run_end is never refused for the shape of
its failure (issue 19: ``core.failures`` keeps what it says)."""

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
    assert run_of((EXAMPLES / "run_end_failure_untyped.json").read_bytes()).failure == Failure(
        type="ToolError", message="boom"
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


def end_with(failure: object, status: str = "failed") -> tuple[RunRecord, str | None]:
    """The run record of a run_end carrying ``failure`` (decoded from the wire), and
    the coerced shape the fold reported for the count."""
    message = msgspec.json.encode(
        {"v": 1, "event_id": "e", "company_id": "acme", "run_id": "r1", "seq": 0, "ts": "2026-11-29T10:00:00Z",
         "type": "run_end", "payload": {"status": status, "failure": failure}}  # fmt: skip
    )
    out = RunFold("acme", "r1").push(wire.decode_event(message), 0.0)
    assert out is not None and out.run is not None
    return out.run, out.failure_coerced


@pytest.mark.parametrize(
    ("failure", "expected", "shape"),
    [
        ({"message": "boom", "kind": "ToolError"}, Failure(type="ToolError", message="boom"), "untyped"),
        ({"message": "boom", "code": 503}, Failure(type="503", message="boom"), "untyped"),
        ({"message": "boom", "name": "Timeout", "step": 2}, Failure(type="Timeout", message="boom", step=2), "untyped"),
        ({"message": "no type"}, Failure(type="unknown", message="no type"), "untyped"),
        ({"type": "", "kind": "E", "message": "x"}, Failure(type="E", message="x"), "untyped"),
        ({"type": "E", "message": "x", "step": -1}, Failure(type="E", message="x"), "malformed"),
        ({"type": "E", "message": "x", "step": "3"}, Failure(type="E", message="x"), "malformed"),
        ({"type": "E", "error": "went wrong"}, Failure(type="E", message="went wrong"), "malformed"),
        ({"type": "E", "detail": {"n": 1}}, Failure(type="E", message='{"type":"E","detail":{"n":1}}'), "malformed"),
        (12, Failure(type="unknown", message="12"), "malformed"),
        (["a", 1], Failure(type="unknown", message='["a",1]'), "malformed"),
        ({"type": "E", "message": "x", "step": 1, "extra": [1]}, Failure(type="E", message="x", step=1), None),
        ("plain text", Failure(type="unknown", message="plain text"), None),
    ],
)
def test_a_run_end_is_never_refused_for_the_shape_of_its_failure(failure, expected, shape):
    run, coerced = end_with(failure)
    assert (run.status, run.failure, coerced) == ("failed", expected, shape)


def test_a_coerced_failure_is_redacted_and_clipped():
    secret = "sk-live-abcdefghijklmnopqrstuv"
    run, _ = end_with({"kind": f"Bearer {secret}", "detail": {"api_key": secret, "why": "x" * 10_000}})
    text = msgspec.json.encode(run).decode()
    assert "abcdefghijklmnop" not in text
    assert run.failure is not None and len(run.failure.message) < 3000


async def test_a_coerced_failure_is_counted_by_shape():
    from stepstream.metrics import Metrics
    from stepstream.pipeline import Pipeline
    from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore

    metrics = Metrics()
    pipeline = Pipeline(MemoryStepStore(), MemoryDeepStore(), metrics=metrics)
    for seq, failure in enumerate([{"message": "m", "kind": "K"}, 7, None]):
        message = msgspec.json.encode(
            {"v": 1, "event_id": f"e{seq}", "company_id": "acme", "run_id": f"r{seq}", "seq": 0,
             "ts": "2026-11-29T10:00:00Z", "type": "run_end", "payload": {"status": "failed", "failure": failure}}
        )  # fmt: skip
        event = wire.decode_event(message)
        await pipeline.load([(event.company_id, event.run_id)])
        pipeline.apply(event)
    samples = {
        s.labels["shape"]: s.value for s in metrics.failures_coerced.collect()[0].samples if s.name.endswith("_total")
    }
    assert samples == {"untyped": 1.0, "malformed": 1.0, "missing": 1.0}


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
