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
compact JSON text (:func:`json_body_bytes`, ``Limits.environment_bytes``): a value
within the cap is kept structured, one over it becomes the head of its text ending
with the marker, at most the cap in bytes, cut on a character boundary.

The engine clips before it emits; :func:`clip_deep` lets a sink enforce the same
caps on any record it is handed (a no-op on records the engine produced).
"""

from __future__ import annotations

from typing import Any

import msgspec

from stepstream.core.limits import Limits
from stepstream.core.records import DeepRecord


__all__ = ["CLIP_MARKER", "clip", "clip_bytes", "clip_chunk", "clip_deep", "json_body", "json_body_bytes", "json_text"]

CLIP_MARKER = "\u2026[clipped]"
_M = len(CLIP_MARKER)
_MARKER_BYTES = CLIP_MARKER.encode()
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


def clip_bytes(text: str, cap: int) -> tuple[str, bool]:
    """``(text, False)`` if its UTF-8 encoding fits in ``cap`` bytes, else its head
    plus the marker, at most ``cap`` bytes, cut on a character boundary, and ``True``."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= cap:
        return text, False
    marker = _MARKER_BYTES[: _boundary(_MARKER_BYTES, cap)]
    keep = _boundary(data, cap - len(marker))
    return (data[:keep] + marker).decode("utf-8", "surrogatepass"), True


def _boundary(data: bytes, cut: int) -> int:
    """The largest character boundary of UTF-8 ``data`` at or below ``cut``."""
    if cut >= len(data):
        return len(data)
    while cut > 0 and data[cut] & 0xC0 == 0x80:  # a continuation byte: inside a character
        cut -= 1
    return cut


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


def json_body_bytes(value: Any, cap: int) -> tuple[Any, bool]:
    """:func:`json_body` with the cap in UTF-8 bytes: ``value`` itself when a string's
    UTF-8 or any other value's compact JSON text fits in ``cap`` bytes, else that
    text clipped by :func:`clip_bytes`, as a string."""
    if type(value) is str:
        return clip_bytes(value, cap)
    data = _encoder.encode(value)
    if len(data) <= cap:
        return value, False
    return clip_bytes(data.decode(), cap)


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
