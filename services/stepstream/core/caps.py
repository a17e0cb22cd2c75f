"""Caps on deep bodies, in characters: clip, never refuse.

* ``reasoning`` 65,536, ``output`` 65,536, ``arguments`` 32,768 characters
  (``core.limits.Limits`` holds the numbers).
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

The engine clips before it emits; :func:`clip_deep` lets a sink enforce the same
caps on any record it is handed (a no-op on records the engine produced).
"""

from __future__ import annotations

from typing import Any

import msgspec

from stepstream.core.limits import Limits
from stepstream.core.records import DeepRecord


__all__ = ["CLIP_MARKER", "clip", "clip_chunk", "clip_deep", "json_body", "json_text"]

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


def json_body(value: Any, cap: int) -> tuple[str, bool]:
    """``value`` as JSON text, clipped to ``cap`` characters."""
    return clip(json_text(value), cap)


def clip_deep(record: DeepRecord, limits: Limits) -> DeepRecord:
    """``record`` with every body within ``limits``; ``clipped`` set if anything
    was cut. Returns ``record`` itself when nothing needs clipping."""
    changes: dict[str, Any] = {}
    if record.arguments is not None:
        text, cut = clip(record.arguments, limits.arguments_chars)
        if cut:
            changes["arguments"] = text
    if record.output is not None:
        text, cut = clip(record.output, limits.output_chars)
        if cut:
            changes["output"] = text
    if record.reasoning is not None:
        text, offset, cut = clip_chunk(record.reasoning, record.reasoning_offset, limits.reasoning_chars)
        if cut:
            changes["reasoning"] = text
            changes["reasoning_offset"] = offset
    if not changes:
        return record
    changes["clipped"] = True
    return msgspec.structs.replace(record, **changes)
