"""Fault injection at the store ports, for chaos tests. Never in production.

:func:`wrap_stores` returns a step store and a deep store that delegate every call
to the real ones, except the calls a *fault plan* names: those fail, hang, or land
and then report failure. The worker wraps its stores this way when
``Settings.fault_plan`` (``STEPSTREAM_FAULT_PLAN``) is a path.

**The plan** is a JSON file, re-read whenever it changes (modification time, size
or inode), so a test changes the faults of a running worker by replacing the file
(:func:`write_plan` does it atomically)::

    {"seed": 7, "rules": [
        {"store": "steps", "op": "write", "action": "fail", "count": 3},
        {"store": "*", "op": "*", "action": "hang", "seconds": 0.5, "probability": 0.05}
    ]}

===============  ==========================================================================
rule field       meaning
===============  ==========================================================================
``action``       ``fail``: raise :class:`~stepstream.errors.SinkUnavailable` (retriable)
                 instead of calling the store; ``fatal``: raise
                 :class:`~stepstream.errors.SinkError` (not retriable) instead;
                 ``hang``: sleep ``seconds``, then call the store (a hang cancelled
                 while it sleeps calls nothing); ``fail_after``: call the store (the
                 write lands), then raise ``SinkUnavailable``
``store``        ``steps``, ``deep`` or ``*`` (default)
``op``           a port method (``write``, ``load_states``, ``get_deep``, ...) or ``*``
                 (default): every port method except ``close``, which only a rule
                 naming it matches
``count``        how many faults the rule injects; missing or ``null``: unlimited
``probability``  chance that a matching call gets the fault (default 1.0)
``seconds``      how long a ``hang`` sleeps (default 0)
===============  ==========================================================================

For each call the rules are tried in order; the first that matches the store and the
op, has faults left and wins its draw injects its fault, at most one per call.
``count`` counts injected faults, not matching calls.

**Deterministic under** ``seed``: one ``random.Random(seed)`` per loaded plan, drawn
once for each matching rule whose probability is below 1, so the same sequence of
calls gets the same faults. Reloading a plan restarts its counts and its generator
(and so does every process that loads it).

**The log.** Every injected fault is appended to ``<plan path>.log`` as one JSON line,
``{"time", "pid", "store", "op", "action", "rule"}`` (``rule``: its index in the
plan), with one ``O_APPEND`` write, so processes sharing a plan share the log. It is
written when the fault begins: before a ``fail``/``fatal`` raises or a ``hang`` sleeps,
after the store call of a ``fail_after``. :func:`read_log` reads it back.

A missing plan file means no faults. An invalid plan is a
:class:`~stepstream.errors.ConfigError` when the stores are wrapped; a plan that
becomes invalid later is ignored (the previous one stays) with a warning.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from stepstream.core.records import DeepRecord, RunRecord, RunState, StepRecord
from stepstream.errors import ConfigError, SinkError, SinkUnavailable
from stepstream.sinks.ports import NO_FILTER, Capabilities, DeepRun, DeepStore, RunFilter, RunsPage, StepStore

__all__ = ["FaultPlan", "FaultRule", "read_log", "wrap_stores", "write_plan"]

log = logging.getLogger(__name__)

T = TypeVar("T")

STEP_OPS = (
    "write", "load_states", "get_run", "list_runs", "list_runs_page", "get_steps", "close",
    "list_companies", "mark_deep_pruned", "delete_runs",
)  # fmt: skip
DEEP_OPS = (
    "write", "get_deep", "list_deep_runs", "purge_run", "purge_company", "prune", "close",
    "list_companies", "retention_index", "mark_pruned", "delete_pruned",
)  # fmt: skip


class FaultRule(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One rule of a plan; the module docstring says what each field means."""

    action: Literal["fail", "fatal", "hang", "fail_after"]
    store: Literal["steps", "deep", "*"] = "*"
    op: str = "*"
    count: Annotated[int, msgspec.Meta(ge=0)] | None = None
    probability: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 1.0
    seconds: Annotated[float, msgspec.Meta(ge=0.0)] = 0.0

    def matches(self, store: str, op: str) -> bool:
        if self.store != "*" and self.store != store:
            return False
        return self.op == op or (self.op == "*" and op != "close")


class FaultPlan(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    seed: int = 0
    rules: list[FaultRule] = []


_NO_FAULTS = FaultPlan()
_decoder = msgspec.json.Decoder(FaultPlan)


def _parse(data: bytes, path: Path) -> FaultPlan:
    try:
        plan = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"fault plan {path}: {exc}") from None
    for i, rule in enumerate(plan.rules):
        if rule.op != "*" and rule.op not in STEP_OPS and rule.op not in DEEP_OPS:
            raise ConfigError(f"fault plan {path}: rule {i} names no port method: op {rule.op!r}")
    return plan


def write_plan(path: str | os.PathLike[str], plan: FaultPlan | dict[str, Any]) -> None:
    """Replace the plan at ``path`` atomically (a running injector sees the whole new
    plan or the old one, never half a file). ``plan`` may be a dict in the JSON form."""
    target = Path(path)
    data = msgspec.json.encode(plan)
    _parse(data, target)  # refuse to write a plan the injector would refuse
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)


def read_log(plan_path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The faults injected so far under the plan at ``plan_path``, oldest first (a
    torn last line, still being written, is left out)."""
    try:
        lines = Path(f"{os.fspath(plan_path)}.log").read_bytes().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


class FaultInjector:
    """The loaded plan, its counts and generator, and the fault log. One per plan
    path, shared by both wrapped stores (so one seed orders the faults of both)."""

    def __init__(self, plan_path: str | os.PathLike[str]) -> None:
        self.path = Path(plan_path)
        self.log_path = Path(f"{os.fspath(plan_path)}.log")
        self._signature: tuple[int, int, int] | None = None
        self._refused: tuple[int, int, int] | None = None
        self._plan = _NO_FAULTS
        self._left: list[int | None] = []
        self._rng = random.Random(0)
        self._refresh(strict=True)

    def _refresh(self, strict: bool = False) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._signature is not None or strict:
                self._load(_NO_FAULTS, None)
            return
        signature = (st.st_mtime_ns, st.st_size, st.st_ino)
        if signature == self._signature or signature == self._refused:
            return
        try:
            plan = _parse(self.path.read_bytes(), self.path)
        except (ConfigError, OSError) as exc:
            if strict:
                raise ConfigError(str(exc)) from None
            self._refused = signature  # warned once per bad version of the file
            log.warning("fault plan not reloaded, keeping the previous one: %s", exc)
            return
        self._load(plan, signature)

    def _load(self, plan: FaultPlan, signature: tuple[int, int, int] | None) -> None:
        self._plan = plan
        self._signature = signature
        self._left = [rule.count for rule in plan.rules]
        self._rng = random.Random(plan.seed)
        if plan.rules:
            log.warning("fault plan %s loaded: %d rules (chaos testing)", self.path, len(plan.rules))

    def pick(self, store: str, op: str) -> tuple[int, FaultRule] | None:
        """The rule that injects a fault into this call, if any (its count taken)."""
        self._refresh()
        for i, rule in enumerate(self._plan.rules):
            left = self._left[i]
            if (left is not None and left <= 0) or not rule.matches(store, op):
                continue
            if rule.probability < 1.0 and self._rng.random() >= rule.probability:
                continue
            if left is not None:
                self._left[i] = left - 1
            return i, rule
        return None

    def record(self, store: str, op: str, index: int, rule: FaultRule) -> None:
        line = json.dumps(
            {"time": time.time(), "pid": os.getpid(), "store": store, "op": op, "action": rule.action, "rule": index}
        )
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode() + b"\n")
        finally:
            os.close(fd)
        log.warning("injected fault: %s on %s.%s (rule %d)", rule.action, store, op, index)

    async def call(self, store: str, op: str, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` with the fault the plan gives this call, if any."""
        picked = self.pick(store, op)
        if picked is None:
            return await fn(*args, **kwargs)
        index, rule = picked
        what = f"injected fault: {rule.action} on {store}.{op}"
        if rule.action == "fail_after":
            result = await fn(*args, **kwargs)
            self.record(store, op, index, rule)
            raise SinkUnavailable(f"{what} (the call landed)")
        self.record(store, op, index, rule)
        if rule.action == "fail":
            raise SinkUnavailable(what)
        if rule.action == "fatal":
            raise SinkError(what)
        await asyncio.sleep(rule.seconds)
        return await fn(*args, **kwargs)


class _Faulty:
    """Delegates to the wrapped store; every other attribute reads through."""

    _store_name = ""

    def __init__(self, inner: Any, injector: FaultInjector) -> None:
        self._inner = inner
        self._injector = injector

    @property
    def capabilities(self) -> Capabilities:
        return self._inner.capabilities

    @property
    def wrapped(self) -> Any:
        """The real store underneath."""
        return self._inner

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_inner", "_injector"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def _call(self, op: str, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        return self._injector.call(self._store_name, op, getattr(self._inner, op), *args, **kwargs)

    async def close(self) -> None:
        await self._call("close")


class FaultyStepStore(_Faulty):
    """A :class:`~stepstream.sinks.ports.StepStore` under a fault plan."""

    _store_name = "steps"

    async def write(
        self,
        steps: Sequence[StepRecord],
        runs: Sequence[RunRecord] = (),
        states: Sequence[RunState] = (),
    ) -> list[tuple[str, str]]:
        # The runs the store refused as stale pass through.
        return await self._call("write", steps, runs, states)

    async def load_states(self, company_id: str, run_ids: Sequence[str]) -> dict[str, RunState]:
        return await self._call("load_states", company_id, run_ids)

    async def get_run(self, company_id: str, run_id: str) -> RunRecord | None:
        return await self._call("get_run", company_id, run_id)

    async def list_runs(self, company_id: str, *, limit: int = 50, before: str | None = None) -> list[RunRecord]:
        return await self._call("list_runs", company_id, limit=limit, before=before)

    async def list_runs_page(
        self, company_id: str, *, limit: int = 50, before: str | None = None, where: RunFilter = NO_FILTER
    ) -> RunsPage:
        return await self._call("list_runs_page", company_id, limit=limit, before=before, where=where)

    async def get_steps(
        self, company_id: str, run_id: str, *, after: int | None = None, limit: int | None = None
    ) -> list[StepRecord]:
        return await self._call("get_steps", company_id, run_id, after=after, limit=limit)

    async def list_companies(self) -> list[str]:
        return await self._call("list_companies")

    async def mark_deep_pruned(self, company_id: str, run_ids: Sequence[str], at: str) -> int:
        return await self._call("mark_deep_pruned", company_id, run_ids, at)

    async def delete_runs(self, company_id: str, run_ids: Sequence[str]) -> int:
        return await self._call("delete_runs", company_id, run_ids)


class FaultyDeepStore(_Faulty):
    """A :class:`~stepstream.sinks.ports.DeepStore` under a fault plan."""

    _store_name = "deep"

    async def write(self, deeps: Sequence[DeepRecord]) -> None:
        await self._call("write", deeps)

    async def get_deep(
        self, company_id: str, run_id: str, *, after: int | None = None, limit: int | None = None
    ) -> list[DeepRecord]:
        return await self._call("get_deep", company_id, run_id, after=after, limit=limit)

    async def list_deep_runs(self, company_id: str) -> list[tuple[str, str]]:
        return await self._call("list_deep_runs", company_id)

    async def purge_run(self, company_id: str, run_id: str) -> int:
        return await self._call("purge_run", company_id, run_id)

    async def purge_company(self, company_id: str) -> int:
        return await self._call("purge_company", company_id)

    async def prune(self, company_id: str, keep: int) -> list[str]:
        return await self._call("prune", company_id, keep)

    async def list_companies(self) -> list[str]:
        return await self._call("list_companies")

    async def retention_index(self, company_id: str) -> list[DeepRun]:
        return await self._call("retention_index", company_id)

    async def mark_pruned(self, company_id: str, runs: Sequence[tuple[str, int]], at: str) -> list[str]:
        return await self._call("mark_pruned", company_id, runs, at)

    async def delete_pruned(self, company_id: str, run_ids: Sequence[str]) -> int:
        return await self._call("delete_pruned", company_id, run_ids)


def wrap_stores(
    steps: StepStore, deep: DeepStore, plan_path: str | os.PathLike[str]
) -> tuple[StepStore, DeepStore]:
    """``steps`` and ``deep`` under the fault plan at ``plan_path`` (module docstring).
    Raises :class:`~stepstream.errors.ConfigError` if the plan exists and is invalid."""
    injector = FaultInjector(plan_path)
    return FaultyStepStore(steps, injector), FaultyDeepStore(deep, injector)  # type: ignore[return-value]
