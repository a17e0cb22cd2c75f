"""Properties of the engine over arbitrary interleavings of many runs' events, with
duplicates, re-deliveries, idle flushes, crashes and restarts from durable state.

The oracle is a deliberately naive model of the ordinal rules (``model``), plus the
reference store of ``fold_support`` (the merge semantics of ``core/records.py``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec
from fold_support import T0, Store, ev, restart_from_every_snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stepstream.core.caps import clip, json_text
from stepstream.core.fold import Limits, Output, RunFold

CANARIES = ("THINKCANARY", "OUTCANARY", "INCANARY", "ARGSECRET", "STATESECRET")
PIECES = ("a", "b", " ", "é", "ß", "日本", "😀", "👩‍💻", "🇪🇺", "\n", "THINKCANARY", "𝔘")

PROPS = settings(max_examples=250, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])

texts = st.lists(st.sampled_from(PIECES), max_size=10).map("".join)
call_ids = st.sampled_from(["c0", "c1", "c2"])
ops = st.one_of(
    st.tuples(st.just("think"), texts),
    st.tuples(st.just("think"), texts),
    st.tuples(st.just("think"), texts),
    st.tuples(st.just("call"), st.sampled_from(["tool", "llm"]), call_ids),
    st.tuples(st.just("result"), st.sampled_from(["tool", "llm"]), call_ids, st.booleans()),
    st.tuples(st.just("state"), st.sampled_from(["plan", "session_token"])),
    st.tuples(st.just("error"), st.none() | st.just("timeout")),
    st.tuples(st.just("start")),
    st.tuples(st.just("end"), st.sampled_from(["completed", "failed"])),
)
limits_st = st.builds(
    Limits,
    reasoning_chars=st.integers(12, 80),
    output_chars=st.integers(12, 60),
    arguments_chars=st.integers(12, 60),
    max_steps=st.integers(1, 10),
    flush_bytes=st.integers(1, 40),
    idle_seconds=st.just(5.0),
    flush_deltas=st.integers(1, 6) | st.just(512),
)


def to_event(run: str, seq: int, op: tuple, jitter: int) -> Any:
    ts = T0 + timedelta(milliseconds=10 * seq + jitter)
    kw: dict[str, Any] = {"run": run, "ts": ts}
    kind = op[0]
    if kind == "think":
        return ev("thinking_delta", seq, text=op[1], **kw)
    if kind == "call" and op[1] == "tool":
        return ev("tool_call", seq, call_id=op[2], tool="sh", arguments={"q": "visible", "api_key": "ARGSECRET"}, **kw)
    if kind == "call":
        return ev("llm_request", seq, call_id=op[2], provider="p", model="m", input=["INCANARY"], params={"t": 1}, **kw)
    if kind == "result" and op[1] == "tool":
        return ev("tool_result", seq, call_id=op[2], output={"o": "OUTCANARY" * 3}, is_error=op[3], **kw)
    if kind == "result":
        return ev("llm_response", seq, call_id=op[2], output="OUTCANARY", **kw)
    if kind == "state":
        return ev("state_change", seq, key=op[1], value="STATESECRET" if op[1] == "session_token" else [1, 2], **kw)
    if kind == "error":
        return ev("error", seq, message="boom", kind=op[1], **kw)
    if kind == "start":
        return ev("run_start", seq, agent_name="bot", **kw)
    return ev("run_end", seq, status=op[1], failure="why" if op[1] == "failed" else None, **kw)


def model(ops_: list[tuple], lim: Limits) -> dict[str, Any]:
    """The ordinal rules, spelled out naively: ordinal -> (kind, status, texts)."""
    steps: dict[int, list] = {}
    open_: dict[str, int] = {}
    nxt = dropped = 0
    th: int | str | None = None

    def alloc() -> int | None:
        nonlocal nxt, dropped
        if nxt >= lim.max_steps:
            dropped += 1
            return None
        nxt += 1
        return nxt - 1

    for op in ops_:
        if op[0] == "think":
            if th is None:
                got = alloc()
                th = "dropped" if got is None else got
                if got is not None:
                    steps[got] = ["thinking", "running", []]
            if th != "dropped":
                steps[th][2].append(op[1])
            continue
        if isinstance(th, int):
            steps[th][1] = "ok"
        th = None
        if op[0] == "call":
            got = alloc()
            if got is not None:
                open_[f"{op[1]}:{op[2]}"] = got
                steps[got] = [op[1], "running", None]
        elif op[0] == "result":
            status = "error" if op[1] == "tool" and op[3] else "ok"
            got = open_.pop(f"{op[1]}:{op[2]}", None)
            if got is None and nxt < lim.max_steps:
                got = alloc()
            if got is not None:
                steps[got] = [op[1], status, None]
        elif op[0] in ("state", "error"):
            got = alloc()
            if got is not None:
                steps[got] = [op[0], "ok" if op[0] == "state" else "error", None]
    return {"steps": steps, "count": nxt, "dropped": dropped}


@st.composite
def scenarios(draw):
    lim = draw(limits_st)
    scripts = draw(st.lists(st.lists(ops, max_size=25), min_size=1, max_size=6))
    labels = [r for r, script in enumerate(scripts) for _ in script]
    order = draw(st.permutations(labels))
    jitters = draw(st.lists(st.integers(-15, 15), min_size=len(order), max_size=len(order)))
    cursor = [0] * len(scripts)
    deliveries = []
    for label, jitter in zip(order, jitters, strict=True):
        seq = cursor[label]
        cursor[label] += 1
        deliveries.append(to_event(f"r{label}", seq, scripts[label][seq], jitter))
    # Duplicates and re-deliveries: windows of already delivered events, delivered again.
    for _ in range(draw(st.integers(0, 4))):
        if not deliveries:
            break
        at = draw(st.integers(0, len(deliveries)))
        size = draw(st.integers(1, 8))
        deliveries[at:at] = deliveries[max(0, at - size) : at]
    return lim, scripts, deliveries


def ingest(deliveries: list, lim: Limits) -> tuple[Store, list[Output]]:
    """The uninterrupted fold (``ingest-file``): in order, one flush at the end."""
    store, outs, folds = Store(), [], {}
    for e in deliveries:
        fold = folds.setdefault(e.run_id, RunFold("acme", e.run_id, None, lim))
        out = fold.push(e, 0.0)
        if out is not None:
            outs.append(out)
            store.write(out)
    for fold in folds.values():
        out = fold.flush()
        if out is not None:
            outs.append(out)
            store.write(out)
    return store, outs


def worker(deliveries: list, lim: Limits, plan: dict[str, set[int]], partial: bool) -> Store:
    """A simulated worker: batches written at commit points, idle flushes, and
    crashes that lose the open batch (or write only its deep rows), after which
    every fold restarts from the store's durable state and the consumer re-reads
    from the beginning."""
    store, batch, folds = Store(), [], {}
    crashes = set(plan["crash"])
    now, i = 0.0, 0
    while i < len(deliveries):
        if i in crashes:
            crashes.discard(i)
            if partial:
                for out in batch:
                    store.write(Output(deeps=out.deeps))
            batch, folds, i = [], {}, 0
            continue
        e = deliveries[i]
        fold = folds.get(e.run_id)
        if fold is None:
            fold = folds[e.run_id] = RunFold("acme", e.run_id, store.states.get(("acme", e.run_id)), lim)
        now += 1.0
        out = fold.push(e, now)
        if out is not None:
            batch.append(out)
        if i in plan["idle"]:
            now += 10.0
            batch.extend(o for o in (f.flush_idle(now) for f in folds.values()) if o is not None)
        if i in plan["commit"]:
            for out in batch:
                store.write(out)
            batch = []
        i += 1
    batch.extend(o for o in (f.flush() for f in folds.values()) if o is not None)
    for out in batch:
        store.write(out)
    return store


def visible(outs: list[Output]) -> str:
    return msgspec.json.encode([[o.steps, o.run, o.state] for o in outs]).decode()


@PROPS
@given(scenarios())
def test_ordinals_texts_and_canaries(scenario):
    lim, scripts, deliveries = scenario
    store, outs = ingest(deliveries, lim)
    text = visible(outs)
    for canary in CANARIES:
        assert canary not in text
    for r, script in enumerate(scripts):
        run = f"r{r}"
        want = model(script, lim)
        got = {k[2]: v for k, v in store.steps.items() if k[1] == run}
        deeps = {k[2]: v for k, v in store.deeps.items() if k[1] == run}
        # Dense, deterministic ordinals; steps and deeps aligned.
        assert sorted(got) == list(range(want["count"])) == sorted(deeps)
        assert sorted(want["steps"]) == sorted(got)
        for ordinal, (kind, status, pieces) in want["steps"].items():
            step, deep = got[ordinal], deeps[ordinal]
            assert (step.kind, step.status) == (kind, status), ordinal
            if kind == "thinking":
                full = "".join(pieces)
                kept, cut = clip(full, lim.reasoning_chars)
                assert deep.reasoning == kept and deep.clipped == cut
                deep.reasoning.encode("utf-8")  # never a split code point
                assert full.startswith(kept[: len(kept) - (len("…[clipped]") if cut else 0)])
                assert step.output_shape is not None and "CANARY" not in step.output_shape
        if script:
            rec = store.runs[("acme", run)]
            assert rec.step_count == want["count"] and rec.dropped_steps == want["dropped"]
            assert rec.truncated == (want["dropped"] > 0)
            assert rec.seq_gaps == 0
            assert store.states[("acme", run)].last_seq == len(script) - 1
    for deep in store.deeps.values():
        for body, cap in (
            (deep.arguments, lim.arguments_chars),
            (deep.output, lim.output_chars),
            (deep.reasoning, lim.reasoning_chars),
        ):
            seen = body if body is None or isinstance(body, str) else json_text(body)  # what a reader sees
            assert seen is None or len(seen) <= cap


@PROPS
@given(scenarios(), st.data())
def test_worker_with_idle_flushes_and_crashes_converges(scenario, data):
    lim, _, deliveries = scenario
    reference, _ = ingest(deliveries, lim)
    n = len(deliveries)
    positions = st.sets(st.integers(0, max(0, n - 1)), max_size=6)
    plan = {"crash": data.draw(positions), "idle": data.draw(positions), "commit": data.draw(positions)}
    store = worker(deliveries, lim, plan, data.draw(st.booleans()))
    assert store.snapshot() == reference.snapshot()


@PROPS
@given(scenarios(), st.data())
def test_replaying_a_prefix_changes_nothing(scenario, data):
    lim, _, deliveries = scenario
    reference, _ = ingest(deliveries, lim)
    cut = data.draw(st.integers(0, len(deliveries)))
    again = data.draw(st.integers(0, cut))
    store, outs = ingest(deliveries[:cut] + deliveries[:again] + deliveries[cut:], lim)
    assert store.snapshot() == reference.snapshot()


@PROPS
@given(scenarios())
def test_restart_from_every_durable_snapshot(scenario):
    lim, _, deliveries = scenario
    reference, outs = ingest(deliveries, lim)
    restart_from_every_snapshot(deliveries, lim, reference, outs)
