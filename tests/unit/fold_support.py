"""Test support for the engine: event builders and a tiny reference store that
applies the write semantics documented in ``core/records.py``, written here
independently of ``core/merge.py`` so the two can disagree."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec
from stepstream.core import wire
from stepstream.core.fold import Limits, Output, RunFold
from stepstream.core.records import DeepRecord, RunRecord, RunState, StepRecord

T0 = datetime(2026, 11, 29, 10, 0, 0, tzinfo=timezone.utc)

_PAYLOADS = {
    "run_start": (wire.RunStart, wire.RunStartPayload),
    "llm_request": (wire.LlmRequest, wire.LlmRequestPayload),
    "llm_response": (wire.LlmResponse, wire.LlmResponsePayload),
    "thinking_delta": (wire.ThinkingDelta, wire.ThinkingDeltaPayload),
    "tool_call": (wire.ToolCall, wire.ToolCallPayload),
    "tool_result": (wire.ToolResult, wire.ToolResultPayload),
    "state_change": (wire.StateChange, wire.StateChangePayload),
    "error": (wire.Error, wire.ErrorPayload),
    "run_end": (wire.RunEnd, wire.RunEndPayload),
}


def ev(
    type_: str, seq: int, /, *, company: str = "acme", run: str = "r1", ts: datetime | None = None, **payload: Any
) -> wire.Event:
    """One wire event; ``ts`` defaults to ``T0 + seq`` milliseconds."""
    cls, pcls = _PAYLOADS[type_]
    if ts is None:
        ts = T0 + timedelta(milliseconds=seq)
    return cls(v=1, event_id=f"{run}-{seq}", company_id=company, run_id=run, seq=seq, ts=ts, payload=pcls(**payload))


class Script:
    """Builds one run's events with consecutive ``seq``."""

    def __init__(self, company: str = "acme", run: str = "r1") -> None:
        self.company, self.run, self.seq, self.events = company, run, 0, []

    def __call__(self, type_: str, /, **payload: Any) -> wire.Event:
        event = ev(type_, self.seq, company=self.company, run=self.run, **payload)
        self.seq += 1
        self.events.append(event)
        return event

    def think(self, *texts: str) -> None:
        for text in texts:
            self("thinking_delta", text=text)


def apply_step(stored: StepRecord | None, written: StepRecord) -> StepRecord:
    if stored is None:
        return written
    data = msgspec.structs.asdict(stored)
    for name, value in msgspec.structs.asdict(written).items():
        if value is not None:
            data[name] = value
    return StepRecord(**data)


def apply_deep(stored: DeepRecord | None, written: DeepRecord) -> DeepRecord:
    if stored is None:
        assert written.reasoning_offset == 0 or written.reasoning is None, "first chunk must start at 0"
        return written
    data = msgspec.structs.asdict(stored)
    for name, value in msgspec.structs.asdict(written).items():
        if name in ("reasoning", "reasoning_offset", "clipped"):
            continue
        if value is not None:
            data[name] = value
    data["clipped"] = stored.clipped or written.clipped
    data["ts"] = max(stored.ts, written.ts)  # a late write never moves it back
    if written.reasoning is not None:
        head = stored.reasoning or ""
        assert written.reasoning_offset <= len(head), "a chunk may not leave a hole"
        data["reasoning"] = head[: written.reasoning_offset] + written.reasoning
        data["reasoning_offset"] = 0
    return DeepRecord(**data)


def apply_run(stored: RunRecord | None, written: RunRecord) -> RunRecord:
    """A run record replaces whole, but a ``None`` environment or ``deep_pruned_at``
    keeps the stored one (the environment is written once, with its run_start)."""
    if stored is None:
        return written
    data = msgspec.structs.asdict(written)
    for name in ("environment", "deep_pruned_at"):
        if data[name] is None:
            data[name] = getattr(stored, name)
    return RunRecord(**data)


class Store:
    """What a sink holds after a sequence of writes (steps, deeps, runs, states)."""

    def __init__(self) -> None:
        self.steps: dict[tuple[str, str, int], StepRecord] = {}
        self.deeps: dict[tuple[str, str, int], DeepRecord] = {}
        self.runs: dict[tuple[str, str], RunRecord] = {}
        self.states: dict[tuple[str, str], RunState] = {}

    def write(self, out: Output | None) -> None:
        if out is None:
            return
        for step in out.steps:
            key = (step.company_id, step.run_id, step.step_seq)
            self.steps[key] = apply_step(self.steps.get(key), step)
        for deep in out.deeps:
            key = (deep.company_id, deep.run_id, deep.step_seq)
            self.deeps[key] = apply_deep(self.deeps.get(key), deep)
        if out.run is not None:
            key = (out.run.company_id, out.run.run_id)
            self.runs[key] = apply_run(self.runs.get(key), out.run)
        if out.state is not None:
            self.states[(out.state.company_id, out.state.run_id)] = out.state

    def snapshot(self) -> tuple[dict, dict, dict, dict]:
        return dict(self.steps), dict(self.deeps), dict(self.runs), dict(self.states)


def fold_all(
    events: list[wire.Event], limits: Limits = Limits(), *, flush_end: bool = True
) -> tuple[Store, list[Output]]:
    """Fold events of any runs in order (what ``ingest-file`` does) into a Store."""
    store = Store()
    folds: dict[tuple[str, str], RunFold] = {}
    outs: list[Output] = []
    for i, event in enumerate(events):
        key = (event.company_id, event.run_id)
        fold = folds.get(key)
        if fold is None:
            fold = folds[key] = RunFold(key[0], key[1], None, limits)
        out = fold.push(event, float(i))
        if out is not None:
            outs.append(out)
            store.write(out)
    if flush_end:
        for fold in folds.values():
            out = fold.flush()
            if out is not None:
                outs.append(out)
                store.write(out)
    return store, outs


def records_json(out: Output) -> str:
    """The steps and run record of an Output as JSON text (what an operator can see)."""
    return msgspec.json.encode([out.steps, out.run]).decode()


def restart_from_every_snapshot(deliveries: list, lim: Limits, reference: Store, outs: list[Output]) -> None:
    """For every durable snapshot in ``outs`` (what an uninterrupted fold of
    ``deliveries`` made into ``reference``): the sink holds everything up to it, its run
    restarts from it (through JSON, as a store keeps it) and replays all its events,
    the other runs go on untouched; the sink must end equal to ``reference``."""
    for k, out in enumerate(outs):
        if out.state is None:
            continue
        store = Store()
        for o in outs[: k + 1]:
            store.write(o)
        run = out.state.run_id
        restored = msgspec.json.decode(msgspec.json.encode(out.state), type=RunState)
        fold = RunFold("acme", run, restored, lim)
        for o in outs[k + 1 :]:
            if all(r.run_id != run for r in [*o.steps, *o.deeps]) and (o.state is None or o.state.run_id != run):
                store.write(o)
        for e in deliveries:
            if e.run_id == run:
                store.write(fold.push(e, 0.0))
        store.write(fold.flush())
        assert store.snapshot() == reference.snapshot(), f"restart from snapshot {k} of run {run}"
