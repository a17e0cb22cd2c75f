"""``stepstream import BUNDLE``: a ``.sftrace`` bundle (ours or one ``stepfork``
recorded) back into wire events, in bundle order, under a new run id unless one is
given. The events go to a JSON-lines file that ``ingest-file`` reads, or straight
through the same engine (``--ingest``).

The bundle is verified first (``bundle.verify``): ``verified`` and
``unverified_legacy`` bundles import; ``mismatch`` and ``invalid`` are refused.
The mapping is the export's, reversed (docs/bundle.md): a ``state_change`` with key
``stepstream.thinking`` becomes one ``thinking_delta``; a result's ``call_id`` is
the id of its call (its ``parent_id`` when that names a call of its kind, else the
oldest unanswered call of its kind); ``seq`` is the event's position. Payloads are
imported as the bundle holds them: redacted values stay ``[REDACTED]``.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from stepstream.bundle.build import THINKING_KEY
from stepstream.bundle.verify import verify_bundle
from stepstream.core import wire

__all__ = ["ImportRefused", "bundle_events", "new_run_id"]

_MAX_ID = 128


class ImportRefused(ValueError):
    """The bundle does not verify (mismatch or invalid), or holds what the wire cannot."""


def new_run_id() -> str:
    return f"imported-{uuid.uuid4().hex[:16]}"


def _event_id(ident: str) -> str:
    if 0 < len(ident) <= _MAX_ID:
        return ident
    return "sha256:" + hashlib.sha256(ident.encode("utf-8", "surrogatepass")).hexdigest()


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def bundle_events(path: str | Path, company_id: str, run_id: str | None = None) -> tuple[list[wire.Event], str]:
    """The wire events of the bundle at ``path`` and the verdict status."""
    verdict = verify_bundle(path)
    if verdict.status not in ("verified", "unverified_legacy"):
        raise ImportRefused(f"{verdict.status}: {verdict.message}")
    root = Path(path)
    manifest = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    records = [json.loads(line) for line in (root / "events.jsonl").read_text(encoding="utf-8").split("\n") if line]
    run_id = run_id or new_run_id()
    open_calls: dict[str, list[str]] = {"llm": [], "tool": []}
    kinds: dict[str, str] = {}
    out: list[wire.Event] = []
    for record in records:
        kind = record["type"]
        ident = _event_id(record["id"])
        parent = record.get("parent_id")
        env = {"v": 1, "event_id": ident, "company_id": company_id, "run_id": run_id, "seq": len(out),
               "ts": _ts(record["timestamp"]), "parent_id": _event_id(parent) if parent else None}  # fmt: skip
        kinds[ident] = kind

        def answer(family: str, call_type: str) -> str:
            calls = open_calls[family]
            pid = env["parent_id"]
            if pid is not None and kinds.get(pid) == call_type and pid in calls:
                calls.remove(pid)
                return pid
            return calls.pop(0) if calls else ident

        event: wire.Event | None
        if kind == "run_start":
            environment = manifest.get("environment") or None
            event = wire.RunStart(**env, payload=wire.RunStartPayload(agent_name=manifest["agent_name"],
                                                                       environment=environment))  # fmt: skip
        elif kind == "llm_request":
            open_calls["llm"].append(ident)
            event = wire.LlmRequest(**env, payload=wire.LlmRequestPayload(
                call_id=ident, provider=record.get("provider") or "unknown", model=record["model"],
                input=record.get("input")))  # fmt: skip
        elif kind == "llm_response":
            usage = None
            if record.get("prompt_tokens") is not None or record.get("completion_tokens") is not None:
                usage = wire.Usage(input_tokens=record.get("prompt_tokens") or 0,
                                   output_tokens=record.get("completion_tokens") or 0)  # fmt: skip
            event = wire.LlmResponse(**env, payload=wire.LlmResponsePayload(
                call_id=answer("llm", "llm_request"), output=record.get("output"), usage=usage))  # fmt: skip
        elif kind == "tool_call":
            open_calls["tool"].append(ident)
            args = record.get("input")
            event = wire.ToolCall(**env, payload=wire.ToolCallPayload(
                call_id=ident, tool=record["name"], arguments=args if isinstance(args, dict) else {"input": args}))  # fmt: skip
        elif kind == "tool_result":
            event = wire.ToolResult(**env, payload=wire.ToolResultPayload(
                call_id=answer("tool", "tool_call"), output=record.get("output"),
                is_error=record.get("status") == "error"))  # fmt: skip
        elif kind == "state_change":
            if record.get("key") == THINKING_KEY and isinstance(record.get("after"), str):
                event = wire.ThinkingDelta(**env, payload=wire.ThinkingDeltaPayload(text=record["after"]))
            else:
                event = wire.StateChange(**env, payload=wire.StateChangePayload(
                    key=record.get("key") or "state", value=record.get("after")))  # fmt: skip
        elif kind == "error":
            event = wire.Error(**env, payload=wire.ErrorPayload(message=record["message"],
                                                                kind=record.get("error_type")))  # fmt: skip
        else:  # run_end
            status = record.get("run_status")
            failure = None
            if status == "failed" and isinstance(manifest.get("failure"), dict):
                f = manifest["failure"]
                failure = wire.FailurePayload(type=f["type"], message=f["message"], step=f.get("step"))
            event = wire.RunEnd(**env, payload=wire.RunEndPayload(status=status, failure=failure))
        out.append(event)
    # Round-trip through the decoder: whatever the wire would refuse is refused here, with its reason.
    decoded = []
    for event in out:
        try:
            decoded.append(wire.decode_event(wire.encode_event(event)))
        except Exception as exc:  # WireError, or an encode error naming the field
            raise ImportRefused(f"event {event.event_id} cannot be a wire event: {exc}") from None
    return decoded, verdict.status
