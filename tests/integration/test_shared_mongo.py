"""Many workers, one shared MongoDB-wire store (issue 22 item 4), on the real broker and
the FerretDB-on-PostgreSQL server ``make test`` starts.

Three workers share one database for steps and deep rows, with SIGKILLs, a worker
leaving (SIGTERM) and others joining; the compactor loops beside them (ranking every
second, pruning nothing: a limit above the corpus, no abandon rule) and the API serves
runs lists from the same database while they write. At the end the store equals what
``ingest-file`` of the same corpus leaves in SQLite, record for record.

Two workers sharing one SQLite file are covered by ``test_faults`` (a main worker and a
second one joining and leaving share its steps and deep files) and by
``test_two_workers_share_one_sqlite_file`` below (steps and deep rows in one file).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import urllib.request
import uuid

import pytest

from harness import Scenario, dump, first_difference, free_port, golden_dump, wait_caught_up, wait_for
from stepstream.api.tokens import add_token
from stepstream.emitter.corpus import generate_events

from test_compactor import CompactorProcess

pytestmark = pytest.mark.integration

PARTITIONS = 6
RUNS = 24
COMPANIES = 3
SESSION_TIMEOUT = "4.0"


@pytest.fixture(scope="module")
def corpus():
    events = generate_events(20261202, runs=RUNS, companies=COMPANIES)
    return events, sorted({e.company_id for e in events})


@pytest.fixture(scope="module")
def golden(corpus, tmp_path_factory):
    events, companies = corpus
    return asyncio.run(golden_dump(events, tmp_path_factory.mktemp("golden"), companies))


def _database_url(base: str, name: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))


async def _drop(url: str) -> None:
    from pymongo import AsyncMongoClient

    client: AsyncMongoClient = AsyncMongoClient(url)
    try:
        await client.drop_database(client.get_default_database())
    finally:
        await client.close()


class _Api:
    """``stepstream api`` on the shared store; :meth:`list_runs` counts its answers."""

    def __init__(self, scenario: Scenario, company: str) -> None:
        tokens = scenario.tmp / "tokens.json"
        self.token, _ = add_token(tokens, company, ["steps:read", "deep:read"], created="test")
        self.company = company
        self.port = free_port()
        env = {**os.environ, "STEPSTREAM_STEPS_SINK": scenario.steps_url, "STEPSTREAM_DEEP_SINK": scenario.deep_url,
               "STEPSTREAM_TOKENS_FILE": str(tokens)}  # fmt: skip
        self.log = (scenario.tmp / "api.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stepstream.cli", "api", "--port", str(self.port)], env=env,
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.answers = 0

    def list_runs(self) -> list[dict]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/companies/{self.company}/runs?limit=50",
            headers={"Authorization": f"Bearer {self.token}"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200
            self.answers += 1
            return json.loads(answer.read())["runs"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)
        self.log.close()


async def test_three_workers_kills_joins_leaves_compactor_and_api_on_one_store(
    kafka_bootstrap, mongo_url, tmp_path, corpus, golden
):
    events, companies = corpus
    scenario = Scenario(kafka_bootstrap, tmp_path, PARTITIONS)
    scenario.steps_url = scenario.deep_url = _database_url(mongo_url, f"stepstream_test_{uuid.uuid4().hex[:12]}")
    env = {"STEPSTREAM_SESSION_TIMEOUT_SECONDS": SESSION_TIMEOUT, "STEPSTREAM_BATCH_RECORDS": "400"}
    rng = random.Random(22)
    compactor = api = None
    try:
        await scenario.create_topics()
        workers = {f"w{i}": scenario.start_worker(name=f"w{i}", **env) for i in range(3)}
        compactor = CompactorProcess(
            scenario, env={"STEPSTREAM_COMPACTOR_INTERVAL_SECONDS": "1", "STEPSTREAM_DEEP_RUNS_PER_COMPANY": "100000",
                           "STEPSTREAM_ABANDON_AFTER_SECONDS": "0"},
        )  # fmt: skip
        api = _Api(scenario, companies[0])
        await wait_for(lambda: _serving(api), 60, "the API to answer")
        slices, kills, joined, left = 6, 0, 0, 0
        chunk = len(events) // slices + 1
        for i, start in enumerate(range(0, len(events), chunk)):
            await scenario.produce(events[start : start + chunk])
            await asyncio.sleep(rng.uniform(0.5, 1.5))
            await asyncio.to_thread(api.list_runs)
            name = rng.choice(sorted(workers))
            if i % 2 == 0:
                workers.pop(name).kill()  # SIGKILL at a random instant of its work
                kills += 1
            elif i == 3:
                await asyncio.to_thread(workers[name].wait_web)
                assert workers.pop(name).stop(timeout=30) == 0  # leaves cleanly
                left += 1
            if len(workers) < 3:
                new = f"j{i}"
                workers[new] = scenario.start_worker(name=new, **env)  # joins
                joined += 1
        live = list(workers.values())
        await wait_caught_up(scenario.broker, scenario.group, scenario.topic, live, timeout=240, stall=90)
        assert compactor.proc.poll() is None, compactor.tail()
        assert len(await asyncio.to_thread(api.list_runs)) > 0
        for worker in live:
            assert worker.stop(timeout=30) == 0, worker.tail()
        assert compactor.stop() == 0
        compactor = None
        assert kills >= 3 and joined >= 3 and left == 1 and api.answers >= slices
        got = await dump(scenario.steps_url, scenario.deep_url, companies)
        assert got == golden, first_difference(golden, got)
    finally:
        scenario.stop_all()
        if compactor is not None:
            compactor.kill()
        if api is not None:
            api.stop()
        await _drop(scenario.steps_url)


async def _serving(api: _Api) -> bool:
    try:
        await asyncio.to_thread(api.list_runs)
        return True
    except OSError:
        return False


async def test_two_workers_share_one_sqlite_file(kafka_bootstrap, tmp_path, corpus, golden):
    """Steps and deep rows of both workers in one SQLite file (WAL, one writer at a time
    across processes, each batch one transaction): converges, with a kill."""
    events, companies = corpus
    scenario = Scenario(kafka_bootstrap, tmp_path, PARTITIONS)
    scenario.steps_url = scenario.deep_url = f"sqlite:///{tmp_path / 'one.db'}"
    env = {"STEPSTREAM_SESSION_TIMEOUT_SECONDS": SESSION_TIMEOUT, "STEPSTREAM_BATCH_RECORDS": "400"}
    try:
        await scenario.create_topics()
        first, second = scenario.start_worker(name="a", **env), scenario.start_worker(name="b", **env)
        half = len(events) // 2
        await scenario.produce(events[:half])
        await asyncio.sleep(1.0)
        second.kill()
        second = scenario.start_worker(name="c", **env)
        await scenario.produce(events[half:])
        await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [first, second], timeout=180, stall=60)
        assert first.stop(timeout=30) == 0 and second.stop(timeout=30) == 0
        got = await dump(scenario.steps_url, scenario.deep_url, companies)
        assert got == golden, first_difference(golden, got)
    finally:
        scenario.stop_all()
