"""``memory://``: the reference implementation of the ports, and the test fake.

Plain dicts in one process; nothing survives :meth:`close`. Each open is a fresh,
private store (``memory://anything`` names nothing shared), so two opens never
see each other's writes: ``capabilities.shared_storage`` is ``False``.
Every other backend is held to what this one does by the conformance suite.
Durability: none (``durability`` is ``"none"``).
"""

from __future__ import annotations

from collections.abc import Sequence

from stepstream.core.limits import Limits
from stepstream.core.records import DeepRecord, RunRecord, RunState, StepRecord
from stepstream.sinks.ports import Capabilities, RunsPage
from stepstream.sinks.semantics import (
    ClipHook,
    RunKey,
    admit,
    apply_deep,
    check_keep,
    check_limit,
    clip_batch,
    decode_cursor,
    merge_step,
    newest_first,
    page,
    run_sort_key,
    state_keys,
)

CAPABILITIES = Capabilities(atomic_batch=True, shared_storage=False, monotonic_states=True)
DURABILITY = "none"


class MemoryStepStore:
    """Steps, runs and states in dicts keyed by ``(company_id, run_id)``."""

    capabilities = CAPABILITIES
    durability = DURABILITY

    def __init__(self) -> None:
        self._steps: dict[RunKey, dict[int, StepRecord]] = {}
        self._runs: dict[RunKey, RunRecord] = {}
        self._states: dict[RunKey, RunState] = {}

    async def write(
        self,
        steps: Sequence[StepRecord],
        runs: Sequence[RunRecord] = (),
        states: Sequence[RunState] = (),
    ) -> list[RunKey]:
        # No await inside: the check and the batch land atomically with respect to other tasks.
        stored = {key: self._states[key].last_seq for key in state_keys(states) if key in self._states}
        batch = admit(steps, runs, states, stored)
        for step in batch.steps:
            rows = self._steps.setdefault((step.company_id, step.run_id), {})
            rows[step.step_seq] = merge_step(rows.get(step.step_seq), step)
        for run in batch.runs:
            self._runs[(run.company_id, run.run_id)] = run
        for state in batch.states:
            self._states[(state.company_id, state.run_id)] = state
        return batch.skipped

    async def load_states(self, company_id: str, run_ids: Sequence[str]) -> dict[str, RunState]:
        found = {}
        for run_id in run_ids:
            state = self._states.get((company_id, run_id))
            if state is not None:
                found[run_id] = state
        return found

    async def get_run(self, company_id: str, run_id: str) -> RunRecord | None:
        return self._runs.get((company_id, run_id))

    async def list_runs(self, company_id: str, *, limit: int = 50, before: str | None = None) -> list[RunRecord]:
        return (await self.list_runs_page(company_id, limit=limit, before=before)).runs

    async def list_runs_page(self, company_id: str, *, limit: int = 50, before: str | None = None) -> RunsPage:
        check_limit(limit)
        after = decode_cursor(before) if before is not None else None
        runs = [r for (c, _), r in self._runs.items() if c == company_id]
        if after is not None:
            runs = [r for r in runs if run_sort_key(r) < after]
        runs.sort(key=run_sort_key, reverse=True)
        return RunsPage(*page(runs[: limit + 1], limit))

    async def get_steps(self, company_id: str, run_id: str) -> list[StepRecord]:
        rows = self._steps.get((company_id, run_id), {})
        return [rows[seq] for seq in sorted(rows)]

    async def close(self) -> None:
        pass


class MemoryDeepStore:
    """Deep rows in dicts keyed by ``(company_id, run_id)`` then ``step_seq``."""

    capabilities = CAPABILITIES
    durability = DURABILITY

    def __init__(self, limits: Limits | None = None) -> None:
        self._limits = limits
        self.on_clip: ClipHook | None = None  # set by open_deep_store; counts clips at the port
        self._rows: dict[RunKey, dict[int, DeepRecord]] = {}

    async def write(self, deeps: Sequence[DeepRecord]) -> None:
        for deep in clip_batch(deeps, self._limits, self.on_clip):
            rows = self._rows.setdefault((deep.company_id, deep.run_id), {})
            rows[deep.step_seq] = apply_deep(rows.get(deep.step_seq), deep)

    async def get_deep(self, company_id: str, run_id: str) -> list[DeepRecord]:
        rows = self._rows.get((company_id, run_id), {})
        return [rows[seq] for seq in sorted(rows)]

    async def list_deep_runs(self, company_id: str) -> list[tuple[str, str]]:
        return newest_first(
            {
                run_id: max(r.ts for r in rows.values())
                for (c, run_id), rows in self._rows.items()
                if c == company_id and rows
            }
        )

    async def purge_run(self, company_id: str, run_id: str) -> int:
        return len(self._rows.pop((company_id, run_id), {}))

    async def purge_company(self, company_id: str) -> int:
        keys = [key for key in self._rows if key[0] == company_id]
        return sum(len(self._rows.pop(key)) for key in keys)

    async def prune(self, company_id: str, keep: int) -> list[str]:
        check_keep(keep)
        dropped = [run_id for run_id, _ in (await self.list_deep_runs(company_id))[keep:]]
        for run_id in dropped:
            del self._rows[(company_id, run_id)]
        return dropped

    async def close(self) -> None:
        pass
