"""Raw event, wire format v1 (CONTRACT.md section 1): what agents publish.

One JSON object per Kafka message value, UTF-8. The event types form a msgspec
tagged union on ``type``; every event shares the envelope fields of
:class:`_Envelope` and carries a per-type ``payload`` Struct.

:func:`decode_event` is the one decoder: it returns an :data:`Event` or raises
:class:`~stepstream.errors.WireError` whose ``reason`` names what was wrong
(one of :data:`DECODE_REASONS`). It never raises anything else for any bytes.

**Bounds.** Whatever decodes can be folded and stored, so the wire types bound
what a fold or a store could not take (``docs/engine.md`` has the table):

* ``seq`` is in [0, :data:`MAX_SEQ`] (2**53 - 1, exact in every JSON reader);
* each ``usage`` count is in [0, :data:`MAX_TOKENS`] (10**12);
* ``ts`` is in the window of :mod:`stepstream.core.timefmt`
  (1970-01-01T00:00:00Z to 9999-12-30T00:00:00Z after conversion to UTC);

any of these outside its range is ``out_of_range``. A message nesting arrays and
objects more than :data:`MAX_NESTING` deep (the event object and its payload
count) is ``too_deep``: deeper values would make encoding them later hit
Python's recursion limit, at a depth that depends on the caller's stack.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Annotated, Any, Literal, Union

import msgspec

from stepstream.core.timefmt import TS_MAX, TS_MIN, WINDOW
from stepstream.errors import WireError

WIRE_VERSION = 1
MAX_SEQ = 2**53 - 1
MAX_TOKENS = 10**12
MAX_NESTING = 100

EventId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
# The end of the text. Not ``$``: in Python's ``re`` (so in msgspec, Litestar and
# Python's JSON Schema validators, which all ``search``) it also matches before a final
# newline, and ``acme\n`` would pass. A negative look-ahead is the end in every regex
# dialect a JSON Schema reader uses (ECMA 262 included). Patterns are matched whole.
END = r"(?![\s\S])"
COMPANY_ID_PATTERN = r"^[A-Za-z0-9._-]{1,64}" + END
RUN_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}" + END
CompanyId = Annotated[str, msgspec.Meta(pattern=COMPANY_ID_PATTERN)]
RunId = Annotated[str, msgspec.Meta(pattern=RUN_ID_PATTERN)]
Seq = Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)]
TokenCount = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKENS)]
# RFC 3339 with an explicit offset; normalised to UTC by the engine. The window
# (timefmt.TS_MIN..TS_MAX) is checked by decode_event: msgspec.Meta bounds only numbers.
Timestamp = Annotated[datetime, msgspec.Meta(tz=True)]
CallId = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class Usage(msgspec.Struct, forbid_unknown_fields=False, omit_defaults=True):
    input_tokens: TokenCount = 0
    output_tokens: TokenCount = 0
    reasoning_tokens: TokenCount = 0
    # Prompt tokens served from the provider's prompt cache, and written to it (a part of
    # input_tokens or beside it, as the provider counts them; carried as given). Optional:
    # an older reader ignores them (forbid_unknown_fields=False).
    cache_read_input_tokens: TokenCount = 0
    cache_creation_input_tokens: TokenCount = 0


class RunStartPayload(msgspec.Struct, omit_defaults=True):
    agent_name: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    # Any JSON object (the ``.sftrace`` manifest's shape); a string is accepted too.
    environment: dict[str, Any] | str | None = None
    metadata: dict[str, Any] | None = None
    # The conversation or session the run belongs to (OpenTelemetry's gen_ai.conversation.id
    # or session.id); the run record keeps it, credential-masked.
    session_id: Annotated[str, msgspec.Meta(max_length=256)] | None = None


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


class FailurePayload(msgspec.Struct, omit_defaults=True):
    """Why a run failed, as the ``.sftrace`` manifest has it: ``step`` is the
    agent's own step number, if it gave one."""

    type: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    message: str
    step: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)] | None = None


class RunEndPayload(msgspec.Struct, omit_defaults=True):
    status: Literal["completed", "failed"]
    # The contract's shape is :class:`FailurePayload` (required when ``status`` is
    # failed; a string is accepted as the message), but a run_end is never refused for
    # the shape of its failure: any JSON value is taken, and ``core.failures`` maps it
    # to the run record's failure (a missing one is type ``unknown``).
    failure: Annotated[
        Any,
        msgspec.Meta(
            description="Why the run failed: {type, message, step?} (or a string, the message); any other shape is "
            "kept as what it says (type from kind/code/name, else unknown), never refused"
        ),
    ] = None


class RunClosePayload(msgspec.Struct, omit_defaults=True):
    """A close the compactor publishes for a run that went silent (see :class:`RunClose`)."""

    status: Literal["abandoned"]
    reason: Annotated[str, msgspec.Meta(max_length=256)] | None = None


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


class RunClose(_Envelope, tag="run_close", kw_only=True):
    """Published by ``stepstream compactor`` (never by an agent) under the run's key.

    It takes no ``seq`` of the run: its ``seq`` names the last agent ``seq`` the
    compactor saw applied, and the fold applies the close only if that is still the
    run's last applied ``seq`` and the run is ``running`` (``core.fold``)."""

    payload: RunClosePayload


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
    RunClose,
]
EVENT_TYPES: tuple[type, ...] = Event.__args__  # type: ignore[attr-defined]
EVENT_TYPE_NAMES: tuple[str, ...] = tuple(t.__struct_config__.tag for t in EVENT_TYPES)

# Reasons a message is rejected; they name the dead-letter header and the metric label
# (docs/engine.md says when each applies). The first ones come from decode_event;
# ``seq_jump`` from RunFold.push; ``bad_key`` and ``unfoldable`` from the worker.
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
    "out_of_range",  # a number or time outside its bound (see the module docstring)
    "too_deep",  # nested deeper than MAX_NESTING
    "oversize",
    "seq_jump",  # seq more than Limits.max_seq_jump past the run's last applied seq
    "bad_key",  # the Kafka key is not {company_id}/{run_id} of the decoded event
    "unfoldable",  # the fold raised something other than a WireError
)

_decoder = msgspec.json.Decoder(Event)
_encoder = msgspec.json.Encoder()

_ID_FIELDS = ("`$.event_id`", "`$.company_id`", "`$.run_id`")
_OUT_OF_RANGE = ("Expected `int` >=", "Expected `int` <=", "Number out of range")

# The payload fields that hold arbitrary JSON: the only place a decoded event can nest
# deeper than its own Structs. A unit test checks this against the payload annotations.
JSON_FIELDS: dict[type, tuple[str, ...]] = {
    RunStart: ("environment", "metadata"),
    LlmRequest: ("input", "params"),
    LlmResponse: ("output",),
    ToolCall: ("arguments",),
    ToolResult: ("output",),
    StateChange: ("value",),
    RunEnd: ("failure",),
}


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
    if msg.startswith(_OUT_OF_RANGE):
        return "out_of_range"
    if msg.startswith("Expected `") and ", got `" in msg:
        return "wrong_type"
    return "invalid_value"


def _without_value(msg: str) -> str:
    """``msg`` without the rejected value msgspec quotes for an enum or a tag
    (``Invalid enum value 'x' - at `$.v```): no message quotes one (CONTRACT.md section 2)."""
    for kind in ("Invalid enum value ", "Invalid value "):
        if msg.startswith(kind):
            _, at, path = msg.rpartition(" - at `")
            return kind.rstrip() + (at + path if at else "")
    return msg


_NOT_OPENERS = bytes(b for b in range(256) if b not in b"[{")  # translate() deletes these


def _openers(data: bytes | bytearray | memoryview | str) -> int:
    """How many ``[`` and ``{`` the message holds (in strings too): no value in it can
    nest deeper than that. One pass in C (``translate`` is faster than two ``count``)."""
    if isinstance(data, str):
        return data.count("[") + data.count("{")
    if isinstance(data, memoryview):
        data = data.tobytes()
    return len(data.translate(None, _NOT_OPENERS))


def _nests_deeper(data: bytes | bytearray | memoryview | str, event: Event, fields: tuple[str, ...]) -> bool:
    """Whether ``event`` (decoded from ``data``) nests more than MAX_NESTING levels of
    arrays and objects. The event object is level 1, its payload level 2."""
    if _openers(data) <= MAX_NESTING:
        return False  # the common case needs no walk
    payload = event.payload
    stack = [(value, 3) for value in (getattr(payload, name) for name in fields) if type(value) in (dict, list)]
    while stack:
        node, level = stack.pop()
        for item in node.values() if type(node) is dict else node:
            if type(item) is dict or type(item) is list:  # what msgspec decodes JSON containers to
                if level >= MAX_NESTING:
                    return True
                stack.append((item, level + 1))
    return False


def decode_event(data: bytes | bytearray | memoryview | str, *, max_bytes: int | None = None) -> Event:
    """Decode one wire message into an :data:`Event`.

    Raises :class:`WireError` (never anything else) with ``reason`` one of
    :data:`DECODE_REASONS` and a message naming the offending field (never its value).
    ``max_bytes`` rejects larger messages as ``oversize`` before parsing.
    An event this returns is inside every bound of the module docstring.
    """
    if max_bytes is not None and len(data) > max_bytes:
        raise WireError("oversize", f"message is {len(data)} bytes, limit {max_bytes}")
    try:
        event: Event = _decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise WireError(_classify(exc), _without_value(str(exc))) from None
    except msgspec.DecodeError as exc:
        msg = str(exc)
        reason = "not_utf8" if "UTF-8" in msg else "not_json"
        raise WireError(reason, msg) from None
    except RecursionError:
        raise WireError("too_deep", f"nested more than {MAX_NESTING} levels of arrays and objects") from None
    except (UnicodeDecodeError, ValueError, TypeError) as exc:  # defensive: str input, odd buffers
        raise WireError("not_json", str(exc)) from None
    ts = event.ts
    if ts < TS_MIN or ts > TS_MAX:
        raise WireError("out_of_range", f"Expected a time {WINDOW} (in UTC) - at `$.ts`")
    fields = JSON_FIELDS.get(type(event))
    if fields is not None and _nests_deeper(data, event, fields):
        raise WireError("too_deep", f"nested more than {MAX_NESTING} levels of arrays and objects - at `$.payload`")
    return event


def encode_event(event: Event) -> bytes:
    """Encode an event back to wire bytes (used by the emitter and tests)."""
    return _encoder.encode(event)


_SEQ_ZERO = b',"seq":0,"ts":'


def renumbered(encoded: bytes, seq: int) -> bytes:
    """``encoded``, the :func:`encode_event` bytes of an event with ``seq`` 0, with ``seq``
    instead: the bytes of ``encode_event(msgspec.structs.replace(event, seq=seq))``, without
    encoding the event again. The envelope's fields are encoded in their declared order,
    and each one before ``seq`` is a number or a string, inside which ``,"seq":0,"ts":``
    cannot appear (its quotes would be escaped): the first one is the envelope's.
    Raises ``ValueError`` for bytes without it."""
    head, found, tail = encoded.partition(_SEQ_ZERO)
    if not found:
        raise ValueError("not the bytes of an event with seq 0")
    return b"".join((head, b',"seq":', str(seq).encode(), b',"ts":', tail))


# Events whose id starts so carry no agent seq: the fold numbers them on arrival and
# skips a redelivery by id (core.fold.RunFold.push). Made by the OTLP stage from spans.
UNSEQUENCED = "otlp:"


def id_hash(event_id: str) -> int:
    """A stable 53-bit hash of an event id (exact as a JSON number in every reader)."""
    return int.from_bytes(hashlib.blake2b(event_id.encode(), digest_size=8).digest(), "big") >> 11


def partition_key(company_id: str, run_id: str) -> bytes:
    """Kafka key: ``{company_id}/{run_id}``, so one run stays on one partition, in order."""
    return f"{company_id}/{run_id}".encode()
