"""The older OpenLLMetry form, ``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*``, as a
real release wrote it (tests/unit/otlp_fixtures/traceloop_indexed.*, README.md there),
decoded and mapped by the table of docs/otel.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec
import pytest

from fold_support import fold_all
from stepstream.core import wire
from stepstream.core.redact import REDACTED
from stepstream.otlp.decode import decode_request
from stepstream.otlp.identity import IdentityPolicy
from stepstream.otlp.trace import map_spans, runs_of

FIXTURES = Path(__file__).parent / "otlp_fixtures"
SECRET = "sk-test-FIXTURE0123456789abcdefghij"
SYSTEM = {"role": "system", "parts": [{"type": "text", "content": "You are a weather assistant."}]}
USER = {"role": "user", "parts": [{"type": "text", "content": "What is the weather in Paris?"}]}
CALLS = [
    {"type": "tool_call", "id": "call_weather_1", "name": "get_weather", "arguments": {"city": "Paris", "api_key": SECRET}},
    {"type": "tool_call", "id": "call_lookup_2", "name": "lookup_account", "arguments": {"user": "ada"}},
]


def _legacy_pins() -> tuple[str, ...]:
    sys.path.insert(0, str(FIXTURES))
    try:
        import record
    finally:
        sys.path.remove(str(FIXTURES))
    return record.LEGACY_PINS["traceloop_indexed"]


def _spans_and_scopes() -> tuple[list[dict], list[dict]]:
    document = json.loads((FIXTURES / "traceloop_indexed.json").read_text())
    return [span for rs in document["resourceSpans"] for ss in rs["scopeSpans"] for span in ss["spans"]], [
        ss["scope"] for rs in document["resourceSpans"] for ss in rs["scopeSpans"]
    ]


def test_the_fixture_is_the_indexed_form_of_the_pinned_release():
    spans, scopes = _spans_and_scopes()
    (pin,) = [p for p in _legacy_pins() if p.startswith("opentelemetry-instrumentation-openai==")]
    assert {"name": "opentelemetry.instrumentation.openai.v1", "version": pin.split("==")[1]} in scopes
    keys = {a["key"] for span in spans for a in span.get("attributes", [])}
    assert {"gen_ai.prompt.0.role", "gen_ai.completion.0.tool_calls.1.name", "gen_ai.prompt.3.tool_call_id"} <= keys
    assert not keys & {"gen_ai.input.messages", "gen_ai.output.messages"}


@pytest.mark.parametrize("form", ["pb", "json"])
def test_indexed_prompts_and_completions_map_to_the_table(form):
    mapped = map_spans(decode_request((FIXTURES / f"traceloop_indexed.{form}").read_bytes()).spans, None,
                       IdentityPolicy(default_company="acme"))  # fmt: skip
    assert not mapped.rejected
    ((company, run_id), events), = runs_of(mapped.events).items()
    assert company == "acme" and len(run_id) == 32
    assert [type(e).__name__ for e in events] == [
        "RunStart", "LlmRequest", "LlmResponse", "ToolCall", "ToolResult", "ToolCall", "ToolResult", "Error",
        "LlmRequest", "LlmResponse", "RunEnd",
    ]  # fmt: skip
    first, answer = events[1].payload, events[2].payload
    assert (first.provider, first.model, first.params) == ("openai", "gpt-4o-mini", {"temperature": 0.2, "max_tokens": 256})
    assert first.input == [SYSTEM, USER]
    assert answer.output == [{"role": "assistant", "parts": CALLS, "finish_reason": "tool_calls"}]
    assert answer.usage == wire.Usage(input_tokens=42, output_tokens=17, reasoning_tokens=11, cache_read_input_tokens=8)
    second, final = events[8].payload, events[9].payload
    assert second.input[:3] == [SYSTEM, USER, {"role": "assistant", "parts": CALLS}]
    responses = [m["parts"] for m in second.input[3:]]
    assert [(r[0]["type"], r[0]["id"]) for r in responses] == [("tool_call_response", "call_weather_1"),
                                                              ("tool_call_response", "call_lookup_2")]  # fmt: skip
    assert final.output == [{"role": "assistant", "parts": [{"type": "text", "content": "It is 18 degrees and sunny in Paris."}],
                             "finish_reason": "stop"}]  # fmt: skip
    assert final.usage == wire.Usage(input_tokens=80, output_tokens=12)
    # Through the fold: the steps of the table, the secret masked on the step, kept in deep.
    store, _ = fold_all(events)
    steps = [store.steps[key] for key in sorted(store.steps)]
    assert [(s.kind, s.label, s.status) for s in steps] == [
        ("llm", "openai/gpt-4o-mini", "ok"), ("tool", "get_weather", "ok"), ("tool", "lookup_account", "error"),
        ("error", "PermissionError", "error"), ("llm", "openai/gpt-4o-mini", "ok"),
    ]  # fmt: skip
    (record,) = store.runs.values()
    assert (record.agent_name, record.session_id, record.status) == ("weather-agent", "session-tl-1", "completed")
    assert (record.input_tokens, record.output_tokens, record.reasoning_tokens) == (122, 29, 11)
    assert SECRET not in json.dumps([msgspec.to_builtins(s) for s in steps])
    weather = steps[1]
    assert REDACTED in json.dumps(weather.arguments)
    for step in (steps[0], weather):  # the model's request for the tool, and the tool's arguments
        assert SECRET in json.dumps(msgspec.to_builtins(store.deeps[("acme", run_id, step.step_seq)]))
