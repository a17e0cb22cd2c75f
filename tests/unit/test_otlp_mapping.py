"""Spans to wire events: the golden fixtures of each convention family, identity, and
the property that any order, split or redelivery of a trace's spans gives the same
events and the same rows."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from fold_support import fold_all
from stepstream.core import wire
from stepstream.core.redact import REDACTED
from stepstream.otlp.decode import decode_request
from stepstream.otlp.identity import IdentityPolicy
from stepstream.otlp.mapping import classify
from stepstream.otlp.trace import map_spans, runs_of

FIXTURES = Path(__file__).parent / "otlp_fixtures"
SECRET = "sk-test-FIXTURE0123456789abcdefghij"
POLICY = IdentityPolicy(default_company="acme")

# What each family's agent (tests/unit/otlp_fixtures/record.py) becomes: the steps as
# (kind, label, status), then the run record's agent, session and token totals.
EXPECTED = {
    "genai": (
        [("llm", "openai/gpt-4o-mini", "ok"), ("tool", "get_weather", "ok"), ("tool", "lookup_account", "error"),
         ("error", "PermissionError", "error"), ("llm", "openai/gpt-4o-mini", "ok")],
        ("weather-agent", "conv-genai-1", 122, 29, 0),
    ),
    "openinference": (
        [("llm", "openai/gpt-4o-mini-2024-07-18", "ok"), ("tool", "get_weather", "ok"),
         ("tool", "lookup_account", "error"), ("error", "PermissionError", "error"),
         ("llm", "openai/gpt-4o-mini-2024-07-18", "ok")],
        ("weather-agent", "session-oi-1", 122, 29, 11),
    ),
    "traceloop": (
        [("llm", "openai/gpt-4o-mini", "ok"), ("thinking", "reasoning", "ok"), ("tool", "get_weather", "ok"),
         ("tool", "lookup_account", "error"), ("error", "PermissionError", "error"), ("llm", "openai/gpt-4o-mini", "ok")],
        ("weather-agent", "session-tl-1", 122, 29, 11),
    ),
}


def _events(data: bytes, header: str | None = None, policy: IdentityPolicy = POLICY):
    decoded = decode_request(data)
    mapped = map_spans(decoded.spans, header, policy)
    return mapped, runs_of(mapped.events)


@pytest.mark.parametrize("family", sorted(EXPECTED))
@pytest.mark.parametrize("form", ["pb", "json"])
def test_golden_fixture_maps_to_the_table(family, form):
    mapped, runs = _events((FIXTURES / f"{family}.{form}").read_bytes())
    assert not mapped.rejected
    ((company, run_id), events), = runs.items()
    assert company == "acme" and len(run_id) == 32  # the trace id
    assert [e.seq for e in events] == list(range(len(events)))
    assert type(events[0]) is wire.RunStart and type(events[-1]) is wire.RunEnd
    store, _ = fold_all(events)
    steps = [store.steps[key] for key in sorted(store.steps)]
    want_steps, (agent, session, tokens_in, tokens_out, reasoning) = EXPECTED[family]
    assert [(s.kind, s.label, s.status) for s in steps] == want_steps
    (record,) = store.runs.values()
    assert (record.agent_name, record.session_id, record.status) == (agent, session, "completed")
    assert (record.input_tokens, record.output_tokens, record.reasoning_tokens) == (tokens_in, tokens_out, reasoning)
    # Redaction: the key on the tool step masked, the value kept in deep.
    weather = next(s for s in steps if s.label == "get_weather")
    shown = json.dumps(weather.arguments)
    assert SECRET not in json.dumps([msgspec.to_builtins(s) for s in steps]) and REDACTED in shown
    assert SECRET in json.dumps(msgspec.to_builtins(store.deeps[("acme", run_id, weather.step_seq)]))
    failed = next(s for s in steps if s.label == "lookup_account")
    assert store.deeps[("acme", run_id, failed.step_seq)].output == {"error": "account lookup denied"}


def test_reasoning_is_a_thinking_step_not_output():
    _, runs = _events((FIXTURES / "traceloop.pb").read_bytes())
    (events,) = runs.values()
    (thinking,) = [e for e in events if type(e) is wire.ThinkingDelta]
    assert thinking.payload.text.startswith("The user wants the weather")
    first = next(e for e in events if type(e) is wire.LlmResponse)
    assert "reasoning" not in json.dumps(msgspec.to_builtins(first.payload.output))
    assert [p["type"] for p in first.payload.output[0]["parts"]] == ["tool_call", "tool_call"]  # the model's requests stay


def test_event_ids_name_trace_span_and_role():
    _, runs = _events((FIXTURES / "genai.pb").read_bytes())
    (events,) = runs.values()
    ids = [e.event_id for e in events]
    assert len(set(ids)) == len(ids)
    assert all(i.startswith("otlp:") and len(i.split(":")) == 4 for i in ids)
    assert ids[0].endswith(":start") and ids[-1].endswith(":end")


# ---------------------------------------------------------------- identity


def _request(resource: dict, spans: list[dict]) -> bytes:
    attributes = [{"key": k, "value": {"stringValue": v}} for k, v in resource.items()]
    return json.dumps({"resourceSpans": [{"resource": {"attributes": attributes}, "scopeSpans": [{"spans": spans}]}]}).encode()


def _span(span_id: str = "eee19b7ec3c1b174", parent: str = "", **attributes) -> dict:
    return {
        "traceId": "5b8efff798038103d269b633813fc60c", "spanId": span_id, "parentSpanId": parent, "name": "s",
        "startTimeUnixNano": "1764633600000000000", "endTimeUnixNano": "1764633601000000000",
        "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attributes.items()],
    }


@pytest.mark.parametrize(
    ("header", "policy", "resource", "company"),
    [
        ("hdr", IdentityPolicy(trust_resource_company=True, default_company="dflt"), {"stepstream.company_id": "res"}, "hdr"),
        (None, IdentityPolicy(trust_resource_company=True, default_company="dflt"), {"stepstream.company_id": "res"}, "res"),
        (None, IdentityPolicy(default_company="dflt"), {"stepstream.company_id": "res"}, "dflt"),
        (None, IdentityPolicy(), {"stepstream.company_id": "res"}, "no_company"),
        ("bad company!", IdentityPolicy(), {}, "bad_company"),
    ],
)
def test_company_most_trusted_first(header, policy, resource, company):
    mapped, runs = _events(_request(resource, [_span()]), header, policy)
    if company in ("no_company", "bad_company"):
        assert not runs and [r.reason for r in mapped.rejected] == [company]
    else:
        assert {key[0] for key in runs} == {company}


def test_run_id_from_the_span_else_the_trace():
    data = _request({}, [_span(**{"stepstream.run_id": "ticket:42"}), _span("eee19b7ec3c1b175", "eee19b7ec3c1b174", **{"gen_ai.operation.name": "execute_tool"})])
    _, runs = _events(data)
    assert set(runs) == {("acme", "ticket:42"), ("acme", "5b8efff798038103d269b633813fc60c")}
    mapped, runs = _events(_request({}, [_span(**{"stepstream.run_id": "no spaces allowed"})]))
    assert not runs and [r.reason for r in mapped.rejected] == ["bad_run_id"]


def test_classified_by_operation_name_first():
    (span,) = decode_request(
        _request({}, [_span(**{"gen_ai.operation.name": "execute_tool", "openinference.span.kind": "LLM",
                               "llm.input_messages.0.message.content": "hi"})])
    ).spans
    assert classify(span) == "tool"


def test_older_openllmetry_prompt_and_completion_attributes():
    data = _request({}, [_span("eee19b7ec3c1b175", "eee19b7ec3c1b174", **{
        "llm.request.type": "chat", "gen_ai.system": "anthropic", "gen_ai.request.model": "claude",
        "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "hello",
        "gen_ai.completion.0.role": "thinking", "gen_ai.completion.0.content": "let me think",
        "gen_ai.completion.1.role": "assistant", "gen_ai.completion.1.content": "hi there",
    })])
    _, runs = _events(data)
    (events,) = runs.values()
    request, thinking, response = events
    assert (request.payload.provider, request.payload.model) == ("anthropic", "claude")
    assert request.payload.input == [{"role": "user", "parts": [{"type": "text", "content": "hello"}]}]
    assert thinking.payload.text == "let me think"
    assert response.payload.output == [{"role": "assistant", "parts": [{"type": "text", "content": "hi there"}]}]


def test_a_span_whose_event_breaks_a_wire_bound_is_refused_alone():
    deep = "[" * 150 + "]" * 150
    data = _request({}, [_span(**{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t",
                                  "gen_ai.tool.call.arguments": json.dumps({"x": json.loads(deep)})})])
    mapped, runs = _events(data)
    assert [r.reason for r in mapped.rejected] == ["too_deep"]
    ((_, events),) = runs.items()
    assert [type(e) for e in events] == [wire.RunStart, wire.ToolResult, wire.RunEnd]


# ---------------------------------------------------------------- any order, split, redelivery

_ALL = [ExportTraceServiceRequest.FromString((FIXTURES / f"{family}.pb").read_bytes()) for family in sorted(EXPECTED)]
_PIECES = [  # (resource, scope, span) of every span of every fixture
    (resource_spans.resource, scope_spans.scope, span)
    for request in _ALL
    for resource_spans in request.resource_spans
    for scope_spans in resource_spans.scope_spans
    for span in scope_spans.spans
]


def _message(pieces, as_json: bool) -> bytes:
    request = ExportTraceServiceRequest()
    for resource, scope, span in pieces:
        resource_spans = request.resource_spans.add()
        resource_spans.resource.CopyFrom(resource)
        scope_spans = resource_spans.scope_spans.add()
        scope_spans.scope.CopyFrom(scope)
        scope_spans.spans.add().CopyFrom(span)
    if not as_json:
        return request.SerializeToString()
    from google.protobuf.json_format import MessageToDict
    import base64

    document = MessageToDict(request, use_integers_for_enums=True)
    for resource_spans in document.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for field in ("traceId", "spanId", "parentSpanId"):
                    if field in span:
                        span[field] = base64.b64decode(span[field]).hex()
    return json.dumps(document).encode()


def _baseline():
    events = []
    for request in _ALL:
        events += map_spans(decode_request(request.SerializeToString()).spans, None, POLICY).events
    runs = runs_of(events)
    store, _ = fold_all([e for run in runs.values() for e in run])
    return runs, store.snapshot()


_BASE_RUNS, _BASE_ROWS = _baseline()


@settings(max_examples=60, deadline=None)
@given(
    order=st.permutations(range(len(_PIECES))),
    cuts=st.lists(st.integers(0, len(_PIECES)), max_size=6),
    again=st.lists(st.integers(0, len(_PIECES) - 1), max_size=5),
    forms=st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_any_order_split_and_redelivery_gives_the_same_events_and_rows(order, cuts, again, forms):
    pieces = [_PIECES[i] for i in order] + [_PIECES[i] for i in again]  # redelivered spans at the end
    bounds = sorted({0, len(pieces), *cuts})
    events = []
    for n, (low, high) in enumerate(zip(bounds, bounds[1:])):
        data = _message(pieces[low:high], as_json=forms[n % len(forms)])
        events += map_spans(decode_request(data).spans, None, POLICY).events
    runs = runs_of(events)
    assert runs == _BASE_RUNS
    store, _ = fold_all([e for run in runs.values() for e in run])
    assert store.snapshot() == _BASE_ROWS


def test_the_session_is_on_the_run_record_credential_masked():
    start = wire.RunStart(
        v=1, event_id="e", company_id="acme", run_id="r", seq=0, ts=wire.datetime(2026, 1, 1, tzinfo=__import__("datetime").timezone.utc),
        payload=wire.RunStartPayload(agent_name="a", session_id=f"conv {SECRET}"),
    )
    store, _ = fold_all([start])
    (record,) = store.runs.values()
    assert record.session_id.startswith("conv ") and SECRET not in record.session_id


def _shape(events: list) -> list:
    """The events without what changes from one recording to the next (ids, times, ports)."""
    shapes = []
    for event in events:
        payload = msgspec.to_builtins(event.payload)
        payload.pop("call_id", None)  # span ids where no tool call id is recorded
        payload.pop("metadata", None)
        shapes.append((type(event).__struct_config__.tag, payload))
    return shapes


def test_the_fixtures_are_what_the_pinned_libraries_record(tmp_path):
    import subprocess
    import sys

    subprocess.run([sys.executable, str(FIXTURES / "record.py"), "--out", str(tmp_path)], check=True, capture_output=True)
    for family in sorted(EXPECTED):
        for form in ("pb", "json"):
            _, fresh = _events((tmp_path / f"{family}.{form}").read_bytes())
            _, golden = _events((FIXTURES / f"{family}.{form}").read_bytes())
            assert [_shape(run) for run in fresh.values()] == [_shape(run) for run in golden.values()], (family, form)
