"""A run as a ``.sftrace`` bundle: pure, from a RunRecord and its DeepRecords to bytes.

:func:`build_bundle` returns the bytes of every file (``docs/bundle.md`` is the
reader's description; this docstring is the mapping in short):

* one ``run_start`` (the run's own event id, or ``<run_id>:run_start`` when the
  run_start never arrived);
* per step, in step order: ``tool_call``/``tool_result``,
  ``llm_request``/``llm_response``, ``state_change`` (``key``, ``after``),
  ``error`` (``error_type`` = the agent's kind or ``error``), and a thinking step as
  one ``state_change`` with key :data:`THINKING_KEY` and the text as ``after``;
* for a failed run with no error event, one ``error`` carrying the run's failure;
* ``run_end`` unless the run is still running.

Every payload is redacted (``core.redact``), the replacement spelled
:data:`BUNDLE_REDACTED`, then hashed with ``core.canonical``. Ids the agent sent
twice are made unique with a ``#n`` suffix; a ``parent_id`` that names no earlier
event of the bundle is dropped (``stepstream.json`` counts both).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, NamedTuple

from stepstream.core.canonical import CanonicalError, payload_hash
from stepstream.core.records import DeepRecord, RunRecord
from stepstream.core.redact import REDACTED, is_sensitive_key, mask_credentials, redact

__all__ = [
    "BUNDLE_REDACTED",
    "Bundle",
    "BundleRefused",
    "COVERED_FILES",
    "SIDECAR",
    "THINKING_KEY",
    "build_bundle",
    "spell",
    "integrity_bytes",
]

BUNDLE_REDACTED = "[REDACTED]"
THINKING_KEY = "stepstream.thinking"
SIDECAR = "stepstream.json"
COVERED_FILES = ("manifest.json", "events.jsonl", "redactions.json")
_ENV_KEYS = ("python", "os", "stepfork_version")


class BundleRefused(ValueError):
    """The run cannot be exported as a complete bundle (``reason`` says why)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Bundle(NamedTuple):
    files: dict[str, bytes]  # name -> exact bytes, integrity.json included
    events: int
    redactions: int
    clipped: int


def spell(value: Any) -> Any:
    """``value`` with our replacement spelled the reference's way (strings and keys)."""
    if isinstance(value, str):
        return value.replace(REDACTED, BUNDLE_REDACTED) if REDACTED in value else value
    if isinstance(value, dict):
        return {spell(k): spell(v) for k, v in value.items()}
    if isinstance(value, list):
        return [spell(v) for v in value]
    return value


class _Builder:
    def __init__(self, run: RunRecord) -> None:
        self.run = run
        self.events: list[dict[str, Any]] = []
        self.redactions: list[dict[str, Any]] = []
        self.clipped: list[dict[str, str]] = []
        self.ids: set[str] = set()
        self.renamed = 0
        self.parents_dropped = 0

    def _id(self, wanted: str) -> str:
        ident, n = wanted, 2
        while ident in self.ids:
            ident, n = f"{wanted}#{n}", n + 1
        if ident != wanted:
            self.renamed += 1
        self.ids.add(ident)
        return ident

    def add(self, etype: str, env: dict[str, Any] | None, fallback_id: str, ts: str, **fields: Any) -> dict[str, Any]:
        env = env or {}
        event: dict[str, Any] = {"id": self._id(env.get("id") or fallback_id), "run_id": self.run.run_id}
        parent = env.get("parent_id")
        if parent is not None:
            if parent in self.ids:
                event["parent_id"] = parent
            else:
                self.parents_dropped += 1
        event.update(step=len(self.events), type=etype, timestamp=env.get("ts") or ts)
        event.update(fields)
        self.events.append(event)
        return event

    def labels(self, event: dict[str, Any], *fields: str) -> None:
        """Mask credentials in free-text fields the agent named (tool, provider, model,
        key, error type); each masked one is listed in ``redactions.json``."""
        for field in fields:
            text = event.get(field)
            if isinstance(text, str):
                shown = mask_credentials(text)
                if shown != text:
                    event[field] = spell(shown)
                    self._record(event, f"/{field}", "credential")

    def _record(self, event: dict[str, Any], path: str, rule: str) -> None:
        self.redactions.append({"event_id": event["id"], "path": path, "reason": rule, "replacement": BUNDLE_REDACTED})
        event["redactions"] = event.get("redactions", []) + [path]

    def sealed(self, event: dict[str, Any], field: str, hash_field: str, rule: str) -> None:
        """``event[field]`` replaced whole (a state value under a sensitive or unknown key)."""
        event[field] = BUNDLE_REDACTED
        event[hash_field] = payload_hash(BUNDLE_REDACTED)
        self._record(event, f"/{field}", rule)

    def payload(self, event: dict[str, Any], field: str, value: Any, hash_field: str, clipped: bool = False) -> None:
        """Redact ``value`` into ``event[field]`` and hash it into ``event[hash_field]``."""
        shown, pointers, rules = redact(value)
        shown = spell(shown)
        for pointer, rule in zip(pointers, rules, strict=True):
            self._record(event, f"/{field}{spell(pointer)}", rule)
        event[field] = shown
        event[hash_field] = payload_hash(shown)
        if clipped:
            self.clipped.append({"event_id": event["id"], "field": field})


def _text(value: Any, fallback: str) -> str:
    return value if isinstance(value, str) and value else fallback


def _steps(b: _Builder, deeps: list[DeepRecord]) -> bool:
    """The steps' events; whether one of them is an error event."""
    run_id = b.run.run_id
    has_error = False
    for d in sorted(deeps, key=lambda r: r.step_seq):
        call, result = d.call_event or {}, d.result_event or {}
        sid = f"{run_id}:{d.step_seq}"
        # A clipped body is a string ending with the clip marker; `clipped` is per row.
        arg_cut = d.clipped and isinstance(d.arguments, str)
        out_cut = d.clipped and isinstance(d.output, str)
        if d.kind == "tool":
            name = _text(call.get("tool"), "unknown")
            if d.call_event is not None or d.arguments is not None:
                e = b.add("tool_call", d.call_event, f"{sid}:call", d.ts, name=name)
                b.labels(e, "name")
                b.payload(e, "input", d.arguments, "input_hash", arg_cut)
            if d.result_event is not None or d.output is not None:
                status = "error" if result.get("status") == "error" else "ok"
                e = b.add("tool_result", d.result_event, f"{sid}:result", d.ts, status=status, name=name)
                b.labels(e, "name")
                b.payload(e, "output", d.output, "output_hash", out_cut)
        elif d.kind == "llm":
            model = _text(call.get("model"), "unknown")
            if d.call_event is not None or d.arguments is not None:
                extra = {"provider": call["provider"]} if call.get("provider") else {}
                e = b.add("llm_request", d.call_event, f"{sid}:request", d.ts, model=model, **extra)
                b.labels(e, "provider", "model")
                b.payload(e, "input", d.arguments, "input_hash", arg_cut)
            if d.result_event is not None or d.output is not None:
                usage = result.get("usage") or {}
                tokens = {}
                if usage:
                    tokens = {
                        "prompt_tokens": usage.get("input_tokens", 0),
                        "completion_tokens": usage.get("output_tokens", 0),
                        "total_tokens": usage.get("input_tokens", 0) + usage.get("output_tokens", 0),
                    }
                e = b.add("llm_response", d.result_event, f"{sid}:response", d.ts, model=model, **tokens)
                b.labels(e, "model")
                b.payload(e, "output", d.output, "output_hash", out_cut)
        elif d.kind == "state":
            key = call.get("key")
            e = b.add("state_change", d.call_event, f"{sid}:state", d.ts, key=_text(key, "state"))
            b.labels(e, "key")
            if not isinstance(key, str):  # a step stored before envelopes: its key is unknown
                b.sealed(e, "after", "output_hash", "unknown_key")
            elif is_sensitive_key(key):  # the value of a sensitive key goes whole, as on the step
                b.sealed(e, "after", "output_hash", "key_name")
            else:
                b.payload(e, "after", d.arguments, "output_hash", arg_cut)
        elif d.kind == "thinking":
            e = b.add("state_change", d.call_event, f"{sid}:thinking", d.ts, key=THINKING_KEY)
            b.payload(e, "after", d.reasoning or "", "output_hash", d.clipped)
        elif d.kind == "error":
            has_error = True
            e = b.add("error", d.call_event, f"{sid}:error", d.ts, status="error",
                      error_type=_text(call.get("kind"), "error"))  # fmt: skip
            b.labels(e, "error_type")
            message = d.output if isinstance(d.output, str) and d.output else "(no message)"
            b.payload(e, "message", message, "_message_hash", out_cut)
            del e["_message_hash"]  # the reference hashes an error's details, not its message
    return has_error


def _manifest(b: _Builder, created_at: str, failure: dict[str, Any] | None) -> dict[str, Any]:
    run = b.run
    env = run.environment if isinstance(run.environment, dict) else {}
    environment = {k: spell(env[k]) for k in _ENV_KEYS if isinstance(env.get(k), str)}
    status = {"running": "running", "completed": "completed"}.get(run.status, "failed")
    manifest: dict[str, Any] = {
        "format": "stepfork",
        "schema_version": "0.1",
        "run_id": run.run_id,
        "agent_name": _text(spell(run.agent_name), "unknown"),
        "created_at": created_at,
        "status": status,
        "environment": environment,
        "totals": {
            "events": len(b.events),
            "llm_calls": sum(e["type"] == "llm_request" for e in b.events),
            "tool_calls": sum(e["type"] == "tool_call" for e in b.events),
        },
    }
    if failure is not None:
        manifest["failure"] = failure
    return manifest


def _check_complete(run: RunRecord, deeps: list[DeepRecord], step_seqs: list[int] | None) -> None:
    if run.deep_pruned_at is not None:
        raise BundleRefused(
            "pruned",
            f"run {run.run_id}: its bodies were dropped by retention at {run.deep_pruned_at}; "
            "a bundle would not hold its payloads",
        )
    if step_seqs is not None:
        have = {d.step_seq for d in deeps}
        missing = [s for s in step_seqs if s not in have]
        if missing:
            raise BundleRefused(
                "purged",
                f"run {run.run_id}: {len(missing)} of its {len(step_seqs)} steps have no body "
                "(purged or not yet written); a bundle would not hold their payloads",
            )


def _json(value: Any) -> bytes:
    return (json.dumps(value, ensure_ascii=False, indent=2, allow_nan=False) + "\n").encode("utf-8")


def integrity_bytes(files: dict[str, bytes]) -> bytes:
    """``integrity.json`` over the exact bytes of the covered files (and the sidecar)."""
    digests = {name: hashlib.sha256(files[name]).hexdigest() for name in (*COVERED_FILES, SIDECAR) if name in files}
    return _json({"schema_version": "0.1", "algorithm": "sha256", "files": digests})


def build_bundle(
    run: RunRecord, deeps: list[DeepRecord], *, company_id: str, step_seqs: list[int] | None = None
) -> Bundle:
    """The bundle of ``run``. ``step_seqs``: the run's step ordinals from the step
    store, to refuse a run some of whose bodies are gone. Raises :class:`BundleRefused`
    for a pruned or purged run and ``CanonicalError`` for a payload outside JSON."""
    _check_complete(run, deeps, step_seqs)
    b = _Builder(run)
    first_ts = min((d.ts for d in deeps), default=None)
    created_at = run.started_at or first_ts or run.last_event_at or run.ended_at
    if created_at is None:
        raise BundleRefused("empty", f"run {run.run_id}: no event time is known")
    b.add("run_start", {"id": run.start_event_id} if run.start_event_id else None, f"{run.run_id}:run_start", created_at)
    has_error = _steps(b, deeps)
    failure = None
    if run.status in ("failed", "abandoned"):
        f = run.failure
        ftype = _text(spell(f.type) if f else None, "abandoned" if run.status == "abandoned" else "unknown")
        fmessage = _text(spell(f.message) if f else None, "the run was closed after it went silent"
                         if run.status == "abandoned" else "(no message)")  # fmt: skip
        if not has_error:
            e = b.add("error", None, f"{run.run_id}:failure", run.ended_at or created_at,
                      status="error", error_type=ftype)  # fmt: skip
            b.labels(e, "error_type")
            b.payload(e, "message", fmessage, "_h")
            del e["_h"]
        step = f.step if f is not None and f.step is not None else len(b.events)
        failure = {"type": ftype, "message": fmessage, "step": step}
    if run.status != "running":
        end_status = "completed" if run.status == "completed" else "failed"
        b.add("run_end", {"id": run.end_event_id} if run.end_event_id else None, f"{run.run_id}:run_end",
              run.ended_at or run.last_event_at or created_at, run_status=end_status)  # fmt: skip
    try:
        return _files(b, run, company_id, created_at, failure)
    except UnicodeEncodeError as exc:  # a lone surrogate in a text outside the payloads
        raise CanonicalError(f"not encodable as UTF-8: {exc.reason}") from None
    except ValueError as exc:
        raise CanonicalError(str(exc)) from None


def _files(b: _Builder, run: RunRecord, company_id: str, created_at: str, failure: dict[str, Any] | None) -> Bundle:
    files: dict[str, bytes] = {}
    files["manifest.json"] = _json(_manifest(b, created_at, failure))
    # U+0085, U+2028 and U+2029 (only ever inside strings) escaped: readers that split on them see one line.
    lines = [
        json.dumps(e, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
        .replace("\x85", "\\u0085")
        for e in b.events
    ]
    files["events.jsonl"] = ("".join(line + "\n" for line in lines)).encode("utf-8")
    files["redactions.json"] = _json({"schema_version": "0.1", "entries": b.redactions})
    completeness = "running" if run.status == "running" else ("truncated" if run.dropped_steps else "complete")
    files[SIDECAR] = _json(
        {
            "format": "stepstream",
            "version": 1,
            "company_id": company_id,
            "run_status": run.status,
            "completeness": completeness,
            "dropped_steps": run.dropped_steps,
            "seq_gaps": run.seq_gaps,
            "clipped": b.clipped,
            "ids_renamed": b.renamed,
            "parents_dropped": b.parents_dropped,
            "environment": spell(run.environment),
            "canonical_profile": "stepfork-json-v0.1",
        }
    )
    files["integrity.json"] = integrity_bytes(files)
    return Bundle(files, len(b.events), len(b.redactions), len(b.clipped))

