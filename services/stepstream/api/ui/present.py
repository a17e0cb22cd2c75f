"""What the viewer's pages say about a run, computed from the operator view alone.

Pure functions over the ``/v1`` bodies (:mod:`stepstream.api.views`): the plain
words of the integrity banner, the timeline's geometry on one shared time axis, the
icons and words of step kinds and statuses, and the alignment of two runs for the
comparison page (the rule of ``stepstream replay``, :func:`stepstream.bundle.replay.replay`,
over the steps' redacted arguments). No I/O, nothing of the deep store.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

import msgspec

from stepstream.api.views import Run, Step
from stepstream.bundle.replay import Call, Divergence, ReplayReport, replay
from stepstream.core.canonical import payload_hash

# Kind: an icon (decorative, aria-hidden) and always the word beside it.
KIND_ICONS = {"thinking": "\u2234", "tool": "\u2692", "llm": "\u2726", "state": "\u25c6", "error": "\u2716"}
# Status: a symbol and a word, never a colour alone.
STATUS_WORDS = {
    "running": ("\u25b6", "running"),
    "ok": ("\u2713", "ok"),
    "error": ("\u2716", "error"),
    "abandoned": ("\u2205", "abandoned"),
    None: ("\u00b7", "unknown"),
}


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


class Finding(NamedTuple):
    severity: str  # "problem" or "note"
    text: str


def _ranges(missing: tuple[tuple[int, int], ...]) -> str:
    shown = [f"{a}" if a == b else f"{a}-{b}" for a, b in missing[:5]]
    return ", ".join(shown) + (f" and {len(missing) - 5} more ranges" if len(missing) > 5 else "")


def integrity(run: Run, missing: tuple[tuple[int, int], ...] = ()) -> list[Finding]:
    """The integrity banner of a run, in plain words; empty when all is there.
    ``missing``: the event seqs a gap skipped that have not arrived yet, as inclusive
    ranges (``RunState.skipped_seqs``)."""
    found = []
    if missing:
        count = sum(b - a + 1 for a, b in missing)
        found.append(
            Finding(
                "problem",
                f"{_plural(count, 'event', 'events')} never arrived (seq {_ranges(missing)}): "
                "the steps around them may be incomplete.",
            )
        )
    elif run.seq_gaps:
        found.append(
            Finding(
                "note",
                f"{_plural(run.seq_gaps, 'gap', 'gaps')} in the event sequence were seen; "
                "every missing event has arrived since.",
            )
        )
    if run.late_events:
        found.append(
            Finding(
                "note",
                f"{_plural(run.late_events, 'event', 'events')} arrived late and "
                + ("was filled into its step in place." if run.late_events == 1 else "were filled into their steps in place."),
            )
        )
    if run.dropped_steps:
        found.append(
            Finding(
                "problem",
                f"{_plural(run.dropped_steps, 'step was', 'steps were')} dropped at the per-run step cap: "
                "the run is longer than what is shown.",
            )
        )
    if run.truncated:
        found.append(
            Finding("problem", "The run hit a cap (steps or bodies): some of its data was clipped or dropped.")
        )
    if run.deep_pruned_at:
        found.append(
            Finding(
                "note", f"Raw bodies were pruned by retention at {run.deep_pruned_at}: steps remain, raw bodies are gone."
            )
        )
    if run.status == "abandoned":
        found.append(
            Finding(
                "problem", "The run was abandoned: no run_end arrived before the idle timeout, so it may be cut short."
            )
        )
    if run.status == "failed" and run.failure is not None:
        found.append(Finding("problem", f"The run failed: {run.failure.type}: {run.failure.message}"))
    return found


def integrity_summary(run: Run) -> str:
    """The integrity column of the runs list: ``complete`` or the problems, short."""
    parts = []
    if run.seq_gaps:
        parts.append(_plural(run.seq_gaps, "gap", "gaps"))
    if run.late_events:
        parts.append(f"{run.late_events} late")
    if run.dropped_steps:
        parts.append(f"{run.dropped_steps} dropped")
    if run.truncated:
        parts.append("truncated")
    if run.deep_pruned_at:
        parts.append("raw pruned")
    return ", ".join(parts) or "complete"


def _seconds(ts: str | None) -> float | None:
    return None if ts is None else datetime.fromisoformat(ts).timestamp()


def duration(start: str | None, end: str | None) -> str:
    """``1.25 s``, ``3 min 4 s``; an empty string when either end is unknown."""
    a, b = _seconds(start), _seconds(end)
    if a is None or b is None:
        return ""
    d = max(0.0, b - a)
    if d < 60:
        return f"{d:.2f} s" if d < 10 else f"{d:.1f} s"
    if d < 3600:
        return f"{int(d // 60)} min {int(d % 60)} s"
    return f"{int(d // 3600)} h {int(d % 3600 // 60)} min"


class Bar(NamedTuple):
    """A step on the run's time axis, in per-mille of the axis (0..1000)."""

    x: float
    width: float


def timeline(run: Run, steps: list[Step]) -> tuple[str, dict[int, Bar]]:
    """The axis (``started_at`` of the run to its end, or the last time seen) and each
    step's bar on it. A step without times has no bar; a running step runs to the
    axis's end. Idle time between steps shows as empty axis."""
    times = [t for s in steps for t in (_seconds(s.started_at), _seconds(s.ended_at)) if t is not None]
    start = _seconds(run.started_at)
    if start is None and times:
        start = min(times)
    end = _seconds(run.ended_at) or max([*times, _seconds(run.last_event_at) or 0.0], default=0.0)
    if start is None or end <= start:
        return "", {}
    span = end - start
    bars = {}
    for s in steps:
        a = _seconds(s.started_at)
        if a is None:
            continue
        b = _seconds(s.ended_at) or (end if s.status == "running" else a)
        x = (a - start) / span * 1000
        bars[s.step_seq] = Bar(round(max(0.0, x), 2), round(max(2.0, (b - a) / span * 1000), 2))
    return duration(run.started_at or None, run.ended_at or run.last_event_at), bars


def results_of(steps: list[Step]) -> dict[str, int]:
    """call_id -> the step_seq of the step that holds the call (the result fills it in place)."""
    return {s.call_id: s.step_seq for s in steps if s.call_id is not None}


def step_call(step: Step) -> Call | None:
    """A step as ``stepstream replay`` sees a dependency call; ``None`` for the others.
    The input is the step's redacted arguments (the operator view has nothing raw), so
    every hash is one computed here."""
    if step.kind == "tool":
        return Call("tool", step.label, None, None, payload_hash(step.arguments), True)
    if step.kind == "llm":
        provider, _, model = (step.label or "").partition("/")
        return Call("llm", None, provider or None, model or None, payload_hash(step.arguments), True)
    return None


class Pair(NamedTuple):
    position: int
    left: Step | None
    right: Step | None
    differs: bool


class Comparison(NamedTuple):
    report: ReplayReport
    pairs: list[Pair]
    first_left: int | None  # step_seq of the first divergence on each side
    first_right: int | None


def compare(left: list[Step], right: list[Step]) -> Comparison:
    """Align two runs by their dependency calls (ordinal, kind, label, tool / provider /
    model, redacted input) and find the first divergence with replay's rule."""
    lcalls = [(s, c) for s in left if (c := step_call(s)) is not None]
    rcalls = [(s, c) for s in right if (c := step_call(s)) is not None]
    report = replay([c for _, c in lcalls], [c for _, c in rcalls])
    div: Divergence | None = report.divergence
    pairs = []
    for i in range(max(len(lcalls), len(rcalls))):
        ls = lcalls[i][0] if i < len(lcalls) else None
        rs = rcalls[i][0] if i < len(rcalls) else None
        pairs.append(Pair(i, ls, rs, div is not None and i >= div.position))
    first_left = first_right = None
    if div is not None:
        first_left = lcalls[div.position][0].step_seq if div.position < len(lcalls) else None
        first_right = rcalls[div.position][0].step_seq if div.position < len(rcalls) else None
    return Comparison(report, pairs, first_left, first_right)


def divergence_words(comparison: Comparison) -> str:
    div = comparison.report.divergence
    if div is None:
        return f"The runs make the same {_plural(comparison.report.calls, 'call', 'calls')}, in the same order."
    if div.field == "missing":
        return f"Call {div.position + 1}: the second run stops here (the first makes a {div.recorded} call)."
    if div.field == "extra":
        return f"Call {div.position + 1}: the second run makes an extra {div.live} call."
    if div.field == "input":
        return f"Call {div.position + 1}: same call, different (redacted) input."
    return f"Call {div.position + 1}: {div.field} differs: {div.recorded!s} against {div.live!s}."


_sorted = msgspec.json.Encoder(order="sorted").encode

# A step's redacted arguments on a page: at most this many characters (a 500-step run at
# the 32,768-character argument cap would otherwise be a 16 MB page); the JSON twin has all.
PREVIEW_CHARS = 1000


def pretty(value: Any) -> tuple[str, int]:
    """Redacted arguments as readable text for a page, at most :data:`PREVIEW_CHARS`,
    and the length of the whole text (more than the preview when it was cut)."""
    if value is None:
        return "", 0
    text = msgspec.json.format(_sorted(value), indent=1).decode()  # in C: a 500-step page at the caps
    return text[:PREVIEW_CHARS], len(text)
