"""Raw event, wire format v1 (CONTRACT.md section 1): what agents publish.

One JSON object per Kafka message value, UTF-8. The event types form a msgspec
tagged union on ``type``; every event shares the envelope fields of
:class:`_Envelope` and carries a per-type ``payload`` Struct.

:func:`decode_event` is the one decoder: it returns an :data:`Event` or raises
:class:`~stepstream.errors.WireError` whose ``reason`` names what was wrong
(one of :data:`DECODE_REASONS`). It never raises anything else for any bytes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Union

import msgspec

from stepstream.errors import WireError

WIRE_VERSION = 1

EventId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
CompanyId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._-]{1,64}$")]
RunId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]
Seq = Annotated[int, msgspec.Meta(ge=0)]
# RFC 3339 with an explicit offset; normalised to UTC by the engine.
Timestamp = Annotated[datetime, msgspec.Meta(tz=True)]
CallId = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class Usage(msgspec.Struct, forbid_unknown_fields=False, omit_defaults=True):
    input_tokens: Annotated[int, msgspec.Meta(ge=0)] = 0
    output_tokens: Annotated[int, msgspec.Meta(ge=0)] = 0
    reasoning_tokens: Annotated[int, msgspec.Meta(ge=0)] = 0


class RunStartPayload(msgspec.Struct, omit_defaults=True):
    agent_name: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    environment: str | None = None
    metadata: dict[str, Any] | None = None


class LlmRequestPayload(msgspec.Struct, omit_defaults=True):
    call_id: CallId
    provider: str
    model: str
    input: Any
    params: dict[str, Any] | None = None


class LlmResponsePayload(msgspec.Struct, omit_defaults=True):
    call_id: CallId
    output: Any
    usage: Usage | None = None
    stop_reason: str | None = None


class ThinkingDeltaPayload(msgspec.Struct):
    text: str


class ToolCallPayload(msgspec.Struct):
    call_id: CallId
    tool: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    arguments: dict[str, Any]


class ToolResultPayload(msgspec.Struct, omit_defaults=True):
    call_id: CallId
    output: Any
    is_error: bool = False


class StateChangePayload(msgspec.Struct):
    key: str
    value: Any


class ErrorPayload(msgspec.Struct, omit_defaults=True):
    message: str
    kind: str | None = None


class RunEndPayload(msgspec.Struct, omit_defaults=True):
    status: Literal["completed", "failed"]
    failure: str | None = None


class _Envelope(msgspec.Struct, tag_field="type", omit_defaults=True, kw_only=True):
    v: Literal[1]
    event_id: EventId
    company_id: CompanyId
    run_id: RunId
    seq: Seq
    ts: Timestamp
    parent_id: str | None = None


class RunStart(_Envelope, tag="run_start", kw_only=True):
    payload: RunStartPayload


class LlmRequest(_Envelope, tag="llm_request", kw_only=True):
    payload: LlmRequestPayload


class LlmResponse(_Envelope, tag="llm_response", kw_only=True):
    payload: LlmResponsePayload


class ThinkingDelta(_Envelope, tag="thinking_delta", kw_only=True):
    payload: ThinkingDeltaPayload


class ToolCall(_Envelope, tag="tool_call", kw_only=True):
    payload: ToolCallPayload


class ToolResult(_Envelope, tag="tool_result", kw_only=True):
    payload: ToolResultPayload


class StateChange(_Envelope, tag="state_change", kw_only=True):
    payload: StateChangePayload


class Error(_Envelope, tag="error", kw_only=True):
    payload: ErrorPayload


class RunEnd(_Envelope, tag="run_end", kw_only=True):
    payload: RunEndPayload


Event = Union[
    RunStart,
    LlmRequest,
    LlmResponse,
    ThinkingDelta,
    ToolCall,
    ToolResult,
    StateChange,
    Error,
    RunEnd,
]
EVENT_TYPES: tuple[type, ...] = Event.__args__  # type: ignore[attr-defined]
EVENT_TYPE_NAMES: tuple[str, ...] = tuple(t.__struct_config__.tag for t in EVENT_TYPES)

# Reasons a message is rejected; they name the dead-letter header and the metric label.
DECODE_REASONS = (
    "not_utf8",
    "not_json",
    "not_object",
    "unknown_type",
    "missing_field",
    "wrong_type",
    "bad_id",
    "bad_version",
    "invalid_value",
    "oversize",
)

_decoder = msgspec.json.Decoder(Event)
_encoder = msgspec.json.Encoder()

_ID_FIELDS = ("`$.event_id`", "`$.company_id`", "`$.run_id`")


def _classify(exc: msgspec.ValidationError) -> str:
    msg = str(exc)
    if msg.startswith("Object missing required field"):
        return "missing_field"
    if "at `$.type`" in msg:
        return "unknown_type"
    if "at `$.v`" in msg:
        return "bad_version" if msg.startswith("Invalid enum value") else "wrong_type"
    if msg.startswith("Expected `object`, got") and " - at " not in msg:
        return "not_object"
    if msg.startswith("Expected `str` matching regex") or (
        msg.startswith("Expected `str` of length") and msg.endswith(_ID_FIELDS)
    ):
        return "bad_id"
    if msg.startswith("Expected `") and ", got `" in msg:
        return "wrong_type"
    return "invalid_value"


def decode_event(data: bytes | bytearray | memoryview | str, *, max_bytes: int | None = None) -> Event:
    """Decode one wire message into an :data:`Event`.

    Raises :class:`WireError` (never anything else) with ``reason`` one of
    :data:`DECODE_REASONS` and a message naming the offending field.
    ``max_bytes`` rejects larger messages as ``oversize`` before parsing.
    """
    if max_bytes is not None and len(data) > max_bytes:
        raise WireError("oversize", f"message is {len(data)} bytes, limit {max_bytes}")
    try:
        return _decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise WireError(_classify(exc), str(exc)) from None
    except msgspec.DecodeError as exc:
        msg = str(exc)
        reason = "not_utf8" if "UTF-8" in msg else "not_json"
        raise WireError(reason, msg) from None
    except (UnicodeDecodeError, ValueError, TypeError) as exc:  # defensive: str input, odd buffers
        raise WireError("not_json", str(exc)) from None


def encode_event(event: Event) -> bytes:
    """Encode an event back to wire bytes (used by the emitter and tests)."""
    return _encoder.encode(event)


def partition_key(company_id: str, run_id: str) -> bytes:
    """Kafka key: ``{company_id}/{run_id}``, so one run stays on one partition, in order."""
    return f"{company_id}/{run_id}".encode()
