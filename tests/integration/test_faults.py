"""The worker under store faults, on the real broker (issue 8).

Stores are wrapped by the fault injector (``stepstream.sinks.faults``) through
``STEPSTREAM_FAULT_PLAN``; a test changes the faults of a running worker by replacing
the plan file, and reads ``<plan>.log`` to know that they really happened. Every test
ends with the sinks compared record for record with ``ingest-file`` of the same corpus.

* random retriable faults, writes that land but report failure and short hangs, with
  SIGKILLs and a second worker joining and leaving: converges, no partition stalls;
* a store away for ~5 s: ``/ready`` is 503 meanwhile, 200 afterwards, same process;
* a non-retriable store error: the worker exits non-zero by itself; a restart converges;
* a zombie: a worker paused (SIGSTOP) past its session timeout while its batch write is
  pending, resumed after another worker took over: no run state ever moves backwards;
* SIGTERM while a batch write is pending: exit 0, and the committed offset of every
  partition is exactly its durable watermark as read back from the sinks;
* SIGTERM while the group's rebalance waits for a paused member: exit 0 within the stop
  grace (not when the paused member's session expires), and the group converges;
* SIGTERM while a worker starts (its consumer still joins the group): exit 0 promptly,
  LeaveGroup sent (no ghost member holding up the group for a session);
* a poison message of ~1 MB (under ``max_event_bytes``, over faust's default producer
  limit) and an ``oversize`` one of 3 MB: dead-lettered (the second as a bounded copy),
  the same process goes on (issue 19 item 1);
* a dead-letter acknowledgement the broker refuses (a dead-letter topic too small even
  for the bounded copy): exit 70, or a SIGKILL if the worker still runs; once the topic
  takes copies, a restart converges with exactly one copy of the poison message (issue
  19 item 2).
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from harness import (
    Scenario,
    StateWatch,
    committed_offsets,
    dump,
    end_offsets,
    explain_lag,
    first_difference,
    golden_dump,
    read_topic,
    sink_watermarks,
    wait_caught_up,
    wait_for,
)
from stepstream.core.wire import encode_event, partition_key
from stepstream.emitter.corpus import generate_events
from stepstream.ingest.dead_letters import max_request_bytes
from stepstream.sinks.faults import read_log, write_plan

pytestmark = pytest.mark.integration

PARTITIONS = 4
RUNS = 100
COMPANIES = 4
# A short session timeout for every worker here: a worker that crashed (SIGKILL, exit 70)
# is only replaced once the group coordinator stops waiting for it, which with the 60 s
# default makes every restart cost a minute. The broker allows 1 s and up
# (deploy/kafka/server.properties.in).
SESSION_TIMEOUT = 4.0


@pytest.fixture(scope="module")
def corpus():
    events = generate_events(20261130, runs=RUNS, companies=COMPANIES)
    companies = sorted({e.company_id for e in events})
    return events, companies


@pytest.fixture(scope="module")
def golden(corpus, tmp_path_factory):
    events, companies = corpus
    data = asyncio.run(golden_dump(events, tmp_path_factory.mktemp("golden"), companies))
    assert len(data) == RUNS
    return data


class FaultScenario(Scenario):
    def start_worker(self, name: str = "w", **env: str):
        env.setdefault("STEPSTREAM_SESSION_TIMEOUT_SECONDS", str(SESSION_TIMEOUT))
        return super().start_worker(name, **env)


@pytest.fixture
def scenario(kafka_bootstrap, tmp_path):
    s = FaultScenario(kafka_bootstrap, tmp_path, PARTITIONS)
    yield s
    for w in s.workers:
        w.resume()  # a paused worker would ignore SIGTERM
    s.stop_all()


def runs_of(events) -> dict[str, list[str]]:
    runs: dict[str, dict[str, None]] = {}
    for e in events:
        runs.setdefault(e.company_id, {})[e.run_id] = None
    return {company: list(ids) for company, ids in runs.items()}


async def assert_golden(scenario: Scenario, companies: list[str], golden: dict) -> None:
    got = await dump(scenario.steps_url, scenario.deep_url, companies)
    assert got == golden, first_difference(golden, got)


# -- (a) random faults, kills, a second worker -------------------------------------------

RANDOM_FAULTS = [
    {"op": "write", "action": "fail", "probability": 0.25},
    {"op": "write", "action": "fail_after", "probability": 0.12},
    {"op": "load_states", "action": "fail", "probability": 0.1},
    {"action": "hang", "seconds": 0.4, "probability": 0.05},
]


async def _random_faults(scenario: Scenario, events, companies, golden, *, slices: int, seed: int) -> None:
    await scenario.create_topics()
    plan = scenario.tmp / "faults.json"
    write_plan(plan, {"seed": seed, "rules": RANDOM_FAULTS})
    # Small batches: many writes per worker process, so faults land in every one.
    env = {"STEPSTREAM_FAULT_PLAN": str(plan), "STEPSTREAM_BATCH_RECORDS": "500"}
    rng = random.Random(seed)
    chunk = len(events) // slices + 1
    kills = 0
    main = scenario.start_worker(name="m0", **env)
    second = None
    second_left = 0
    for i, start in enumerate(range(0, len(events), chunk)):
        await scenario.produce(events[start : start + chunk])
        await asyncio.sleep(rng.uniform(0.5, 2.0))
        if second is None and i % 4 == 1:
            second = scenario.start_worker(name=f"x{i}", **env)  # joins
        elif second is not None and i % 4 == 3:
            if second_left % 2 == 0:
                second.kill()  # leaves by crashing
            else:
                # Leaves cleanly, under faults (once it is up: a SIGTERM during its
                # imports, before faust handles signals, would just kill it).
                await asyncio.to_thread(second.wait_web)
                assert second.stop(timeout=30) == 0, second.tail()
            second_left += 1
            second = None
        if i % 3 == 2:
            # Killed only once a fault has hit it: under load a worker can still be
            # importing when its slice ends, and a kill then tests nothing of the faults.
            await wait_for(lambda pid=main.pid: any(e["pid"] == pid for e in read_log(plan)), 120,
                           f"a fault to hit worker {main.pid} before its kill")  # fmt: skip
            main.kill()
            kills += 1
            main = scenario.start_worker(name=f"m{kills}", **env)
    # Faults stay on to the end: a partition must not stall under them either.
    waited = time.monotonic()
    try:
        history = await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [main], timeout=900, stall=90)
    except AssertionError as exc:
        raise AssertionError(f"{await explain_lag(scenario)}\n{exc}") from None
    waited = time.monotonic() - waited
    assert main.stop(timeout=30) == 0, main.tail()
    if second is not None:
        second.stop()
    stops = sorted(round(w.stop_seconds, 1) for w in scenario.workers if w.stop_seconds is not None)
    print(f"caught up {waited:.0f}s after the last slice ({history[0].strip()}); SIGTERM to exit (s): {stops}")
    faults = read_log(plan)
    actions = {e["action"] for e in faults}
    assert {"fail", "fail_after"} <= actions and len(faults) >= 10, faults
    assert len({e["pid"] for e in faults}) >= 2, "faults hit only one worker process"
    assert kills >= 2 and second_left >= 1
    counts = {a: sum(e["action"] == a for e in faults) for a in sorted(actions)}
    print(f"random faults: {counts} over {len({e['pid'] for e in faults})} processes, {kills} kills of the main worker")
    await assert_golden(scenario, companies, golden)


async def test_random_store_faults_with_kills_and_a_second_worker_converge(scenario, corpus, golden):
    events, companies = corpus
    await _random_faults(scenario, events, companies, golden, slices=8, seed=7)


@pytest.mark.soak
async def test_random_store_faults_soak(kafka_bootstrap, tmp_path):
    events = generate_events(20261131, runs=600, companies=6, duplicates=0.02, redeliveries=3)
    companies = sorted({e.company_id for e in events})
    golden = await golden_dump(events, tmp_path / "golden", companies)
    scenario = FaultScenario(kafka_bootstrap, tmp_path, partitions=6)
    try:
        await _random_faults(scenario, events, companies, golden, slices=30, seed=11)
    finally:
        scenario.stop_all()


# -- (b) a store that is away, then back ----------------------------------------------------


async def test_store_away_then_back_ready_503_then_200_and_converges(scenario, corpus, golden):
    events, companies = corpus
    await scenario.create_topics()
    plan = scenario.tmp / "faults.json"
    write_plan(plan, {"rules": []})
    worker = scenario.start_worker(STEPSTREAM_FAULT_PLAN=str(plan))
    half = len(events) // 2
    await scenario.produce(events[:half])
    await asyncio.to_thread(worker.wait_web)
    await wait_for(lambda: worker.ready_status()[0] == 200, 60, "the worker to be ready")
    pid = worker.pid

    write_plan(plan, {"rules": [{"action": "fail"}]})  # both stores, every call: away
    away = time.monotonic()
    producing = asyncio.ensure_future(scenario.produce(events[half:]))
    during: list[tuple[int, dict]] = []
    while time.monotonic() - away < 5.0:
        during.append(await asyncio.to_thread(worker.ready_status))
        await asyncio.sleep(0.2)
    write_plan(plan, {"rules": []})  # back
    back = time.monotonic()
    await producing
    await wait_for(lambda: worker.ready_status()[0] == 200, 15, "/ready 200 after the store came back")
    back_in = time.monotonic() - back

    assert any(status == 503 and body.get("stores_writable") is False for status, body in during), during
    assert len(read_log(plan)) >= 2, "no fault was injected while the store was away"
    await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [worker], timeout=120)
    assert worker.alive() and worker.pid == pid, "the worker must ride out a 5 s outage in place"
    assert worker.ready_status()[0] == 200
    assert worker.stop(timeout=30) == 0, worker.tail()
    print(f"store away 5 s: /ready 503 in {sum(s == 503 for s, _ in during)}/{len(during)} polls; 200 again {back_in:.1f}s after")
    await assert_golden(scenario, companies, golden)


# -- (c) a non-retriable store error ----------------------------------------------------


async def test_fatal_store_error_exits_non_zero_and_a_restart_converges(scenario, corpus, golden):
    events, companies = corpus
    await scenario.create_topics()
    plan = scenario.tmp / "faults.json"
    write_plan(plan, {"rules": [{"store": "steps", "op": "write", "action": "fatal", "count": 1}]})
    worker = scenario.start_worker(name="fatal", STEPSTREAM_FAULT_PLAN=str(plan))
    await scenario.produce(events)
    faults = await wait_for(lambda: read_log(plan), 60, "the fatal fault to be injected")
    rc = await asyncio.to_thread(worker.wait_exit, 60)
    exited = time.time()
    assert rc is not None, f"the worker did not exit by itself after a fatal store error:\n{worker.tail()}"
    assert rc > 0, f"exit status {rc}: expected a non-zero exit of its own (negative: killed by a signal)"
    assert exited - faults[0]["time"] < 5.0, f"exit took {exited - faults[0]['time']:.1f}s after the fault"
    assert [e["action"] for e in faults] == ["fatal"]

    again = scenario.start_worker(name="after")  # no fault plan
    await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [again], timeout=120)
    assert again.stop(timeout=30) == 0, again.tail()
    print(f"fatal store error: exit status {rc}, {exited - faults[0]['time']:.2f}s after the fault")
    await assert_golden(scenario, companies, golden)


# -- (d) a zombie -------------------------------------------------------------------------


async def test_zombie_paused_past_session_timeout_never_moves_a_run_backwards(scenario, corpus, golden):
    events, companies = corpus
    await scenario.create_topics()
    plan = scenario.tmp / "faults-a.json"
    write_plan(plan, {"rules": []})
    a = scenario.start_worker(name="a", STEPSTREAM_FAULT_PLAN=str(plan))
    third = len(events) // 3
    await scenario.produce(events[:third])
    await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [a], timeout=120)
    await asyncio.sleep(1.5)  # idle tails (1 s in the harness) flushed: part one is durable
    watch = StateWatch(scenario.steps_url, runs_of(events)).start()
    try:
        # A's next step write hangs; A folds part two meanwhile and is paused with it pending.
        hang = 20.0
        write_plan(plan, {"rules": [{"store": "steps", "op": "write", "action": "hang", "seconds": hang, "count": 1}]})
        await scenario.produce(events[third : 2 * third])
        (began,) = await wait_for(lambda: read_log(plan), 30, "A's write to hang")
        await asyncio.sleep(0.3)
        a.pause()
        paused = time.monotonic()
        before = dict(watch.latest)

        b = scenario.start_worker(name="b")
        await scenario.produce(events[2 * third :])
        await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [b], timeout=120)
        took_over = time.monotonic() - paused
        moved = sum(1 for key, seq in watch.latest.items() if seq > before.get(key, -1))
        assert moved > 0, "B made no progress while A was paused"

        a.resume()
        # A's hang ends (now, or `hang` s after it began) and its stale batch is written;
        # then A finds it lost its partitions and rejoins.
        await asyncio.sleep(max(0.0, began["time"] + hang - time.time()) + 3 * SESSION_TIMEOUT)
        # A may go on (it rejoins) or stop non-zero; either way B must converge.
        await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [b], timeout=120)
        await asyncio.sleep(1.0)
    finally:
        await watch.stop()
    a_rc = a.stop(timeout=30)
    b_rc = b.stop(timeout=30)
    print(f"zombie: B caught up {took_over:.1f}s after A paused; {watch.polls} state polls; A exit {a_rc}, B exit {b_rc}")
    assert watch.polls > 20
    assert not watch.regressions, f"run states moved backwards (company, run, before, after): {watch.regressions[:10]}"
    assert b_rc == 0, b.tail()
    await assert_golden(scenario, companies, golden)


# -- (e) SIGTERM with a batch write pending --------------------------------------------


async def test_sigterm_mid_batch_exits_0_and_commits_exactly_the_durable_watermark(scenario, corpus, golden):
    events, companies = corpus
    await scenario.create_topics()
    plan = scenario.tmp / "faults.json"
    write_plan(plan, {"rules": []})
    # Batches of 500 (group commit grows one to at most 2,000 while a write is in flight):
    # while the write hangs, the fold fills its batch and stops, so records of the second
    # half are still undelivered at SIGTERM, whatever the machine's speed. With the default
    # 5,000 the whole second half fit in the open batch and the stop made all of it durable.
    worker = scenario.start_worker(STEPSTREAM_FAULT_PLAN=str(plan), STEPSTREAM_BATCH_RECORDS="500")
    half = len(events) // 2
    await scenario.produce(events[:half])
    await asyncio.to_thread(worker.wait_web)
    await wait_for(lambda: worker.metric_sum("stepstream_events_total") > 0, 60, "the worker to process")
    # Long enough that SIGTERM lands inside the hang even when a loaded machine is slow
    # to notice it began (3 s was not: the hang ended first and everything was durable).
    hang = 8.0
    write_plan(plan, {"rules": [{"store": "steps", "op": "write", "action": "hang", "seconds": hang, "count": 1}]})
    await scenario.produce(events[half:])
    await wait_for(lambda: read_log(plan), 30, "a step write to hang", interval=0.05)
    noticed = time.monotonic()
    await asyncio.sleep(0.5)
    worker.terminate()
    sent = time.monotonic()
    assert sent - noticed < hang - 2.0, f"SIGTERM {sent - noticed:.1f}s after the hang was seen: not mid-batch"
    rc = await asyncio.to_thread(worker.wait_exit, 60)
    took = time.monotonic() - sent
    assert rc == 0, f"exit status {rc} after SIGTERM:\n{worker.tail()}"
    assert took < hang + 15.0, f"SIGTERM took {took:.1f}s"

    committed = await committed_offsets(scenario.broker, scenario.group, scenario.topic, PARTITIONS)
    ends = await end_offsets(scenario.broker, scenario.topic)
    # The durable watermark, read back from the sinks: per partition, the offset of the
    # first event not reflected in its run's stored state (or the log end).
    watermark = await sink_watermarks(scenario.broker, scenario.topic, scenario.steps_url)
    print(f"SIGTERM mid-batch: exit 0 in {took:.1f}s; committed {committed}; watermark {watermark}; ends {ends}")
    assert committed == watermark, f"committed {committed} != durable watermark {watermark} (log ends {ends})"
    assert sum(ends.values()) - sum(committed.values()) > 0, "SIGTERM landed after everything was durable"

    again = scenario.start_worker(name="after")
    await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [again], timeout=120)
    assert again.stop(timeout=30) == 0, again.tail()
    await assert_golden(scenario, companies, golden)


# -- (f) SIGTERM while the group waits for a member that does not answer ----------------------


async def test_sigterm_while_a_rebalance_waits_for_a_paused_member_exits_within_the_grace(scenario, corpus, golden):
    """aiokafka's consumer stop first waits for a JoinGroup in flight, which the broker
    answers only once every member rejoined or its session expired. With a member
    paused (SIGSTOP, session 45 s), a worker caught in such a rebalance would take
    until then to stop; the stop grace ends it earlier, after its batch is committed."""
    events, companies = corpus
    await scenario.create_topics()
    half = len(events) // 2
    await scenario.produce(events[:half])
    grace = 3.0
    a = scenario.start_worker(
        name="a", STEPSTREAM_STOP_GRACE_SECONDS=str(grace), STEPSTREAM_SESSION_TIMEOUT_SECONDS="6"
    )
    await asyncio.to_thread(a.wait_web)
    await wait_for(lambda: a.metric_sum("stepstream_events_total") > 0, 60, "a to process")
    b = scenario.start_worker(name="b", STEPSTREAM_SESSION_TIMEOUT_SECONDS="45")
    await asyncio.to_thread(b.wait_web)
    await wait_for(lambda: a.ready_status()[0] == 200 and b.ready_status()[0] == 200, 60, "a and b to share the topic")
    b.pause()
    c = scenario.start_worker(name="c")  # its join opens a rebalance that waits for b
    await wait_for(lambda: a.ready_status()[1].get("rebalancing"), 30, "a to be in the rebalance")
    await asyncio.sleep(1.0)  # a's JoinGroup is in flight now
    a.terminate()
    sent = time.monotonic()
    rc = await asyncio.to_thread(a.wait_exit, 40)
    took = time.monotonic() - sent
    b.resume()
    assert rc == 0, f"exit status {rc} {took:.1f}s after SIGTERM:\n{a.tail()}"
    # Without the grace the stop lasts until b's session expires (~40 s more).
    assert took < grace + 10.0, f"SIGTERM took {took:.1f}s:\n{a.tail()}"
    assert "did not end within" in a.tail(), a.tail()
    print(f"SIGTERM during a stuck rebalance: exit 0 in {took:.1f}s (grace {grace:.0f}s)")

    await scenario.produce(events[half:])
    await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [b, c], timeout=180, stall=60)
    assert b.stop(timeout=30) == 0, b.tail()
    assert c.stop(timeout=30) == 0, c.tail()
    await assert_golden(scenario, companies, golden)


async def test_sigterm_during_startup_leaves_the_group_and_exits(scenario, corpus, golden):
    """A worker SIGTERMed while it starts still joins the group (faust's consumer thread
    subscribes anyway). faust answers a rebalance that reaches a stopping app by closing
    the aiokafka consumer from the wrong event loop: the consumer then never sent
    LeaveGroup, so the group waited a whole session for the ghost (any SIGTERM in that
    rebalance waited with it), or its stop hung for good. The worker leaves the close to
    the consumer thread's own stop: exit 0 promptly, LeaveGroup sent, and the other
    worker owns the topic again well within the stopped worker's session."""
    events, companies = corpus
    await scenario.create_topics()
    await scenario.produce(events)
    k = scenario.start_worker(name="k")
    await asyncio.to_thread(k.wait_web)
    await wait_for(lambda: k.ready_status()[0] == 200, 60, "k to own the topic")
    session = 30.0  # how long a ghost of a would hold up the group
    for attempt in range(3):
        a = scenario.start_worker(
            name=f"a{attempt}", STEPSTREAM_LOG_LEVEL="info", STEPSTREAM_SESSION_TIMEOUT_SECONDS=str(session),
            STEPSTREAM_STOP_GRACE_SECONDS=str(session),  # the stop deadline must not be what ends it
        )
        # Before the consumer subscribes: faust's app is up, its tables not yet.
        await wait_for(lambda: "Waiting for tables to be registered" in a.log_path.read_text(errors="replace"),
                       60, "a to start", 0.01)  # fmt: skip
        a.terminate()
        sent = time.monotonic()
        rc = await asyncio.to_thread(a.wait_exit, 60)
        took = time.monotonic() - sent
        log = a.log_path.read_text(errors="replace")
        assert rc == 0, f"exit status {rc} {took:.1f}s after SIGTERM:\n{a.tail()}"
        assert took < 10.0, f"SIGTERM took {took:.1f}s:\n{a.tail()}"
        joined = "(Re-)joining group" in log
        assert not joined or "LeaveGroup request succeeded" in log, f"a left a ghost in the group:\n{a.tail()}"
        print(f"SIGTERM during startup: exit 0 in {took:.1f}s; joined the group: {joined}")
        await asyncio.sleep(3.0)  # k's heartbeat has seen any rebalance a's join opened
        await wait_for(lambda: k.ready_status()[0] == 200, 10, "k to own the topic again")
    await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [k], timeout=180, stall=60)
    assert k.stop(timeout=30) == 0, k.tail()
    await assert_golden(scenario, companies, golden)


# -- (g) a dead letter of about a megabyte, and an oversize one --------------------------


async def produce_raw(broker: str, topic: str, messages: list[tuple[bytes, bytes, list]]) -> None:
    """Produce ``(key, value, headers)`` as they are, compressed (a 3 MB value of one
    repeated byte travels in a batch far below the broker's 1 MB limit)."""
    producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all", compression_type="gzip", max_request_size=8_000_000)
    await producer.start()
    try:
        for key, value, headers in messages:
            await (await producer.send(topic, value, key=key, headers=headers))
    finally:
        await producer.stop()


async def topic_config(broker: str, topic: str, name: str) -> str:
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs={name: None})])
        ((_, _, _, _, entries),) = response.resources
        ((_, value, *_),) = entries
        return value
    finally:
        await admin.close()


def _poison(event, padding: int) -> bytes:
    obj = json.loads(encode_event(event))
    obj.update(event_id="poison-mb", type="telepathy", padding="x" * padding)  # unknown_type, or oversize
    return json.dumps(obj).encode()


async def test_a_megabyte_poison_message_is_dead_lettered_and_the_worker_goes_on(scenario, corpus, golden):
    events, companies = corpus
    await scenario.create_topics()
    # Sized above the largest copy: faust's producer is too (worker side, tests/service).
    dlq_limit = await topic_config(scenario.broker, scenario.topic + ".dlq", "max.message.bytes")
    assert int(dlq_limit) == max_request_bytes(1_048_576) > 1_048_576 + 65_536
    worker = scenario.start_worker(name="mb")
    pid = worker.pid
    half = len(events) // 2
    await scenario.produce(events[:half])
    # Under the key of a good run: onto its partition, among its events.
    victim = events[half]
    key = partition_key(victim.company_id, victim.run_id)
    megabyte = _poison(victim, 1_040_000)  # under max_event_bytes (1,048,576), over 1,000,000
    oversize = _poison(victim, 3_000_000)
    await produce_raw(scenario.broker, scenario.topic, [(key, megabyte, [("poison-kind", b"megabyte")]),
                                                        (key, oversize, [("poison-kind", b"oversize")])])  # fmt: skip
    await scenario.produce(events[half:])
    await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [worker], timeout=180)
    assert worker.alive() and worker.pid == pid, "the worker must stay up through a dead letter of a megabyte"
    assert worker.metric_sum("stepstream_dead_letters_total") == 2
    assert worker.stop(timeout=30) == 0, worker.tail()

    letters = {dict(r.headers)["poison-kind"]: r for r in await read_topic(scenario.broker, scenario.topic + ".dlq")}
    assert sorted(letters) == [b"megabyte", b"oversize"]
    whole, bounded = letters[b"megabyte"], letters[b"oversize"]
    assert whole.value == megabyte and whole.key == key
    assert dict(whole.headers)["stepstream-reason"] == b"unknown_type"
    headers = dict(bounded.headers)
    assert bounded.key == key and 0 < len(bounded.value) < 100_000 and oversize.startswith(bounded.value)
    assert headers["stepstream-reason"] == b"oversize"
    assert headers["stepstream-size"] == str(len(oversize)).encode()
    assert headers["stepstream-source"].startswith(f"{scenario.topic}/{bounded.partition}/".encode())
    print(f"dead letters of {len(megabyte):,} bytes (whole) and {len(oversize):,} bytes "
          f"(bounded to {len(bounded.value):,}); one worker process throughout")  # fmt: skip
    await assert_golden(scenario, companies, golden)


# -- (h) a dead-letter topic that does not acknowledge ---------------------------------------


async def set_topic_config(broker: str, topic: str, configs: dict[str, str], partitions: int | None = None) -> None:
    """Create ``topic`` with ``configs`` (``partitions`` given) or set them on it."""
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        if partitions is not None:
            await admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1,
                                                topic_configs=configs)])  # fmt: skip
        else:
            (response,) = await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs=configs)])
            assert all(resource[0] == 0 for resource in response.resources), response
    finally:
        await admin.close()


async def test_a_refused_dead_letter_acknowledgement_exits_70_and_a_kill_after_it_converges(scenario, corpus, golden):
    """The broker refuses the dead-letter copy of a poison message (a dead-letter topic
    of 1 KB: the whole copy and the bounded one are both too large). The batch carrying
    it must not be dropped with the next batch written ahead of it: the worker exits 70
    by itself (were it still running, it is SIGKILLed); once the topic takes copies again,
    a restart converges, with exactly one copy of the poison message."""
    events, companies = corpus
    dlq = scenario.topic + ".dlq"
    await set_topic_config(scenario.broker, dlq, {"max.message.bytes": "1024"}, partitions=PARTITIONS)
    await scenario.create_topics()  # the raw topic; the dead-letter topic is left as it is
    a = scenario.start_worker(name="a")
    third = len(events) // 3
    await scenario.produce(events[:third])
    await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [a], timeout=120)

    victim = events[third]
    key = partition_key(victim.company_id, victim.run_id)
    poison = b'{"v": 1, "padding": "' + b"x" * 100_000  # not_json; its bounded copy is 64 KiB
    await produce_raw(scenario.broker, scenario.topic, [(key, poison, [("poison-kind", b"not_json")])])
    sent = time.monotonic()
    await scenario.produce(events[third : 2 * third])
    rc = await asyncio.to_thread(a.wait_exit, 30)
    took = time.monotonic() - sent
    killed = rc is None
    if killed:
        a.kill()  # still running after its dead letter was refused: the kill after it
    print(f"refused dead letter: worker {'SIGKILLed, still running' if killed else f'exit {rc}'} {took:.1f}s after it")

    await set_topic_config(scenario.broker, dlq, {"max.message.bytes": "1126400"})  # takes copies again
    b = scenario.start_worker(name="b")
    await scenario.produce(events[2 * third :])
    await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [b], timeout=180)
    assert b.stop(timeout=30) == 0, b.tail()
    await assert_golden(scenario, companies, golden)
    assert rc == 70, f"exit {rc} after a refused dead-letter acknowledgement (expected 70, by itself):\n{a.tail()}"
    assert "dead-letter copy" in a.tail(), a.tail()
    letters = await read_topic(scenario.broker, dlq)
    assert [(r.key, r.value, dict(r.headers)["stepstream-reason"]) for r in letters] == [(key, poison, b"not_json")]
