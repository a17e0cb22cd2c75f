"""``memory://``: the reference implementation of the ports, and the test fake.

Plain dicts in one process; nothing survives :meth:`close`. Each open is a fresh,
private store (``memory://anything`` names nothing shared), so two opens never
see each other's writes: ``capabilities.shared_storage`` is ``False``.
Every other backend is held to what this one does by the conformance suite.
Durability: none (``durability`` is ``"none"``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import msgspec

from stepstream.core.limits import Limits
from stepstream.core.records import DeepRecord, RunRecord, RunState, StepRecord
from stepstream.sinks.ports import NO_FILTER, Capabilities, DeepRun, RunFilter, RunsPage
from stepstream.sinks.retention import Clock, IndexEntry, batch_ranks, fold_write, merge_index, now_text, prune_via_marks
from stepstream.sinks.semantics import (
    ClipHook,
    RunKey,
    admit,
    apply_deep,
    check_keep,
    check_limit,
    clip_batch,
    decode_cursor,
    matches,
    merge_run,
    merge_step,
    newest_first,
    page,
    run_sort_key,
    seq_range,
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
            key = (run.company_id, run.run_id)
            self._runs[key] = merge_run(self._runs.get(key), run)
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

    async def list_runs_page(
        self, company_id: str, *, limit: int = 50, before: str | None = None, where: RunFilter = NO_FILTER
    ) -> RunsPage:
        check_limit(limit)
        after = decode_cursor(before) if before is not None else None
        runs = [r for (c, _), r in self._runs.items() if c == company_id and matches(r, where)]
        if after is not None:
            runs = [r for r in runs if run_sort_key(r) < after]
        runs.sort(key=run_sort_key, reverse=True)
        return RunsPage(*page(runs[: limit + 1], limit))

    async def get_steps(
        self, company_id: str, run_id: str, *, after: int | None = None, limit: int | None = None
    ) -> list[StepRecord]:
        rows = self._steps.get((company_id, run_id), {})
        return [rows[seq] for seq in seq_range(rows, after, limit)]

    async def list_companies(self) -> list[str]:
        return sorted({c for c, _ in self._runs})

    async def mark_deep_pruned(self, company_id: str, run_ids: Sequence[str], at: str) -> int:
        changed = 0
        for run_id in dict.fromkeys(run_ids):
            run = self._runs.get((company_id, run_id))
            if run is not None and run.deep_pruned_at is None:
                self._runs[(company_id, run_id)] = msgspec.structs.replace(run, deep_pruned_at=at)
                changed += 1
        return changed

    async def delete_runs(self, company_id: str, run_ids: Sequence[str]) -> int:
        gone = 0
        for run_id in dict.fromkeys(run_ids):
            key = (company_id, run_id)
            self._steps.pop(key, None)
            self._states.pop(key, None)
            gone += self._runs.pop(key, None) is not None
        return gone

    async def close(self) -> None:
        pass


class MemoryDeepStore:
    """Deep rows in dicts keyed by ``(company_id, run_id)`` then ``step_seq``."""

    capabilities = CAPABILITIES
    durability = DURABILITY

    def __init__(self, limits: Limits | None = None, clock: Clock = time.time) -> None:
        self._limits = limits
        self.on_clip: ClipHook | None = None  # set by open_deep_store; counts clips at the port
        self._clock = clock
        self._rows: dict[RunKey, dict[int, DeepRecord]] = {}
        self._index: dict[RunKey, IndexEntry] = {}

    def _pruned(self, key: RunKey) -> bool:
        entry = self._index.get(key)
        return entry is not None and entry.pruned_at is not None

    async def write(self, deeps: Sequence[DeepRecord]) -> None:
        # No await inside: the tombstone check, the index and the rows land together.
        kept = [d for d in clip_batch(deeps, self._limits, self.on_clip) if not self._pruned((d.company_id, d.run_id))]
        received = now_text(self._clock)
        for key, (last_ts, rank) in batch_ranks(kept, received).items():
            self._index[key] = fold_write(self._index.get(key), key, last_ts, rank, received)
        for deep in kept:
            rows = self._rows.setdefault((deep.company_id, deep.run_id), {})
            rows[deep.step_seq] = apply_deep(rows.get(deep.step_seq), deep)

    async def get_deep(
        self, company_id: str, run_id: str, *, after: int | None = None, limit: int | None = None
    ) -> list[DeepRecord]:
        if self._pruned((company_id, run_id)):
            return []
        rows = self._rows.get((company_id, run_id), {})
        return [rows[seq] for seq in seq_range(rows, after, limit)]

    async def list_deep_runs(self, company_id: str) -> list[tuple[str, str]]:
        return newest_first(
            {
                run_id: max(r.ts for r in rows.values())
                for (c, run_id), rows in self._rows.items()
                if c == company_id and rows and not self._pruned((c, run_id))
            }
        )

    def _purge(self, keys: list[RunKey]) -> int:
        gone = 0
        for key in keys:
            gone += len(self._rows.pop(key, {}))
            if not self._pruned(key):
                self._index.pop(key, None)
        return gone

    async def purge_run(self, company_id: str, run_id: str) -> int:
        return self._purge([(company_id, run_id)])

    async def purge_company(self, company_id: str) -> int:
        return self._purge([key for key in {*self._rows, *self._index} if key[0] == company_id])

    async def prune(self, company_id: str, keep: int) -> list[str]:
        check_keep(keep)
        return await prune_via_marks(self, company_id, keep, now_text(self._clock))

    async def list_companies(self) -> list[str]:
        return sorted({c for c, _ in self._index} | {c for (c, _), rows in self._rows.items() if rows})

    async def retention_index(self, company_id: str) -> list[DeepRun]:
        entries = {r: e for (c, r), e in self._index.items() if c == company_id}
        bodies = {
            r: (len(rows), max(d.ts for d in rows.values())) for (c, r), rows in self._rows.items() if c == company_id and rows
        }
        return merge_index(entries, bodies)

    async def mark_pruned(self, company_id: str, runs: Sequence[tuple[str, int]], at: str) -> list[str]:
        marked = []
        for run_id, version in runs:
            key = (company_id, run_id)
            entry = self._index.get(key)
            if entry is None:
                if version == 0:
                    self._index[key] = IndexEntry(company_id=company_id, run_id=run_id, pruned_at=at)
                    marked.append(run_id)
            elif entry.pruned_at is None and entry.version == version:
                entry.pruned_at = at
                marked.append(run_id)
        return marked

    async def delete_pruned(self, company_id: str, run_ids: Sequence[str]) -> int:
        return sum(
            len(self._rows.pop((company_id, r), {})) for r in dict.fromkeys(run_ids) if self._pruned((company_id, r))
        )

    async def close(self) -> None:
        pass
