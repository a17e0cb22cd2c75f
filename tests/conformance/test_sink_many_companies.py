"""A batch that carries many companies (more than the MongoDB adapter reads in one
query each): every run is judged by its own company's stored state, and every
thinking row's text is merged onto its own company's stored text. The same run id
and ordinal in every company, so a read keyed by less than the company mixes them."""

from __future__ import annotations

from stepstream.sinks import DeepStore, StepStore

from sink_support import deep, run, state, step

COMPANIES = [f"co-{i:02d}" for i in range(40)]
SHARED = "run-shared"


def _stored_seq(i: int) -> int:
    return i % 3 + 1  # 1, 2 or 3: a third of the companies behind the next batch's 2, two thirds at or past it


async def test_a_batch_of_many_companies_is_judged_per_company(step_store: StepStore) -> None:
    for i, company in enumerate(COMPANIES):  # each company's state written alone
        await step_store.write(
            [step(0, SHARED, company, label=f"first-{company}")],
            [run(SHARED, company, step_count=1)],
            [state(SHARED, company, last_seq=_stored_seq(i), next_ordinal=1)],
        )
    skipped = await step_store.write(
        [step(1, SHARED, company, label=f"second-{company}") for company in COMPANIES],
        [run(SHARED, company, step_count=2) for company in COMPANIES],
        [state(SHARED, company, last_seq=2, next_ordinal=2) for company in COMPANIES],
    )
    behind = [c for i, c in enumerate(COMPANIES) if _stored_seq(i) < 2]
    ahead = [c for c in COMPANIES if c not in behind]
    assert sorted(skipped) == sorted((c, SHARED) for c in ahead)
    for i, company in enumerate(COMPANIES):
        labels = [s.label for s in await step_store.get_steps(company, SHARED)]
        stored = (await step_store.load_states(company, [SHARED]))[SHARED]
        if company in behind:
            assert labels == [f"first-{company}", f"second-{company}"]
            assert (stored.last_seq, stored.next_ordinal) == (2, 2)
            assert (await step_store.get_run(company, SHARED)).step_count == 2
        else:
            assert labels == [f"first-{company}"]
            assert stored.last_seq == _stored_seq(i)
            assert (await step_store.get_run(company, SHARED)).step_count == 1


async def test_the_reasoning_of_many_companies_in_one_batch_merges_per_row(deep_store: DeepStore) -> None:
    # Stored texts of different lengths per company; then one batch of chunks for every
    # company, each at its own company's end and one overwriting its company's start.
    for company in COMPANIES:
        await deep_store.write([deep(0, SHARED, company, kind="thinking", reasoning=f"<{company}>" + "a" * len(company))])
    batch = []
    for company in COMPANIES:
        head = f"<{company}>"
        stored_length = len(head) + len(company)
        batch.append(deep(0, SHARED, company, kind="thinking", reasoning=f"+{company}", reasoning_offset=stored_length, at=1))
        batch.append(deep(0, SHARED, company, kind="thinking", reasoning="[", reasoning_offset=0, at=2))
    await deep_store.write(batch)
    for company in COMPANIES:
        [row] = await deep_store.get_deep(company, SHARED)
        assert row.reasoning == f"[{company}>" + "a" * len(company) + f"+{company}"
        assert row.company_id == company
