"""A run as a ``.sftrace`` bundle: pure, from a RunRecord and its DeepRecords to bytes.

:class:`BundleWriter` writes the files a page of steps at a time into file objects
it is handed (the API spools them, ``export`` writes into the target's temporary
directory). It holds the events of one step and the counts, never the run's events,
so a 500-step run at its caps costs one page of bodies in memory, not the run.
:func:`build_bundle` is the same writer over in-memory files, returning the bytes
of every file (``docs/bundle.md`` is the reader's description; this docstring is
the mapping in short):

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
import io
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any, NamedTuple

from stepstream.core.canonical import CanonicalError, payload_hash
from stepstream.core.records import DeepRecord, RunRecord
from stepstream.core.redact import REDACTED, is_sensitive_key, mask_credentials, redact

__all__ = [
    "BUNDLE_REDACTED",
    "Bundle",
    "BundleRefused",
    "BundleStats",
    "BundleWriter",
    "COVERED_FILES",
    "FILE_ORDER",
    "SIDECAR",
    "THINKING_KEY",
    "build_bundle",
    "check_exportable",
    "created_time",
    "spell",
]

BUNDLE_REDACTED = "[REDACTED]"
THINKING_KEY = "stepstream.thinking"
SIDECAR = "stepstream.json"
COVERED_FILES = ("manifest.json", "events.jsonl", "redactions.json")
FILE_ORDER = (*COVERED_FILES, SIDECAR, "integrity.json")  # a bundle's files, in the order of its tar
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


class BundleStats(NamedTuple):
    """What :meth:`BundleWriter.finish` wrote: every file's size, and the counts."""

    sizes: dict[str, int]  # name -> bytes, in FILE_ORDER
    events: int
    redactions: int
    clipped: int


class _Out:
    """A bundle file being written, its size and SHA-256 kept as it goes."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh
        self.size = 0
        self.sha = hashlib.sha256()

    def write(self, data: bytes) -> None:
        self.fh.write(data)
        self.size += len(data)
        self.sha.update(data)


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
    """The events of a bundle, written out step by step (:meth:`flush`): ``events``
    and ``redactions`` hold only what is not written yet."""

    def __init__(self, run: RunRecord, events_out: _Out, redactions_out: _Out) -> None:
        self.run = run
        self.events: list[dict[str, Any]] = []
        self.redactions: list[dict[str, Any]] = []
        self.clipped: list[dict[str, str]] = []
        self.ids: set[str] = set()
        self.renamed = 0
        self.parents_dropped = 0
        self.written = 0  # events in events.jsonl
        self.entries_written = 0  # entries in redactions.json
        self.totals = {"llm_calls": 0, "tool_calls": 0}
        self._events_out = events_out
        self._redactions_out = redactions_out
        redactions_out.write(b'{\n  "schema_version": "0.1",\n  "entries": [')

    @property
    def position(self) -> int:
        """The ``step`` of the next event: its 0-based position in the bundle."""
        return self.written + len(self.events)

    def flush(self) -> None:
        """Write the pending events and redaction entries, then forget them."""
        if self.events:
            self._events_out.write("".join(_line(e) + "\n" for e in self.events).encode("utf-8"))
            self.written += len(self.events)
            self.totals["llm_calls"] += sum(e["type"] == "llm_request" for e in self.events)
            self.totals["tool_calls"] += sum(e["type"] == "tool_call" for e in self.events)
            self.events = []
        for entry in self.redactions:
            # The bytes of json.dumps(indent=2) of the whole file, one entry at a time.
            text = json.dumps(entry, ensure_ascii=False, indent=2, allow_nan=False).replace("\n", "\n    ")
            self._redactions_out.write(((",\n    " if self.entries_written else "\n    ") + text).encode("utf-8"))
            self.entries_written += 1
        self.redactions = []

    def close(self) -> None:
        self.flush()
        self._redactions_out.write(b"\n  ]\n}\n" if self.entries_written else b"]\n}\n")

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
        event.update(step=self.position, type=etype, timestamp=env.get("ts") or ts)
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


def _steps(b: _Builder, deeps: Iterable[DeepRecord]) -> bool:
    """The steps' events (in the order given), written step by step; whether one of
    them is an error event."""
    run_id = b.run.run_id
    has_error = False
    for d in deeps:
        b.flush()
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
        "totals": {"events": b.position, **b.totals},
    }
    if failure is not None:
        manifest["failure"] = failure
    return manifest


def check_exportable(run: RunRecord) -> None:
    """Raise :class:`BundleRefused` (``pruned``) when retention dropped the run's bodies."""
    if run.deep_pruned_at is not None:
        raise BundleRefused(
            "pruned",
            f"run {run.run_id}: its bodies were dropped by retention at {run.deep_pruned_at}; "
            "a bundle would not hold its payloads",
        )


def created_time(run: RunRecord, first_ts: str | None) -> str:
    """The bundle's ``created_at``: the run's start, else its first body's time
    (``first_ts``: only needed when the run has no start), else its last event or
    its end. Raises :class:`BundleRefused` (``empty``) when none is known."""
    created_at = run.started_at or first_ts or run.last_event_at or run.ended_at
    if created_at is None:
        raise BundleRefused("empty", f"run {run.run_id}: no event time is known")
    return created_at


def _check_complete(run: RunRecord, have: set[int], step_seqs: Sequence[int] | None) -> None:
    if step_seqs is not None:
        missing = [s for s in step_seqs if s not in have]
        if missing:
            raise BundleRefused(
                "purged",
                f"run {run.run_id}: {len(missing)} of its {len(step_seqs)} steps have no body "
                "(purged or not yet written); a bundle would not hold their payloads",
            )


def _line(event: dict[str, Any]) -> str:
    # U+0085, U+2028 and U+2029 (only ever inside strings) escaped: readers that split on them see one line.
    return (
        json.dumps(event, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
        .replace("\x85", "\\u0085")
    )


@contextmanager
def _canonical() -> Iterator[None]:
    """Text outside JSON (a lone surrogate, a NaN) as :class:`CanonicalError`."""
    try:
        yield
    except (BundleRefused, CanonicalError):
        raise
    except UnicodeEncodeError as exc:  # a lone surrogate in a text outside the payloads
        raise CanonicalError(f"not encodable as UTF-8: {exc.reason}") from None
    except ValueError as exc:
        raise CanonicalError(str(exc)) from None


def _json(value: Any) -> bytes:
    return (json.dumps(value, ensure_ascii=False, indent=2, allow_nan=False) + "\n").encode("utf-8")


class BundleWriter:
    """Writes a bundle into ``open_file(name)`` (a writable binary file per name of
    :data:`FILE_ORDER`), a page of steps at a time.

    Call :meth:`add` with the run's deep rows in ascending ``step_seq``, page after
    page, then :meth:`finish` once. Memory holds the page being added, never the
    run: each step's events are written as soon as they are made. Raises
    :class:`BundleRefused` (``pruned`` at once, ``purged`` at :meth:`finish`) and
    ``CanonicalError`` for a payload outside JSON; the caller then discards the
    files (nothing in them is a bundle)."""

    def __init__(
        self, run: RunRecord, *, company_id: str, created_at: str, open_file: Callable[[str], IO[bytes]]
    ) -> None:
        check_exportable(run)
        self.run = run
        self.company_id = company_id
        self.created_at = created_at
        self._open = open_file
        self._outs = {name: _Out(open_file(name)) for name in ("events.jsonl", "redactions.json")}
        self._b = _Builder(run, self._outs["events.jsonl"], self._outs["redactions.json"])
        self._has_error = False
        self._seen: set[int] = set()
        self._last: int | None = None
        start = {"id": run.start_event_id} if run.start_event_id else None
        self._b.add("run_start", start, f"{run.run_id}:run_start", created_at)

    def add(self, deeps: Sequence[DeepRecord]) -> None:
        """The next page of the run's bodies (ascending ``step_seq``, after the last page's)."""
        page = sorted(deeps, key=lambda d: d.step_seq)
        if page and self._last is not None and page[0].step_seq <= self._last:
            raise ValueError("BundleWriter.add: pages must come in ascending step_seq")
        with _canonical():
            self._has_error |= _steps(self._b, page)
            self._b.flush()
        self._seen.update(d.step_seq for d in page)
        if page:
            self._last = page[-1].step_seq

    def finish(self, step_seqs: Sequence[int] | None = None) -> BundleStats:
        """The closing events, the manifest, the sidecar and ``integrity.json``.
        ``step_seqs``: the run's step ordinals from the step store, to refuse a run
        some of whose bodies are gone (``purged``)."""
        _check_complete(self.run, self._seen, step_seqs)
        with _canonical():
            failure = _closing(self._b, self.run, self.created_at, self._has_error)
            self._b.close()
            return self._files(failure)

    def _small(self, name: str, data: bytes) -> None:
        out = self._outs[name] = _Out(self._open(name))
        out.write(data)

    def _files(self, failure: dict[str, Any] | None) -> BundleStats:
        b, run = self._b, self.run
        self._small("manifest.json", _json(_manifest(b, self.created_at, failure)))
        completeness = "running" if run.status == "running" else ("truncated" if run.dropped_steps else "complete")
        sidecar = {
            "format": "stepstream",
            "version": 1,
            "company_id": self.company_id,
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
        self._small(SIDECAR, _json(sidecar))
        digests = {name: self._outs[name].sha.hexdigest() for name in (*COVERED_FILES, SIDECAR)}
        self._small("integrity.json", _json({"schema_version": "0.1", "algorithm": "sha256", "files": digests}))
        sizes = {name: self._outs[name].size for name in FILE_ORDER}
        return BundleStats(sizes, b.written, b.entries_written, len(b.clipped))


def _closing(b: _Builder, run: RunRecord, created_at: str, has_error: bool) -> dict[str, Any] | None:
    """A failed run's error (when no step was one) and ``run_end``; the manifest's failure."""
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
        step = f.step if f is not None and f.step is not None else b.position
        failure = {"type": ftype, "message": fmessage, "step": step}
    if run.status != "running":
        end_status = "completed" if run.status == "completed" else "failed"
        b.add("run_end", {"id": run.end_event_id} if run.end_event_id else None, f"{run.run_id}:run_end",
              run.ended_at or run.last_event_at or created_at, run_status=end_status)  # fmt: skip
    return failure


def build_bundle(
    run: RunRecord, deeps: list[DeepRecord], *, company_id: str, step_seqs: list[int] | None = None
) -> Bundle:
    """The bundle of ``run`` in memory (:class:`BundleWriter` over one page of every
    body). ``step_seqs``: the run's step ordinals from the step store, to refuse a run
    some of whose bodies are gone. Raises :class:`BundleRefused` for a pruned or
    purged run and ``CanonicalError`` for a payload outside JSON."""
    check_exportable(run)
    _check_complete(run, {d.step_seq for d in deeps}, step_seqs)
    created_at = created_time(run, min((d.ts for d in deeps), default=None))
    files: dict[str, io.BytesIO] = {}

    def open_file(name: str) -> io.BytesIO:
        files[name] = io.BytesIO()
        return files[name]

    writer = BundleWriter(run, company_id=company_id, created_at=created_at, open_file=open_file)
    writer.add(deeps)
    stats = writer.finish(step_seqs)
    return Bundle({name: files[name].getvalue() for name in FILE_ORDER}, stats.events, stats.redactions, stats.clipped)
