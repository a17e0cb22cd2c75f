"""The fault injector at the store ports (``stepstream.sinks.faults``), over the
memory stores: every action, matching, counts, seeded draws, plan reloads, the log."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from stepstream.core.records import DeepRecord, RunState, StepRecord
from stepstream.errors import ConfigError, SinkError, SinkUnavailable
from stepstream.sinks.faults import FaultPlan, FaultRule, read_log, wrap_stores, write_plan
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore
from stepstream.sinks.ports import DeepStore, StepStore

TS = "2026-11-29T09:00:00.000000Z"


def step(seq: int = 0) -> StepRecord:
    return StepRecord(company_id="acme", run_id="r1", step_seq=seq, kind="tool", label="search", status="running",
                      started_at=TS)  # fmt: skip


def state(last_seq: int) -> RunState:
    return RunState(company_id="acme", run_id="r1", last_seq=last_seq)


def deep(seq: int = 0) -> DeepRecord:
    return DeepRecord(company_id="acme", run_id="r1", step_seq=seq, kind="thinking", ts=TS, reasoning="hm")


@pytest.fixture
def plan(tmp_path):
    return tmp_path / "plan.json"


@pytest.fixture
def stores():
    return MemoryStepStore(), MemoryDeepStore()


def wrapped(stores, plan, rules=None, seed=7):
    if rules is not None:
        write_plan(plan, {"seed": seed, "rules": rules})
    return wrap_stores(*stores, plan)


async def outcomes(store, n: int) -> str:
    """``n`` step writes: ``.`` for success, ``F`` for SinkUnavailable."""
    out = []
    for i in range(n):
        try:
            await store.write([step(i)])
            out.append(".")
        except SinkUnavailable:
            out.append("F")
    return "".join(out)


async def test_wrappers_satisfy_the_ports_and_read_through(stores, plan):
    steps, deep_store = wrapped(stores, plan)
    assert isinstance(steps, StepStore) and isinstance(deep_store, DeepStore)
    assert steps.capabilities == stores[0].capabilities and deep_store.capabilities == stores[1].capabilities
    assert steps.wrapped is stores[0] and deep_store.wrapped is stores[1]
    assert steps.durability == stores[0].durability  # any other attribute reads through
    with pytest.raises(AttributeError):
        steps.no_such_attribute  # noqa: B018


async def test_what_a_call_returns_passes_through(plan):
    class Refusing(MemoryStepStore):
        async def write(self, steps, runs=(), states=()):
            return [("acme", "r1")]  # e.g. runs refused as stale

    steps, _ = wrap_stores(Refusing(), MemoryDeepStore(), plan)
    assert await steps.write([step()], [], [state(1)]) == [("acme", "r1")]


async def test_no_plan_file_means_no_faults_and_every_call_delegates(stores, plan):
    steps, deep_store = wrapped(stores, plan)
    await deep_store.write([deep()])
    await steps.write([step()], [], [state(3)])
    assert (await steps.load_states("acme", ["r1", "r2"])) == {"r1": state(3)}
    assert [s.step_seq for s in await steps.get_steps("acme", "r1")] == [0]
    assert (await steps.list_runs_page("acme", limit=5)).runs == []
    assert [d.reasoning for d in await deep_store.get_deep("acme", "r1")] == ["hm"]
    assert (await deep_store.list_deep_runs("acme")) == [("r1", TS)]
    assert await deep_store.prune("acme", 1) == [] and await deep_store.purge_run("acme", "r1") == 1
    await steps.close()
    await deep_store.close()
    assert read_log(plan) == []


async def test_fail_raises_retriable_for_the_next_count_calls_and_writes_nothing(stores, plan):
    steps, deep_store = wrapped(stores, plan, [{"store": "steps", "op": "write", "action": "fail", "count": 2}])
    assert await outcomes(steps, 4) == "FF.."
    assert [s.step_seq for s in await stores[0].get_steps("acme", "r1")] == [2, 3]
    await deep_store.write([deep()])  # another store: untouched
    try:
        await steps.write([step()])
    except SinkUnavailable as exc:  # pragma: no cover - the count is spent
        pytest.fail(f"count exhausted, still failing: {exc}")
    log = read_log(plan)
    assert [(e["store"], e["op"], e["action"], e["rule"]) for e in log] == [("steps", "write", "fail", 0)] * 2
    assert all(abs(e["time"] - time.time()) < 60 and e["pid"] == os.getpid() for e in log)


async def test_fatal_is_a_sink_error_that_is_not_retriable(stores, plan):
    steps, _ = wrapped(stores, plan, [{"store": "*", "op": "load_states", "action": "fatal", "count": 1}])
    with pytest.raises(SinkError) as info:
        await steps.load_states("acme", ["r1"])
    assert not isinstance(info.value, SinkUnavailable) and info.value.retriable is False
    await steps.write([step()])  # another op: untouched
    assert await steps.load_states("acme", ["r1"]) == {}
    assert [e["action"] for e in read_log(plan)] == ["fatal"]


async def test_fail_after_lands_the_write_then_reports_failure(stores, plan):
    _, deep_store = wrapped(stores, plan, [{"store": "deep", "op": "write", "action": "fail_after", "count": 1}])
    with pytest.raises(SinkUnavailable):
        await deep_store.write([deep(4)])
    assert [d.step_seq for d in await stores[1].get_deep("acme", "r1")] == [4]
    await deep_store.write([deep(4)])  # the retry the worker makes: idempotent, succeeds
    assert len(await stores[1].get_deep("acme", "r1")) == 1
    assert [(e["store"], e["action"]) for e in read_log(plan)] == [("deep", "fail_after")]


async def test_hang_sleeps_then_delegates_and_a_cancelled_hang_writes_nothing(stores, plan):
    steps, _ = wrapped(stores, plan, [{"op": "write", "action": "hang", "seconds": 0.3, "count": 2}])
    started = time.monotonic()
    await steps.write([step(0)])
    assert time.monotonic() - started >= 0.29
    assert len(await stores[0].get_steps("acme", "r1")) == 1
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(steps.write([step(1)]), timeout=0.05)
    assert [s.step_seq for s in await stores[0].get_steps("acme", "r1")] == [0]
    started = time.monotonic()
    await steps.write([step(2)])  # count spent: immediate
    assert time.monotonic() - started < 0.2
    assert [e["action"] for e in read_log(plan)] == ["hang", "hang"]  # logged when the hang begins


async def test_star_op_matches_every_method_but_close(stores, plan):
    steps, deep_store = wrapped(stores, plan, [{"action": "fail"}])
    for call in (
        lambda: steps.get_run("acme", "r1"),
        lambda: steps.list_runs("acme"),
        lambda: deep_store.get_deep("acme", "r1"),
        lambda: deep_store.purge_company("acme"),
    ):
        with pytest.raises(SinkUnavailable):
            await call()
    await steps.close()
    await deep_store.close()
    write_plan(plan, {"rules": [{"op": "close", "action": "fatal"}]})
    with pytest.raises(SinkError):
        await steps.close()


async def test_rules_are_tried_in_order_and_count_only_injected_faults(stores, plan):
    steps, _ = wrapped(
        stores,
        plan,
        [
            {"store": "deep", "action": "fatal"},  # never matches a step store call
            {"op": "write", "action": "fail", "count": 1},
            {"op": "write", "action": "fail_after", "count": 1},
        ],
    )
    assert await outcomes(steps, 3) == "FF."
    assert [(e["action"], e["rule"]) for e in read_log(plan)] == [("fail", 1), ("fail_after", 2)]
    assert [s.step_seq for s in await stores[0].get_steps("acme", "r1")] == [1, 2]  # fail_after landed


async def test_probability_draws_are_deterministic_under_the_seed(tmp_path):
    async def pattern(seed: int, name: str) -> str:
        path = tmp_path / f"{name}.json"
        write_plan(path, {"seed": seed, "rules": [{"op": "write", "action": "fail", "probability": 0.3}]})
        steps, _ = wrap_stores(MemoryStepStore(), MemoryDeepStore(), path)
        return await outcomes(steps, 300)

    a, b, c = await pattern(7, "a"), await pattern(7, "b"), await pattern(8, "c")
    assert a == b and a != c
    assert 60 <= a.count("F") <= 120, a.count("F")


async def test_a_changed_plan_is_reloaded_with_fresh_counts(stores, plan):
    steps, _ = wrapped(stores, plan, [{"op": "write", "action": "fail", "count": 1}])
    assert await outcomes(steps, 2) == "F."
    write_plan(plan, {"rules": [{"op": "write", "action": "fail", "count": 2}]})
    assert await outcomes(steps, 3) == "FF."
    write_plan(plan, {"rules": [{"op": "write", "action": "fail"}]})  # unlimited: a store that is away
    assert await outcomes(steps, 5) == "FFFFF"
    write_plan(plan, FaultPlan())  # back
    assert await outcomes(steps, 2) == ".."
    write_plan(plan, FaultPlan(rules=[FaultRule(action="fail", count=1)]))
    plan.unlink()  # a removed plan: no faults
    assert await outcomes(steps, 2) == ".."
    assert len(read_log(plan)) == 1 + 2 + 5


async def test_an_invalid_plan_is_refused_at_start_and_ignored_on_reload(stores, plan):
    plan.write_text('{"rules": [{"action": "explode"}]}')
    with pytest.raises(ConfigError):
        wrap_stores(*stores, plan)
    plan.write_text('{"rules": [{"action": "fail", "op": "wrte"}]}')
    with pytest.raises(ConfigError, match="wrte"):
        wrap_stores(*stores, plan)
    with pytest.raises(ConfigError):
        write_plan(plan, {"rules": [{"action": "fail", "probability": 2}]})
    steps, _ = wrapped(stores, plan, [{"op": "write", "action": "fail", "count": 5}])
    assert await outcomes(steps, 1) == "F"
    plan.write_text("{not json")  # half a file, or a typo: the previous plan stays
    assert await outcomes(steps, 2) == "FF"


def test_the_log_skips_a_torn_last_line(plan):
    log = plan.with_name(plan.name + ".log")
    log.write_text('{"store": "steps", "op": "write", "action": "fail", "time": 1, "pid": 1, "rule": 0}\n{"sto')
    assert [e["action"] for e in read_log(plan)] == ["fail"]
