"""Random write sequences read back exactly as the memory reference reads them.

Each example writes under a company of its own, so one store serves every example
(the ports promise that companies never see each other). On failure hypothesis
prints the seed and the shrunk sequence."""

from __future__ import annotations

import itertools

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepstream.core.merge import apply_deep, can_merge_deep, merge_deep
from stepstream.core.records import DeepRecord, RunRecord, RunState, StepRecord
from stepstream.sinks import DeepStore, StepStore
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore

_companies = itertools.count()

PROPERTY_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Any character JSON and every backend can carry: no lone surrogates (not UTF-8).
text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
maybe_text = st.none() | text
runs = st.sampled_from(["r1", "r2"])
seqs = st.integers(0, 3)
times = st.integers(0, 9).map(lambda n: f"2025-01-01T00:00:0{n}.000000Z")
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=6,
)


bodies = st.none() | text | json_values.filter(lambda v: v is not None)


@st.composite
def deep_writes(draw: st.DrawFn, body: st.SearchStrategy = maybe_text) -> DeepRecord:
    reasoning = draw(maybe_text)
    return DeepRecord(
        company_id="",
        run_id=draw(runs),
        step_seq=draw(seqs),
        kind=draw(st.sampled_from(["thinking", "tool", "llm"])),
        ts=draw(times),
        reasoning=reasoning,
        reasoning_offset=draw(st.integers(0, 16)) if reasoning is not None else 0,
        arguments=draw(body),
        output=draw(body),
        clipped=draw(st.booleans()),
    )


@st.composite
def step_writes(draw: st.DrawFn) -> StepRecord:
    return StepRecord(
        company_id="",
        run_id=draw(runs),
        step_seq=draw(seqs),
        kind=draw(st.sampled_from(["thinking", "tool", "llm", "state", "error"])),
        label=draw(maybe_text),
        status=draw(st.none() | st.sampled_from(["running", "ok", "error"])),
        call_id=draw(maybe_text),
        arguments=draw(st.none() | json_values.filter(lambda v: v is not None)),
        output_shape=draw(maybe_text),
        started_at=draw(st.none() | times),
    )


@st.composite
def run_writes(draw: st.DrawFn) -> RunRecord:
    return RunRecord(
        company_id="",
        run_id=draw(runs),
        agent_name=draw(maybe_text),
        status=draw(st.sampled_from(["running", "completed", "failed"])),
        started_at=draw(st.none() | times),
        last_event_at=draw(st.none() | times),
        step_count=draw(st.integers(0, 500)),
        truncated=draw(st.booleans()),
    )


def batches(items: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(st.lists(items, min_size=1, max_size=5), min_size=1, max_size=6)


def _company() -> str:
    return f"prop-{next(_companies)}"


def _own(records: list, company: str) -> list:
    return [msgspec.structs.replace(r, company_id=company) for r in records]


@PROPERTY_SETTINGS
@given(batches(deep_writes()))
async def test_deep_writes_match_the_reference(deep_store: DeepStore, writes: list[list[DeepRecord]]) -> None:
    company = _company()
    reference = MemoryDeepStore()
    for batch in writes:
        batch = _own(batch, company)
        await reference.write(batch)
        await deep_store.write(batch)
    for run_id in ("r1", "r2"):
        assert await deep_store.get_deep(company, run_id) == await reference.get_deep(company, run_id)
    assert await deep_store.list_deep_runs(company) == await reference.list_deep_runs(company)


@PROPERTY_SETTINGS
@given(batches(deep_writes(bodies)))
async def test_deep_rows_are_core_merge_of_the_writes(deep_store: DeepStore, writes: list[list[DeepRecord]]) -> None:
    """The one definition (``core.merge.apply_deep``, positional reasoning included:
    chunks past the stored end, rows with no text yet) is what every backend holds,
    with JSON-value bodies of any shape."""
    company = _company()
    expected: dict[tuple[str, int], DeepRecord] = {}
    for batch in writes:
        batch = _own(batch, company)
        await deep_store.write(batch)
        for d in batch:
            expected[(d.run_id, d.step_seq)] = apply_deep(expected.get((d.run_id, d.step_seq)), d)
    for run_id in ("r1", "r2"):
        want = [expected[key] for key in sorted(expected) if key[0] == run_id]
        assert await deep_store.get_deep(company, run_id) == want


@PROPERTY_SETTINGS
@given(batches(step_writes()), st.lists(run_writes(), max_size=4), st.integers(1, 3))
async def test_step_writes_match_the_reference(
    step_store: StepStore, writes: list[list[StepRecord]], run_records: list[RunRecord], limit: int
) -> None:
    company = _company()
    reference = MemoryStepStore()
    run_records = _own(run_records, company)
    states = [RunState(company_id=company, run_id=r.run_id, last_seq=r.step_count, run=r) for r in run_records]
    for i, batch in enumerate(writes):
        batch = _own(batch, company)
        extra = (run_records, states) if i == len(writes) - 1 else ((), ())
        await reference.write(batch, *extra)
        await step_store.write(batch, *extra)
    for run_id in ("r1", "r2"):
        assert await step_store.get_steps(company, run_id) == await reference.get_steps(company, run_id)
        assert await step_store.get_run(company, run_id) == await reference.get_run(company, run_id)
    assert await step_store.load_states(company, ["r1", "r2"]) == await reference.load_states(company, ["r1", "r2"])
    page, expected = (
        await step_store.list_runs_page(company, limit=limit),
        await reference.list_runs_page(company, limit=limit),
    )
    assert page == expected
    if page.next_cursor:
        assert await step_store.list_runs(company, before=page.next_cursor) == await reference.list_runs(
            company, before=page.next_cursor
        )


@st.composite
def step_batches(draw: st.DrawFn) -> tuple[list[StepRecord], list[RunRecord], list[RunState]]:
    """A step batch as the worker writes it, with states whose ``last_seq`` may be
    behind, equal to or ahead of what is stored (a late former owner, a replay)."""
    steps = draw(st.lists(step_writes(), max_size=4))
    run_records = draw(st.lists(run_writes(), max_size=2))
    states = [
        RunState(company_id="", run_id=run_id, last_seq=seq, next_ordinal=seq + 1)
        for run_id, seq in draw(st.lists(st.tuples(runs, st.integers(0, 5)), max_size=3))
    ]
    return steps, run_records, states


@PROPERTY_SETTINGS
@given(st.lists(step_batches(), min_size=1, max_size=6))
async def test_stale_runs_match_the_reference(
    step_store: StepStore, batches_: list[tuple[list[StepRecord], list[RunRecord], list[RunState]]]
) -> None:
    company = _company()
    reference = MemoryStepStore()
    for steps, run_records, states in batches_:
        batch = (_own(steps, company), _own(run_records, company), _own(states, company))
        assert await step_store.write(*batch) == await reference.write(*batch)
    for run_id in ("r1", "r2"):
        assert await step_store.get_steps(company, run_id) == await reference.get_steps(company, run_id)
        assert await step_store.get_run(company, run_id) == await reference.get_run(company, run_id)
    assert await step_store.load_states(company, ["r1", "r2"]) == await reference.load_states(company, ["r1", "r2"])


@st.composite
def chunk_pairs(draw: st.DrawFn) -> tuple[str, DeepRecord, DeepRecord]:
    """A stored text and two reasoning writes the worker might coalesce: the second
    starting within or right after the first (``can_merge_deep``), both within the
    stored text or at its end (the engine never leaves a gap)."""
    stored = draw(text)
    first_at = draw(st.integers(0, len(stored)))
    first = draw(text)
    second_at = first_at + draw(st.integers(0, len(first)))

    def chunk(body: str, at: int, n: int) -> DeepRecord:
        return DeepRecord(
            company_id="",
            run_id="r1",
            step_seq=0,
            kind="thinking",
            ts=f"2025-01-01T00:00:0{n}.000000Z",
            reasoning=body,
            reasoning_offset=at,
        )

    return stored, chunk(first, first_at, 1), chunk(draw(text), second_at, 2)


@PROPERTY_SETTINGS
@given(chunk_pairs())
async def test_coalesced_chunks_match_separate_writes(
    deep_store: DeepStore, pair: tuple[str, DeepRecord, DeepRecord]
) -> None:
    """``core.merge`` coalesces a batch's chunks of one row; writing the coalesced
    chunk must leave what writing both in order leaves, on every backend."""
    stored, first, second = pair
    assert can_merge_deep(first, second)
    apart, joined = _company(), _company()
    base = msgspec.structs.replace(first, reasoning=stored, reasoning_offset=0)
    for company in (apart, joined):
        await deep_store.write(_own([base], company))
    await deep_store.write(_own([first, second], apart))
    await deep_store.write(_own([merge_deep(first, second)], joined))
    separate, coalesced = await deep_store.get_deep(apart, "r1"), await deep_store.get_deep(joined, "r1")
    assert [msgspec.structs.replace(d, company_id="") for d in separate] == [
        msgspec.structs.replace(d, company_id="") for d in coalesced
    ]
