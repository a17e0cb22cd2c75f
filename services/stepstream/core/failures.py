"""A run_end's ``failure``, whatever its shape, as the run record's :class:`Failure`.

A run_end is never refused for the shape of its failure: the status the agent sent
is the fact that matters, and refusing the event would leave the run ``running`` for
ever. What the failure says is kept, credential-masked and clipped:

============================================  =========================================
the failure                                   the run record's failure (and the count)
============================================  =========================================
absent, on a ``failed`` run_end               type ``unknown``, message
                                              ``the run_end gave no failure`` (``missing``)
a string                                      type ``unknown``, the string as message
``{type, message, step?}``                    as it is
an object without a usable ``type``           the first non-empty string (or number) of
                                              ``kind``, ``code``, ``name``, ``error_type``
                                              as the type, else ``unknown`` (``untyped``)
an object without a string ``message``        the first string of ``message``,
                                              ``error``, ``detail``, ``reason``,
                                              ``description``, else the object's compact
                                              JSON (``untyped`` if it had no type either,
                                              else ``malformed``)
``step`` not an integer in [0, 2**53 - 1]     dropped (``malformed``)
anything else (a number, a list, a boolean)   type ``unknown``, its compact JSON as the
                                              message (``malformed``)
============================================  =========================================

The count is ``stepstream_run_failures_coerced_total{shape}`` (``missing``,
``untyped``, ``malformed``); a string or a well-formed object is not counted. Pure.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from stepstream.core.records import Failure
from stepstream.core.redact import TEXT_CHARS, scrub

__all__ = ["NO_FAILURE", "Coerced", "coerce_failure"]

NO_FAILURE = "the run_end gave no failure"
UNKNOWN = "unknown"
MAX_STEP = 2**53 - 1
TYPE_KEYS = ("type", "kind", "code", "name", "error_type")
MESSAGE_KEYS = ("message", "error", "detail", "reason", "description")

Coerced = Literal["missing", "untyped", "malformed"]

_encoder = msgspec.json.Encoder()


def coerce_failure(status: str, failure: Any) -> tuple[Failure | None, Coerced | None]:
    """The run record's failure for a run_end of ``status`` carrying ``failure`` (any
    decoded JSON value, or a ``wire.FailurePayload`` built in process), and how it was
    coerced (``None`` when it had the contract's shape, or was absent on a completed run)."""
    if failure is None:
        return (Failure(type=UNKNOWN, message=NO_FAILURE), "missing") if status == "failed" else (None, None)
    if isinstance(failure, str):
        return Failure(type=UNKNOWN, message=scrub(failure, TEXT_CHARS)), None
    if isinstance(failure, msgspec.Struct):
        failure = msgspec.to_builtins(failure)
    if not isinstance(failure, dict):
        return Failure(type=UNKNOWN, message=_text(failure)), "malformed"
    coerced: Coerced | None = None
    kind = _first(failure, ("type",))
    if kind is None:
        coerced = "untyped"
        kind = _first(failure, TYPE_KEYS) or UNKNOWN
    message = failure.get("message")
    if not isinstance(message, str):
        message = _first(failure, MESSAGE_KEYS, numbers=False)
        if message is None:
            message = _text(failure)
        coerced = coerced or "malformed"
    step = failure.get("step")
    if step is not None and not (type(step) is int and 0 <= step <= MAX_STEP):
        step = None
        coerced = coerced or "malformed"
    return Failure(type=scrub(kind), message=scrub(message, TEXT_CHARS), step=step), coerced


def _first(failure: dict[str, Any], keys: tuple[str, ...], *, numbers: bool = True) -> str | None:
    """The first value under ``keys`` that names something: a non-blank string, or
    (for types: an HTTP status or an errno is a fine type) an integer."""
    for key in keys:
        value = failure.get(key)
        if isinstance(value, str) and value.strip():
            return value
        if numbers and type(value) is int:
            return str(value)
    return None


def _text(value: Any) -> str:
    """A value as text an operator may see: its compact JSON, masked and clipped."""
    try:
        text = _encoder.encode(scrub(value, TEXT_CHARS)).decode()
    except (TypeError, ValueError, OverflowError):  # not JSON-encodable in process: name its type only
        text = type(value).__name__
    return scrub(text, TEXT_CHARS)
