"""A run id shared by two companies leaks in neither direction, for every read and
every purge (``seeds/deep-trace.md``, "It holds secrets, by design")."""

from __future__ import annotations

from stepstream.sinks import DeepStore, StepStore

from sink_support import COMPANY, OTHER, deep, run, state, step, ts

SHARED = "run-shared"


async def _write_both(step_store: StepStore, deep_store: DeepStore) -> None:
    for company, secret in ((COMPANY, "acme-secret"), (OTHER, "globex-secret")):
        await step_store.write(
            [step(0, SHARED, company, label=secret), step(1, SHARED, company, label=secret)],
            [run(SHARED, company, agent_name=secret, started_at=ts(1))],
            [state(SHARED, company, last_seq=1 if company == COMPANY else 2)],
        )
        await deep_store.write(
            [
                deep(0, SHARED, company, kind="thinking", reasoning=secret, at=1),
                deep(1, SHARED, company, output=secret, at=2),
                deep(2, SHARED, company, arguments=secret, at=3 if company == COMPANY else 9),
            ]
        )


async def test_every_read_stays_inside_its_company(step_store: StepStore, deep_store: DeepStore) -> None:
    await _write_both(step_store, deep_store)
    await step_store.write([], [run("acme-only", COMPANY, started_at=ts(2))])
    for company, secret, other_secret in (
        (COMPANY, "acme-secret", "globex-secret"),
        (OTHER, "globex-secret", "acme-secret"),
    ):
        got_steps = await step_store.get_steps(company, SHARED)
        assert [s.label for s in got_steps] == [secret, secret]
        assert {s.company_id for s in got_steps} == {company}
        assert (await step_store.get_run(company, SHARED)).agent_name == secret
        states = await step_store.load_states(company, [SHARED, "acme-only"])
        assert list(states) == [SHARED] and states[SHARED].company_id == company
        runs = await step_store.list_runs(company)
        assert other_secret not in repr(runs) and {r.company_id for r in runs} == {company}
        page = await step_store.list_runs_page(company, limit=1)
        assert page.runs[0].company_id == company
        got_deep = await deep_store.get_deep(company, SHARED)
        assert (
            len(got_deep) == 3 and other_secret not in repr(got_deep) and {d.company_id for d in got_deep} == {company}
        )
        assert [run_id for run_id, _ in await deep_store.list_deep_runs(company)] == [SHARED]
    assert await deep_store.list_deep_runs(COMPANY) == [(SHARED, ts(3))]
    assert await deep_store.list_deep_runs(OTHER) == [(SHARED, ts(9))]
    assert [r.run_id for r in await step_store.list_runs(COMPANY)] == ["acme-only", SHARED]
    assert [r.run_id for r in await step_store.list_runs(OTHER)] == [SHARED]
    # A cursor made for one company pages nothing of another.
    cursor = (await step_store.list_runs_page(COMPANY, limit=1)).next_cursor
    assert [r.company_id for r in await step_store.list_runs(OTHER, before=cursor)] == [OTHER]
    assert await step_store.get_run(OTHER, "acme-only") is None
    assert await step_store.get_steps(OTHER, "acme-only") == []


async def test_a_run_purge_stays_inside_its_company(step_store: StepStore, deep_store: DeepStore) -> None:
    await _write_both(step_store, deep_store)
    assert await deep_store.purge_run(COMPANY, SHARED) == 3
    assert await deep_store.get_deep(COMPANY, SHARED) == []
    assert len(await deep_store.get_deep(OTHER, SHARED)) == 3
    assert await deep_store.purge_run(COMPANY, SHARED) == 0


async def test_a_company_purge_stays_inside_the_company(step_store: StepStore, deep_store: DeepStore) -> None:
    await _write_both(step_store, deep_store)
    await deep_store.write([deep(0, "acme-2", COMPANY, output="x"), deep(5, "acme-2", COMPANY, output="y")])
    assert await deep_store.purge_company(COMPANY) == 5
    assert await deep_store.list_deep_runs(COMPANY) == []
    assert await deep_store.get_deep(COMPANY, "acme-2") == []
    assert len(await deep_store.get_deep(OTHER, SHARED)) == 3
    assert await deep_store.purge_company(COMPANY) == 0
    assert len(await step_store.get_steps(COMPANY, SHARED)) == 2  # steps stay


async def test_a_prune_stays_inside_the_company(step_store: StepStore, deep_store: DeepStore) -> None:
    await _write_both(step_store, deep_store)
    assert await deep_store.prune(COMPANY, 0) == [SHARED]
    assert await deep_store.get_deep(COMPANY, SHARED) == []
    assert len(await deep_store.get_deep(OTHER, SHARED)) == 3
