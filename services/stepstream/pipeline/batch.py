"""One write's worth of rows, coalesced by key with the stores' own merge rules."""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec

from stepstream.core.fold import Output, RunFold
from stepstream.core.merge import can_merge_deep, merge_deep, merge_step
from stepstream.core.records import DeepRecord, RunRecord, RunState, StepRecord

RunKey = tuple[str, str]


class RowBatch:
    """Rows of one write, coalesced by key with the store's own merge semantics
    (``core.merge``), plus what rides on it: how many consumed records it settles and
    the bytes of their values (``message_bytes``, what bounds its size: every body
    on its rows came from those messages), their event times (for the ingest-lag
    histogram) and the event types applied."""

    __slots__ = ("steps", "deeps", "deep_at", "runs", "environments", "states", "records", "message_bytes",
                 "event_ts", "delta_ts", "types", "ended", "opened")  # fmt: skip

    def __init__(self, now: float = 0.0) -> None:
        self.steps: dict[tuple[str, str, int], StepRecord] = {}
        self.deeps: list[DeepRecord] = []
        self.deep_at: dict[tuple[str, str, int], int] = {}
        self.runs: dict[RunKey, RunRecord] = {}
        # The environments of the run_starts applied: a later record of the run (or its
        # lazy fold) has none, and the stores keep what a None leaves (core.merge.merge_run).
        self.environments: dict[RunKey, Any] = {}
        self.states: dict[RunKey, RunState] = {}
        self.records = 0  # consumed records (or lines) this batch settles
        self.message_bytes = 0  # ... and the bytes of their values
        self.event_ts: list[float] = []  # event times of what this batch makes durable
        self.delta_ts: list[float] = []  # ... of its thinking deltas
        self.types: Counter[str] = Counter()
        self.ended: list[RunKey] = []
        self.opened = now

    def __len__(self) -> int:
        return len(self.steps) + len(self.deeps) + len(self.runs) + self.records

    @property
    def has_rows(self) -> bool:
        return bool(self.steps or self.deeps or self.runs or self.states)

    def add_step(self, step: StepRecord) -> None:
        key = (step.company_id, step.run_id, step.step_seq)
        self.steps[key] = merge_step(self.steps.get(key), step)

    def add_deep(self, deep: DeepRecord) -> None:
        """Merge into the pending row of the same key when no character would be
        lost; otherwise keep it as a separate write, applied in order."""
        key = (deep.company_id, deep.run_id, deep.step_seq)
        at = self.deep_at.get(key)
        if at is not None and can_merge_deep(self.deeps[at], deep):
            self.deeps[at] = merge_deep(self.deeps[at], deep)
        else:
            self.deep_at[key] = len(self.deeps)
            self.deeps.append(deep)

    def add(self, out: Output) -> None:
        for step in out.steps:
            self.add_step(step)
        for deep in out.deeps:
            self.add_deep(deep)
        # A lazy fold (see ``RunFold.durable_state``) gives itself as run and state:
        # :meth:`seal` takes its durable state once, when the batch is sealed.
        run = out.run
        if run is not None:
            key = (run.company_id, run.run_id)
            self.runs[key] = run
            if type(run) is RunRecord and run.environment is not None:
                self.environments[key] = run.environment
        if out.state is not None:
            self.states[(out.state.company_id, out.state.run_id)] = out.state

    def discard(self, key: RunKey) -> None:
        """Forget every row of run ``key`` (its fold was stale: they are made again)."""
        company, run = key
        for step_key in [k for k in self.steps if k[0] == company and k[1] == run]:
            del self.steps[step_key]
        if any((d.company_id, d.run_id) == key for d in self.deeps):
            self.deeps = [d for d in self.deeps if (d.company_id, d.run_id) != key]
            self.deep_at = {(d.company_id, d.run_id, d.step_seq): i for i, d in enumerate(self.deeps)}
        self.runs.pop(key, None)
        self.states.pop(key, None)
        if key in self.ended:
            self.ended = [k for k in self.ended if k != key]

    def seal(self) -> RowBatch:
        """Replace every lazy fold by its durable state (and run record); call before
        the folds change again, that is, when the batch is swapped out for writing."""
        states = self.states
        for key, value in states.items():
            if type(value) is RunFold:
                states[key] = value.durable_state()
        runs = self.runs
        for key, value in runs.items():
            if type(value) is RunFold:
                run = value.durable_state().run
                assert run is not None
                runs[key] = value = run
            environment = self.environments.get(key)
            if environment is not None and value.environment is None:
                runs[key] = msgspec.structs.replace(value, environment=environment)
        return self
