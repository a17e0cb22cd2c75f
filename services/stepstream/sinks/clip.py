"""The port-level clip: every deep record is cut to the caps before a backend sees it.

The caps and the clip itself belong to ``core.caps`` (``clip(text, cap)`` and
``clip_deep(record, limits)``, with ``Limits`` from ``core.fold``). Until that
module lands, :func:`_fallback_clip_deep` below implements the same contract so
the sinks can be built and tested; the lead removes it when ``core.caps`` exists.

The contract both honour:

* ``arguments`` <= 32,768 characters, ``output`` and ``reasoning`` <= 65,536,
  counted in code points (Python ``str``), so a clip never splits UTF-8;
* a clipped body ends with a visible marker *inside* the cap and sets the
  sticky ``clipped`` flag; a body within its cap is untouched;
* ``reasoning`` is positional: a chunk at ``reasoning_offset`` N is cut so
  that ``N + len(chunk) <= cap``; a chunk that starts too late to carry even the
  marker is moved back so the marker ends exactly at the cap. The result depends
  on the record only, so clipping a replayed chunk gives the same write.
"""

from __future__ import annotations

import msgspec

from stepstream.core.records import DeepRecord

REASONING_CAP = 65_536
OUTPUT_CAP = 65_536
ARGUMENTS_CAP = 32_768
CLIP_MARKER = "\n[... clipped by stepstream]"

try:  # pragma: no cover - depends on which helper's work has landed
    from stepstream.core.caps import clip_deep as _core_clip_deep  # type: ignore[attr-defined]
    from stepstream.core.fold import Limits as _CoreLimits  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    _core_clip_deep = None
    _CoreLimits = None


def _clip(text: str, cap: int) -> tuple[str, bool]:
    if len(text) <= cap:
        return text, False
    return text[: max(cap - len(CLIP_MARKER), 0)] + CLIP_MARKER, True


def _clip_reasoning(offset: int, text: str, cap: int) -> tuple[int, str, bool]:
    if offset + len(text) <= cap:
        return offset, text, False
    marker_at = max(cap - len(CLIP_MARKER), 0)
    if offset <= marker_at:
        return offset, text[: marker_at - offset] + CLIP_MARKER, True
    return marker_at, CLIP_MARKER, True


def _fallback_clip_deep(record: DeepRecord) -> DeepRecord:
    changes: dict[str, object] = {}
    clipped = False
    if record.reasoning is not None:
        offset, text, cut = _clip_reasoning(record.reasoning_offset, record.reasoning, REASONING_CAP)
        if cut:
            changes["reasoning"], changes["reasoning_offset"], clipped = text, offset, True
    for name, cap in (("arguments", ARGUMENTS_CAP), ("output", OUTPUT_CAP)):
        value = getattr(record, name)
        if value is not None:
            text, cut = _clip(value, cap)
            if cut:
                changes[name], clipped = text, True
    if not clipped:
        return record
    changes["clipped"] = True
    return msgspec.structs.replace(record, **changes)


def clip_deep_for_port(record: DeepRecord, limits: object | None = None) -> DeepRecord:
    """``record`` cut to the caps (``limits``: a ``core.fold.Limits``, default caps
    when ``None``). Returns ``record`` itself when nothing needed cutting."""
    if _core_clip_deep is not None:
        return _core_clip_deep(record, limits if limits is not None else _CoreLimits())
    return _fallback_clip_deep(record)
