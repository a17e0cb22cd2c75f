"""Spans to wire events (``docs/otel.md`` has the table; this module is its one home).

**Classification** reads what the span says it is, never which attributes happen to be
present: ``gen_ai.operation.name`` first, then OpenInference's
``openinference.span.kind``, then OpenLLMetry's ``traceloop.span.kind`` /
``llm.request.type`` (:func:`classify`). The trace's root span (no parent) opens and
closes the run whatever its kind; an agent span below the root and any span of another
kind (HTTP, retrieval, embeddings, a chain) make no event.

**Events per span**, each with a role; the event id is
``otlp:{trace_id}:{span_id}:{role}``, so the same span mapped twice (a redelivery, a
Collector retry, a replay) gives the same events:

=================  =========================================================
role               event
=================  =========================================================
``start``          ``run_start`` (root span), at the span's start
``call``           ``llm_request`` or ``tool_call``, at the span's start
``reasoning``      ``thinking_delta`` with the output's reasoning parts, at its end
``result``         ``llm_response`` or ``tool_result``, at the span's end
``error``          ``error`` for a span with status ERROR or ``exception`` events
``end``            ``run_end`` (root span), at the span's end
=================  =========================================================

:func:`span_events` maps one span and leaves ``seq`` at 0; :func:`order_trace` numbers
the events of one run: ``run_start`` first, ``run_end`` last, the rest by time, then by
role in the order of the table, then by span id; ``seq`` is the position, so any order
of the same spans numbers the same way.

Every event is checked by :func:`stepstream.core.wire.decode_event` (the bounds of a
native event: ids, nesting, token counts, times); one that fails is returned as a
:class:`~stepstream.otlp.decode.Rejected` with the decoder's reason, and the span's other
events are kept.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Literal

import msgspec

from stepstream.core import wire
from stepstream.core.caps import clip
from stepstream.errors import WireError
from stepstream.otlp.decode import Rejected
from stepstream.otlp.messages import parse_json, span_messages, split_reasoning
from stepstream.otlp.spans import STATUS_ERROR, Span

__all__ = ["ROLES", "Kind", "classify", "event_id", "order_trace", "span_events", "span_records", "trace_order"]

Kind = Literal["agent", "llm", "tool", "other"]
ROLES = ("start", "call", "reasoning", "result", "error", "end")
_RANK = {role: rank for rank, role in enumerate(ROLES)}

_GENAI_OPERATIONS: dict[str, Kind] = {
    "chat": "llm",
    "text_completion": "llm",
    "generate_content": "llm",
    "responses": "llm",
    "execute_tool": "tool",
    "invoke_agent": "agent",
    "create_agent": "agent",
    "invoke_workflow": "agent",
}
_OPENINFERENCE_KINDS: dict[str, Kind] = {"LLM": "llm", "TOOL": "tool", "AGENT": "agent", "CHAIN": "agent"}
_TRACELOOP_KINDS: dict[str, Kind] = {"workflow": "agent", "agent": "agent", "tool": "tool"}
_TRACELOOP_REQUESTS: dict[str, Kind] = {"chat": "llm", "completion": "llm"}

_LABEL = 256  # agent_name, tool and call_id are at most this long on the wire
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_encode = msgspec.json.encode


def classify(span: Span) -> Kind:
    """What the span is (module docstring). A ``CHAIN`` counts as an agent only at the
    root (:func:`span_events` ignores agents below it)."""
    attributes = span.attributes
    operation = attributes.get("gen_ai.operation.name")
    if operation is not None:
        return _GENAI_OPERATIONS.get(operation, "other") if type(operation) is str else "other"
    kind = attributes.get("openinference.span.kind")
    if kind is not None:
        return _OPENINFERENCE_KINDS.get(kind, "other") if type(kind) is str else "other"
    kind = attributes.get("traceloop.span.kind")
    if kind is not None:
        return _TRACELOOP_KINDS.get(kind, "other") if type(kind) is str else "other"
    request = attributes.get("llm.request.type")
    if type(request) is str:
        return _TRACELOOP_REQUESTS.get(request, "other")
    return "other"


def event_id(trace_id: str, span_id: str, role: str) -> str:
    return f"otlp:{trace_id}:{span_id}:{role}"


def _ts(nanos: int) -> datetime:
    return _EPOCH + timedelta(microseconds=max(nanos, 0) // 1000)


def _first(attributes: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        value = attributes.get(key)
        if value is not None and value != "":
            return value
    return None


def _text(value: Any, default: str) -> str:
    if value is None or value == "":
        return default
    text = value if type(value) is str else _encode(value).decode()
    return clip(text, _LABEL)[0]


def _count(value: Any) -> int:
    if type(value) is int:
        return min(max(value, 0), wire.MAX_TOKENS)
    if type(value) is float and value == value and value >= 0:
        return min(int(value), wire.MAX_TOKENS)
    return 0


_USAGE_KEYS = (
    ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt"),
    ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "llm.token_count.completion"),
    (
        "gen_ai.usage.reasoning_tokens",
        "gen_ai.usage.reasoning.output_tokens",
        "llm.usage.reasoning_tokens",  # OpenLLMetry before 0.5x
        "llm.token_count.completion_details.reasoning",
    ),
    (
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.usage.cache_read_input_tokens",  # OpenLLMetry
        "llm.token_count.prompt_details.cache_read",
    ),
    (
        "gen_ai.usage.cache_creation.input_tokens",
        "gen_ai.usage.cache_write.input_tokens",
        "gen_ai.usage.cache_creation_input_tokens",  # OpenLLMetry
        "llm.token_count.prompt_details.cache_write",
    ),
)


_ANY_USAGE = frozenset(key for keys in _USAGE_KEYS for key in keys)


def _usage(attributes: dict[str, Any]) -> wire.Usage | None:
    if _ANY_USAGE.isdisjoint(attributes):
        return None
    found = [_first(attributes, *keys) for keys in _USAGE_KEYS]
    if all(value is None for value in found):
        return None
    counts = [_count(value) for value in found]
    return wire.Usage(
        input_tokens=counts[0],
        output_tokens=counts[1],
        reasoning_tokens=counts[2],
        cache_read_input_tokens=counts[3],
        cache_creation_input_tokens=counts[4],
    )


_PARAMS = ("temperature", "max_tokens", "top_p", "top_k", "frequency_penalty", "presence_penalty", "seed", "stop_sequences")


def _params(attributes: dict[str, Any]) -> dict[str, Any] | None:
    params = {name: attributes[f"gen_ai.request.{name}"] for name in _PARAMS if f"gen_ai.request.{name}" in attributes}
    if not params:
        invocation = parse_json(attributes.get("llm.invocation_parameters"))
        if type(invocation) is dict:
            params = {key: value for key, value in invocation.items() if key != "model"}
    return params or None


def _stop_reason(attributes: dict[str, Any]) -> str | None:
    reasons = attributes.get("gen_ai.response.finish_reasons")
    if type(reasons) is list and reasons:
        return _text(reasons[0], "")
    reason = attributes.get("llm.finish_reason")
    return _text(reason, "") if reason is not None else None


def _error_of(span: Span) -> tuple[str, str] | None:
    """``(kind, message)`` of a failed span: its first ``exception`` event, else its status."""
    exception = next((event for event in span.events if event.name == "exception"), None)
    if exception is None and span.status_code != STATUS_ERROR:
        return None
    attributes = exception.attributes if exception is not None else {}
    kind = _first(attributes, "exception.type") or span.attributes.get("error.type") or "error"
    message = _first(attributes, "exception.message") or span.status_message or "the span failed"
    return _text(kind, "error"), message if type(message) is str else _encode(message).decode()


def _json_value(value: Any) -> Any:
    """An attribute holding JSON as its value; JSON of a JSON string (OpenLLMetry's
    ``traceloop.entity.*`` hold ``json.dumps`` of what the function took or returned) once more."""
    parsed = parse_json(value)
    return parse_json(parsed) if type(parsed) is str and parsed is not value else parsed


def _arguments(value: Any) -> dict[str, Any]:
    parsed = _json_value(value)
    if parsed is None:
        return {}
    return parsed if type(parsed) is dict else {"input": parsed}


class _Builder:
    __slots__ = ("company_id", "run_id", "span", "events", "_times")

    def __init__(self, company_id: str, run_id: str, span: Span) -> None:
        self.company_id, self.run_id, self.span = company_id, run_id, span
        self.events: list[tuple[str, Any]] = []
        self._times: dict[int, datetime] = {}  # a span's events are at its start or its end

    def add(self, role: str, event_type: type, nanos: int, payload: Any) -> None:
        span = self.span
        ts = self._times.get(nanos)
        if ts is None:
            ts = self._times[nanos] = _ts(nanos)
        self.events.append(
            (
                role,
                event_type(
                    v=1,
                    event_id=event_id(span.trace_id, span.span_id, role),
                    company_id=self.company_id,
                    run_id=self.run_id,
                    seq=0,
                    ts=ts,
                    payload=payload,
                ),
            )
        )


def _agent_name(span: Span) -> str:
    attributes = span.attributes
    name = _first(
        attributes, "gen_ai.agent.name", "agent.name", "traceloop.workflow.name", "traceloop.entity.name"
    ) or span.resource.get("service.name") or span.name
    return _text(name, "unknown")


def _session(span: Span) -> str | None:
    session = _first(
        span.attributes, "gen_ai.conversation.id", "session.id", "traceloop.association.properties.session_id"
    ) or _first(span.resource, "gen_ai.conversation.id", "session.id")
    return None if session is None else _text(session, "")


def _run_start(build: _Builder) -> None:
    span = build.span
    metadata: dict[str, Any] = {"otlp_trace_id": span.trace_id}
    service = span.resource.get("service.name")
    if service is not None:
        metadata["service_name"] = service
    payload = wire.RunStartPayload(agent_name=_agent_name(span), metadata=metadata, session_id=_session(span) or None)
    build.add("start", wire.RunStart, span.start_ns, payload)


def _run_end(build: _Builder, error: tuple[str, str] | None) -> None:
    span = build.span
    if error is None:
        payload = wire.RunEndPayload(status="completed")
    else:
        payload = wire.RunEndPayload(status="failed", failure={"type": error[0], "message": error[1]})
    build.add("end", wire.RunEnd, span.end_ns, payload)


def _llm(build: _Builder, error: tuple[str, str] | None) -> None:
    span = build.span
    attributes = span.attributes
    call_id = span.span_id
    provider = _first(attributes, "gen_ai.provider.name", "gen_ai.system", "llm.provider", "llm.system")
    model = _first(attributes, "gen_ai.request.model", "llm.model_name", "gen_ai.response.model")
    inputs, outputs = span_messages(attributes)
    request = wire.LlmRequestPayload(
        call_id=call_id,
        provider=_text(provider, "unknown"),
        model=_text(model, "unknown"),
        input=inputs,
        params=_params(attributes),
    )
    build.add("call", wire.LlmRequest, span.start_ns, request)
    output, reasoning = split_reasoning(outputs)
    if reasoning:
        build.add("reasoning", wire.ThinkingDelta, span.end_ns, wire.ThinkingDeltaPayload(text=reasoning))
    if output is None and error is not None:
        output = {"error": error[1]}
    response = wire.LlmResponsePayload(
        call_id=call_id, output=output, usage=_usage(attributes), stop_reason=_stop_reason(attributes)
    )
    build.add("result", wire.LlmResponse, span.end_ns, response)


def _tool(build: _Builder, error: tuple[str, str] | None) -> None:
    span = build.span
    attributes = span.attributes
    call_id = _first(attributes, "gen_ai.tool.call.id", "tool_call.id")
    call_id = call_id if type(call_id) is str and len(call_id) <= _LABEL else span.span_id
    tool = _text(_first(attributes, "gen_ai.tool.name", "tool.name", "traceloop.entity.name"), span.name or "tool")
    arguments = _first(attributes, "gen_ai.tool.call.arguments", "tool.parameters", "input.value", "traceloop.entity.input")
    build.add("call", wire.ToolCall, span.start_ns, wire.ToolCallPayload(call_id=call_id, tool=tool, arguments=_arguments(arguments)))
    result = _json_value(_first(attributes, "gen_ai.tool.call.result", "output.value", "traceloop.entity.output"))
    if result is None and error is not None:
        result = {"error": error[1]}
    build.add("result", wire.ToolResult, span.end_ns, wire.ToolResultPayload(call_id=call_id, output=result, is_error=error is not None))


def span_events(
    span: Span, company_id: str, run_id: str, max_event_bytes: int | None = None
) -> tuple[list[tuple[str, wire.Event]], list[Rejected]]:
    """The ``(role, event)`` pairs of one span, ``seq`` 0 (module docstring), and the
    events refused by the wire bounds (``max_event_bytes``: the raw topic's ``oversize``)."""
    records, rejected = span_records(span, company_id, run_id, max_event_bytes)
    return [(role, event) for role, event, _ in records], rejected


def span_records(
    span: Span, company_id: str, run_id: str, max_event_bytes: int | None = None
) -> tuple[list[tuple[str, wire.Event, bytes]], list[Rejected]]:
    """:func:`span_events` with each event's wire bytes (``seq`` 0), those the check decoded:
    :func:`stepstream.core.wire.renumbered` numbers them without encoding them again."""
    build = _Builder(company_id, run_id, span)
    kind = classify(span)
    root = span.parent_span_id is None
    error = _error_of(span)
    if root:
        _run_start(build)
    if kind == "llm":
        _llm(build, error)
    elif kind == "tool":
        _tool(build, error)
    if error is not None:
        build.add("error", wire.Error, span.end_ns, wire.ErrorPayload(message=error[1], kind=error[0]))
    if root:
        _run_end(build, error)
    checked: list[tuple[str, wire.Event, bytes]] = []
    rejected: list[Rejected] = []
    for role, event in build.events:
        encoded = wire.encode_event(event)
        try:
            checked.append((role, wire.decode_event(encoded, max_bytes=max_event_bytes), encoded))
        except WireError as exc:
            rejected.append(Rejected(exc.reason, f"the {role} event of a span: {exc.detail}"))
    return checked, rejected


def _order(item: tuple[str, str, wire.Event]) -> tuple[int, datetime, int, str]:
    role, span_id, event = item
    group = 0 if role == "start" else 2 if role == "end" else 1
    return group, event.ts, _RANK[role], span_id


def order_trace(events: list[tuple[str, str, wire.Event]]) -> list[wire.Event]:
    """``(role, span_id, event)`` of one run, de-duplicated by event id and numbered by
    the module docstring's order (``seq`` from 0)."""
    return [msgspec.structs.replace(event, seq=seq) for seq, event in enumerate(trace_order(events))]


def trace_order(events: list[tuple[str, str, wire.Event]]) -> list[wire.Event]:
    """The events of :func:`order_trace` in its order, not numbered (``seq`` as mapped, 0)."""
    unique = {event.event_id: (role, span_id, event) for role, span_id, event in events}
    return [event for _, _, event in sorted(unique.values(), key=_order)]
