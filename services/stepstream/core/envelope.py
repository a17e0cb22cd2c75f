"""The envelope of one event, as the deep side keeps it for a ``.sftrace`` export.

A step's body (``DeepRecord.arguments``/``output``/``reasoning``) is not enough
to write its events again: the bundle also needs each event's id, parent,
timestamp and type, and for LLM calls the provider, model, params, usage and stop
reason. :func:`envelope` takes those from a wire event into a small JSON object,
stored in ``DeepRecord.call_event`` (the opening event) or ``result_event``.

**Bounds** (the same as the bodies', so a hostile event cannot grow a row):

* ids are at most 128 characters on the wire already; a ``parent_id`` longer than
  that is not an id any event can have, so it is kept as ``None``;
* ``provider``, ``model``, ``tool``, ``stop_reason``, a state ``key`` and an error
  ``kind`` are clipped to :data:`~stepstream.core.redact.LABEL_CHARS`;
* ``params`` is a JSON value clipped like an argument body
  (``core.caps.json_body`` at ``Limits.arguments_chars``), with ``params_clipped``
  set when it was cut;
* ``usage`` holds three bounded integers.

Envelopes hold what the agent sent, unredacted, like the bodies beside them: the
deep store is the unredacted side. The export redacts what it writes.
"""

from __future__ import annotations

from typing import Any

from stepstream.core import wire
from stepstream.core.caps import clip, json_body
from stepstream.core.limits import Limits
from stepstream.core.redact import LABEL_CHARS
from stepstream.core.timefmt import format_ts

__all__ = ["envelope"]

_MAX_ID = 128


def _label(text: str) -> str:
    return clip(text, LABEL_CHARS)[0]


def envelope(event: Any, limits: Limits, at: str | None = None) -> dict[str, Any]:
    """The bounded envelope of ``event`` (module docstring); ``at``: its ts, formatted already."""
    ts = format_ts(event.ts) if at is None else at
    env: dict[str, Any] = {"id": event.event_id, "type": type(event).__struct_config__.tag, "seq": event.seq, "ts": ts}
    parent = event.parent_id
    if parent is not None and 0 < len(parent) <= _MAX_ID:
        env["parent_id"] = parent
    p = event.payload
    kind = type(event)
    if kind is wire.LlmRequest:
        env["call_id"] = p.call_id
        env["provider"] = _label(p.provider)
        env["model"] = _label(p.model)
        if p.params is not None:
            params, cut = json_body(p.params, limits.arguments_chars)
            env["params"] = params
            if cut:
                env["params_clipped"] = True
    elif kind is wire.LlmResponse:
        env["call_id"] = p.call_id
        if p.usage is not None:
            u = p.usage
            env["usage"] = {
                "input_tokens": u.input_tokens,
                "output_tokens": u.output_tokens,
                "reasoning_tokens": u.reasoning_tokens,
            }
            # Only when counted: a step without cache tokens keeps the envelope it had.
            if u.cache_read_input_tokens:
                env["usage"]["cache_read_input_tokens"] = u.cache_read_input_tokens
            if u.cache_creation_input_tokens:
                env["usage"]["cache_creation_input_tokens"] = u.cache_creation_input_tokens
        if p.stop_reason is not None:
            env["stop_reason"] = _label(p.stop_reason)
    elif kind is wire.ToolCall:
        env["call_id"] = p.call_id
        env["tool"] = _label(p.tool)
    elif kind is wire.ToolResult:
        env["call_id"] = p.call_id
        env["status"] = "error" if p.is_error else "ok"
    elif kind is wire.StateChange:
        env["key"] = _label(p.key)
    elif kind is wire.Error:
        if p.kind is not None:
            env["kind"] = _label(p.kind)
    return env
