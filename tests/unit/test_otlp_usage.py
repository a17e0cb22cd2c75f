"""Usage from each convention's attributes, cache tokens included, to the wire and the
step: what ``docs/otel.md`` lists for ``llm_response.usage``."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fold_support import fold_all
from stepstream.core import wire
from stepstream.otlp.decode import decode_request
from stepstream.otlp.identity import IdentityPolicy
from stepstream.otlp.trace import map_spans, runs_of

POLICY = IdentityPolicy(default_company="acme")
FIELDS = ("input_tokens", "output_tokens", "reasoning_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
# Per convention, the attribute of each wire field (FIELDS order).
CONVENTIONS = {
    "genai": ("gen_ai.operation.name", "chat", (
        "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.usage.reasoning.output_tokens",
        "gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_creation.input_tokens")),
    "openllmetry": ("llm.request.type", "chat", (
        "gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens", "gen_ai.usage.reasoning_tokens",
        "gen_ai.usage.cache_read_input_tokens", "gen_ai.usage.cache_creation_input_tokens")),
    "openinference": ("openinference.span.kind", "LLM", (
        "llm.token_count.prompt", "llm.token_count.completion", "llm.token_count.completion_details.reasoning",
        "llm.token_count.prompt_details.cache_read", "llm.token_count.prompt_details.cache_write")),
}


def _request(kind: tuple[str, str], counts: dict[str, int]) -> bytes:
    attributes = [{"key": kind[0], "value": {"stringValue": kind[1]}}]
    attributes += [{"key": key, "value": {"intValue": str(value)}} for key, value in counts.items()]
    root = {"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174", "name": "agent",
            "startTimeUnixNano": "1764633600000000000", "endTimeUnixNano": "1764633603000000000"}  # fmt: skip
    llm = {"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b175", "parentSpanId": "eee19b7ec3c1b174",
           "name": "chat", "startTimeUnixNano": "1764633601000000000", "endTimeUnixNano": "1764633602000000000",
           "attributes": attributes}  # fmt: skip
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [root, llm]}]}]}).encode()


def _response_and_step(data: bytes):
    mapped = map_spans(decode_request(data).spans, None, POLICY)
    assert not mapped.rejected
    (events,) = runs_of(mapped.events).values()
    (response,) = [e for e in events if type(e) is wire.LlmResponse]
    store, _ = fold_all(events)
    (step,) = [s for s in store.steps.values() if s.kind == "llm"]
    deep = next(d for key, d in store.deeps.items() if key[2] == step.step_seq)
    return response, deep.result_event


@pytest.mark.parametrize("convention", sorted(CONVENTIONS))
@given(counts=st.tuples(*[st.integers(0, wire.MAX_TOKENS)] * 5))
def test_every_convention_carries_usage_with_cache_tokens_to_the_step(convention, counts):
    operation, value, keys = CONVENTIONS[convention]
    response, result_event = _response_and_step(_request((operation, value), dict(zip(keys, counts))))
    assert tuple(getattr(response.payload.usage, field) for field in FIELDS) == counts
    usage = result_event["usage"]
    assert {field: usage.get(field, 0) for field in FIELDS} == dict(zip(FIELDS, counts))
    # A zero cache count stays out of the envelope (a step without them is unchanged).
    assert all(field in usage for field, count in zip(FIELDS[3:], counts[3:]) if count)
    assert not any(field in usage for field, count in zip(FIELDS[3:], counts[3:]) if not count)


def test_an_older_reader_ignores_the_cache_fields():
    class OldUsage(msgspec.Struct, forbid_unknown_fields=False):
        input_tokens: int = 0
        output_tokens: int = 0
        reasoning_tokens: int = 0

    new = wire.Usage(input_tokens=5, cache_read_input_tokens=3, cache_creation_input_tokens=2)
    assert msgspec.json.decode(msgspec.json.encode(new), type=OldUsage) == OldUsage(input_tokens=5)
    assert msgspec.json.encode(wire.Usage(input_tokens=5)) == b'{"input_tokens":5}'  # omitted when 0
