"""``stepstream replay BUNDLE --against EVENTS.jsonl``: the first divergence between
a recording and a new run's events.

Both sides are reduced to their *dependency calls* in order (``llm_request`` and
``tool_call``): the recording's from ``events.jsonl``, the live run's from its wire
events (``seq`` order). Each live input is normalized the way the export stored the
recorded one (clipped at the argument cap, ``core.caps.json_body``), redacted
(``core.redact``, replacement ``[REDACTED]``) and hashed under the canonical profile
(``core.canonical``). Position ``i`` compares, in this order:

``kind`` (an LLM call against a tool call), ``tool``, ``provider``, ``model``,
``input`` (the recorded ``input_hash`` against the live hash), and past the end of
either side ``missing`` / ``extra``. A reordering shows as the first position whose
call differs.

A recorded call without ``input_hash`` is compared by its stored input (hashed here):
the report lists those positions under ``computed`` and the result is never
``verified``, only ``match_unverified``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from stepstream.bundle.build import spell
from stepstream.core import wire
from stepstream.core.canonical import payload_hash
from stepstream.core.caps import json_body
from stepstream.core.limits import Limits
from stepstream.core.redact import redact

__all__ = ["Call", "Divergence", "ReplayReport", "live_calls", "recorded_calls", "replay"]


class Call(NamedTuple):
    kind: str  # "llm" or "tool"
    tool: str | None
    provider: str | None
    model: str | None
    input_hash: str
    computed: bool  # the hash was computed here (the recording had none)


class Divergence(NamedTuple):
    position: int
    field: str  # kind, tool, provider, model, input, missing, extra
    recorded: Any
    live: Any


class ReplayReport(NamedTuple):
    status: str  # verified, match_unverified, diverged
    calls: int
    divergence: Divergence | None
    computed: list[int]  # positions compared by a fingerprint computed here


def _hash_live(value: Any, limits: Limits) -> str:
    stored, _ = json_body(value, limits.arguments_chars)
    return payload_hash(spell(redact(stored).value))


def recorded_calls(bundle: str | Path) -> list[Call]:
    calls = []
    text = (Path(bundle) / "events.jsonl").read_text(encoding="utf-8")
    for line in text.split("\n"):
        if not line:
            continue
        e = json.loads(line)
        if e.get("type") not in ("llm_request", "tool_call"):
            continue
        stored = e.get("input_hash")
        computed = stored is None
        digest = payload_hash(e.get("input")) if computed else stored
        if e["type"] == "llm_request":
            calls.append(Call("llm", None, e.get("provider"), e.get("model"), digest, computed))
        else:
            calls.append(Call("tool", e.get("name"), None, None, digest, computed))
    return calls


def live_calls(events: list[wire.Event], limits: Limits = Limits()) -> list[Call]:
    calls = []
    for e in sorted(events, key=lambda ev: ev.seq):
        if type(e) is wire.LlmRequest:
            p = e.payload
            calls.append(Call("llm", None, p.provider, p.model, _hash_live(p.input, limits), False))
        elif type(e) is wire.ToolCall:
            p = e.payload
            calls.append(Call("tool", p.tool, None, None, _hash_live(p.arguments, limits), False))
    return calls


def replay(recorded: list[Call], live: list[Call]) -> ReplayReport:
    computed = [i for i, c in enumerate(recorded) if c.computed]
    for i, (r, l) in enumerate(zip(recorded, live)):
        for field, a, b in (
            ("kind", r.kind, l.kind),
            ("tool", r.tool, l.tool),
            ("provider", r.provider, l.provider),
            ("model", r.model, l.model),
            ("input", r.input_hash, l.input_hash),
        ):
            if field == "provider" and a is None and r.kind == "llm":
                continue  # the reference's provider is optional: a recording without one matches any
            if a != b:
                return ReplayReport("diverged", len(recorded), Divergence(i, field, a, b), computed)
    n = min(len(recorded), len(live))
    if len(recorded) > n:
        return ReplayReport("diverged", len(recorded), Divergence(n, "missing", recorded[n].kind, None), computed)
    if len(live) > n:
        return ReplayReport("diverged", len(recorded), Divergence(n, "extra", None, live[n].kind), computed)
    return ReplayReport("match_unverified" if computed else "verified", len(recorded), None, computed)
