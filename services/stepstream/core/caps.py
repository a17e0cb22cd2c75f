"""Caps on deep bodies, in characters of what a reader sees: clip, never refuse.

* ``reasoning`` 65,536, ``output`` 65,536, ``arguments`` 32,768 characters
  (``core.limits.Limits`` holds the numbers).
* **What is counted** (:func:`json_body`): a string body by its characters (it is
  stored as the string, so 11,000 control characters are 11,000 characters, not
  their 66,000-character JSON escapes); any other JSON value by its compact JSON
  text (``msgspec``: no spaces, non-ASCII kept, control characters escaped).
* **What is stored**: a body within its cap is the value itself (a string, an
  object, an array, a number...), so an export can hash it. A body over its cap
  is a *string*: the head of what a reader sees (the string, or the value's
  compact JSON text) ending with :data:`CLIP_MARKER`, and the record's sticky
  ``clipped`` flag is set. Either way the body is a valid JSON value.
* A body over its cap keeps its head and ends with :data:`CLIP_MARKER`; the
  marker is counted *within* the cap, so a clipped body is exactly ``cap``
  characters long and clipping it again changes nothing (:func:`clip` is
  idempotent).
* Clipping is by Python ``str`` index, i.e. by code point, so a body is never
  split inside a character and always encodes to valid UTF-8 (it can split a
  grapheme cluster such as a flag or a ZWJ emoji sequence, which is still valid
  text).
* ``reasoning`` is written in positional chunks (see ``core.records``):
  :func:`clip_chunk` clips one chunk so that ``offset + len(chunk) <= cap``, which
  makes the stored text equal ``clip(all_text, cap)`` whatever the chunking.

The run record's ``environment`` is capped the same way but in UTF-8 bytes of its
compact JSON text as stored (:func:`json_body_bytes`, ``Limits.environment_bytes``):
a value within the cap is kept structured; one over it becomes a string, the head of
its text ending with the marker, whose own JSON (quotes and escapes included) is
within the cap.

The engine clips before it emits; :func:`clip_deep` lets a sink enforce the same
caps on any record it is handed (a no-op on records the engine produced).
"""

from __future__ import annotations

from typing import Any

import msgspec

from stepstream.core.limits import Limits
from stepstream.core.records import DeepRecord


__all__ = [
    "CLIP_MARKER", "clip", "clip_chunk", "clip_deep", "json_body", "json_body_bytes", "json_text", "stored_body",
]  # fmt: skip

CLIP_MARKER = "\u2026[clipped]"
_M = len(CLIP_MARKER)
_encoder = msgspec.json.Encoder()


def _tail_marker(cap: int) -> str:
    return CLIP_MARKER if cap >= _M else CLIP_MARKER[:cap]


def clip(text: str, cap: int) -> tuple[str, bool]:
    """``(text, False)`` if it fits in ``cap`` characters, else its head plus the
    marker, exactly ``cap`` characters long, and ``True``."""
    if len(text) <= cap:
        return text, False
    marker = _tail_marker(cap)
    return text[: cap - len(marker)] + marker, True


def clip_chunk(chunk: str, offset: int, cap: int) -> tuple[str, int, bool]:
    """Clip a positional chunk written at ``offset``: returns ``(chunk, offset,
    clipped)`` with ``offset + len(chunk) <= cap``. When the marker must start
    before ``offset`` (the durable text already reaches into the marker's room),
    the returned offset moves back so that the stored text becomes
    ``text[:cap - len(marker)] + marker`` all the same."""
    if offset + len(chunk) <= cap:
        return chunk, offset, False
    marker = _tail_marker(cap)
    keep = cap - len(marker)
    if offset <= keep:
        return chunk[: keep - offset] + marker, offset, True
    return marker, keep, True


def json_text(value: Any) -> str:
    """``value`` as JSON text (a string becomes its JSON string literal)."""
    return _encoder.encode(value).decode()


def json_body(value: Any, cap: int) -> tuple[Any, bool]:
    """``(body, clipped)``: ``value`` itself when what a reader sees of it fits in
    ``cap`` characters (a string by its characters, anything else by its compact
    JSON text), else that text's head plus the marker, as a string."""
    if type(value) is str:
        return clip(value, cap)
    text = json_text(value)
    if len(text) <= cap:
        return value, False
    return clip(text, cap)


def stored_body(value: Any, cap: int) -> tuple[str, bool]:
    """``(text, clipped)``: the JSON text of ``json_body(value, cap)`` (what a store
    holds for the body) and whether it was cut, with ``value`` encoded once: a body
    within its cap, the common case, is measured by the very text that is stored."""
    if type(value) is str:
        if len(value) <= cap:
            return _encoder.encode(value).decode(), False
        return _encoder.encode(clip(value, cap)[0]).decode(), True
    text = _encoder.encode(value).decode()
    if len(text) <= cap:
        return text, False
    return _encoder.encode(clip(text, cap)[0]).decode(), True


def json_body_bytes(value: Any, cap: int) -> tuple[Any, bool]:
    """``(body, clipped)`` with the cap in UTF-8 bytes of the body's compact JSON text,
    as a store holds it: ``value`` itself when that fits in ``cap`` bytes, else the
    longest head of what a reader sees (a string, or the value's compact JSON text)
    plus the marker whose JSON string (quotes and escapes included) fits, as a string.
    A cap too small for the marker keeps the empty string."""
    data = _encoder.encode(value)
    if len(data) <= cap:
        return value, False
    text = value if type(value) is str else data.decode()
    # The encoded length grows with the head, so the longest head that fits is a bisection.
    low, high = -1, min(len(text), cap)
    while low < high:
        middle = (low + high + 1) // 2
        if len(_encoder.encode(text[:middle] + CLIP_MARKER)) <= cap:
            low = middle
        else:
            high = middle - 1
    return ("" if low < 0 else text[:low] + CLIP_MARKER), True


def _clip_body(body: Any, cap: int) -> tuple[Any, bool]:
    # json_body, but a string already at most the cap (the engine's clip) costs nothing.
    if type(body) is str and len(body) <= cap:
        return body, False
    return json_body(body, cap)


def clip_deep(record: DeepRecord, limits: Limits) -> DeepRecord:
    """``record`` with every body within ``limits``; ``clipped`` set if anything
    was cut. Returns ``record`` itself when nothing needs clipping."""
    changes: dict[str, Any] = {}
    if record.arguments is not None:
        body, cut = _clip_body(record.arguments, limits.arguments_chars)
        if cut:
            changes["arguments"] = body
    if record.output is not None:
        body, cut = _clip_body(record.output, limits.output_chars)
        if cut:
            changes["output"] = body
    if record.reasoning is not None:
        text, offset, cut = clip_chunk(record.reasoning, record.reasoning_offset, limits.reasoning_chars)
        if cut:
            changes["reasoning"] = text
            changes["reasoning_offset"] = offset
    if not changes:
        return record
    changes["clipped"] = True
    return msgspec.structs.replace(record, **changes)
