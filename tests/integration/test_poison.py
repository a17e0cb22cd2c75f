"""A poison corpus on the real broker (issue 8): good runs mixed with more than ten
thousand messages in all, among them bad ones of every reason a client can cause,
including events that decode but could not be folded or stored (a time that
overflows when converted to UTC, a token count beyond 64 bits, a wild ``seq``) and
good events under a wrong or missing Kafka key.

The worker must stay up (one process throughout), dead-letter exactly the bad
messages, each with a ``stepstream-reason`` naming what was injected, commit past
them (lag 0), and leave the good runs equal to ``ingest-file`` of the good events.
Each bad message carries a ``poison-kind`` header; the dead-letter copy keeps the
original headers, which is how a copy is matched with what was injected.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter

import pytest
from aiokafka import AIOKafkaProducer

from harness import Scenario, dump, end_offsets, first_difference, golden_dump, read_topic, wait_caught_up
from stepstream.core.wire import DECODE_REASONS, encode_event, partition_key
from stepstream.emitter.corpus import generate_events

pytestmark = pytest.mark.integration

PARTITIONS = 4
MAX_EVENT_BYTES = 300_000
TOTAL_AT_LEAST = 10_000

# kind -> the reasons its dead letter may name. One reason each, except a seq of 10**20:
# above the wire bound (MAX_SEQ) it is `out_of_range` at decode; a worker without that
# bound would refuse it in the fold as `seq_jump`. Both name it; nothing else may.
EXPECTED: dict[str, set[str]] = {
    "not_utf8": {"not_utf8"},
    "not_json": {"not_json"},
    "not_object": {"not_object"},
    "wrong_type": {"wrong_type"},
    "missing_field": {"missing_field"},
    "bad_id": {"bad_id"},
    "oversize": {"oversize"},
    "unknown_type": {"unknown_type"},
    "bad_version": {"bad_version"},
    "too_deep": {"too_deep"},
    "key_wrong": {"bad_key"},
    "key_missing": {"bad_key"},
    "ts_out_of_range": {"out_of_range"},
    "tokens_2_63": {"out_of_range"},
    "seq_10_20": {"out_of_range", "seq_jump"},
    "seq_jump": {"seq_jump"},
}
PER_KIND = 190
OVERSIZE = 20  # 400 KB each


def _poison(kind: str, event, rng: random.Random) -> tuple[bytes | None, bytes]:
    """``(key, value)`` of one bad message of ``kind``, made from the good ``event``."""
    key = partition_key(event.company_id, event.run_id)
    obj = json.loads(encode_event(event))
    obj["event_id"] = f"poison-{rng.getrandbits(64):016x}"
    if kind == "not_utf8":
        obj["event_id"] = "NOT-UTF8-HERE"
        return key, json.dumps(obj).encode().replace(b"NOT-UTF8-HERE", b"bad-\xff\xfe")
    if kind == "not_json":
        data = json.dumps(obj).encode()
        return key, data[: rng.randint(1, len(data) - 2)]
    if kind == "not_object":
        return key, rng.choice([b"[1, 2, 3]", b'"run_start"', b"42", b"null", b"true"])
    if kind == "wrong_type":
        obj["seq"] = str(obj["seq"])
    elif kind == "missing_field":
        del obj[rng.choice(["event_id", "company_id", "run_id", "seq", "ts", "payload"])]
    elif kind == "bad_id":
        obj[rng.choice(["company_id", "run_id"])] = rng.choice(["", "has space", "slash/inside", "x" * 300])
    elif kind == "oversize":
        obj["padding"] = "x" * 400_000
    elif kind == "unknown_type":
        obj["type"] = "telepathy"
    elif kind == "bad_version":
        obj["v"] = rng.choice([0, 2, 99])
    elif kind == "too_deep":
        nested: object = "deep"
        for _ in range(150):
            nested = [nested]
        obj = {**obj, "type": "state_change", "payload": {"key": "k", "value": nested}}
    elif kind == "key_wrong":
        return rng.choice([b"junk/key", partition_key(event.company_id, "another-run"), b""]), encode_event(event)
    elif kind == "key_missing":
        return None, encode_event(event)
    elif kind == "ts_out_of_range":
        obj["ts"] = rng.choice(["0001-01-01T00:30:00+01:00", "9999-12-31T23:30:00-01:00", "1969-12-31T23:59:59Z"])
    elif kind == "tokens_2_63":
        obj.update(type="llm_response", payload={"call_id": "c-poison", "output": "x",
                                                 "usage": {"input_tokens": 2**63, "output_tokens": 1}})  # fmt: skip
    elif kind == "seq_10_20":
        obj["seq"] = 10**20
    elif kind == "seq_jump":
        obj["seq"] = 10**15  # inside the wire bound, far past any run's last seq
    else:  # pragma: no cover
        raise AssertionError(kind)
    return key, json.dumps(obj, ensure_ascii=False).encode()


def poison_corpus(seed: int):
    """Good events, and the mixed message list: every good event in its order, bad
    ones inserted at random places. Bad events of a good run go under its key (so
    onto its partition, among its events): accepting one would corrupt the run."""
    rng = random.Random(seed)
    good = generate_events(seed, runs=45, companies=3)
    mixed: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]] = [
        (partition_key(e.company_id, e.run_id), encode_event(e), []) for e in good
    ]
    kinds: list[str] = []
    for kind in EXPECTED:
        kinds += [kind] * (OVERSIZE if kind == "oversize" else PER_KIND)
    for kind in kinds:
        key, value = _poison(kind, rng.choice(good), rng)
        mixed.insert(rng.randint(0, len(mixed)), (key, value, [("poison-kind", kind.encode())]))
    return good, mixed, Counter(kinds)


async def test_poison_corpus_is_dead_lettered_by_reason_and_good_runs_complete(kafka_bootstrap, tmp_path):
    good, mixed, bad = poison_corpus(20261201)
    total_bad = sum(bad.values())
    assert len(mixed) >= TOTAL_AT_LEAST and len(mixed) == len(good) + total_bad
    companies = sorted({e.company_id for e in good})
    golden = await golden_dump(good, tmp_path / "golden", companies)

    scenario = Scenario(kafka_bootstrap, tmp_path, PARTITIONS)
    try:
        await scenario.create_topics()
        worker = scenario.start_worker(STEPSTREAM_MAX_EVENT_BYTES=str(MAX_EVENT_BYTES))
        pid = worker.pid
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=True, max_request_size=1_048_576
        )
        await producer.start()
        try:
            futures = [
                await producer.send(scenario.topic, value, key=key, headers=headers) for key, value, headers in mixed
            ]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()
        await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [worker], timeout=180)
        assert worker.alive() and worker.pid == pid, "the worker must stay up through poison"
        dead_metric = worker.metric_sum("stepstream_dead_letters_total")
        assert worker.stop(timeout=30) == 0, worker.tail()
    finally:
        scenario.stop_all()

    dlq = scenario.topic + ".dlq"
    assert sum((await end_offsets(scenario.broker, dlq)).values()) == total_bad
    assert dead_metric == total_bad
    letters = await read_topic(scenario.broker, dlq)
    assert len(letters) == total_bad
    got: Counter = Counter()
    wrong: list[tuple[str, str, str]] = []
    for record in letters:
        headers = dict(record.headers)
        kind = headers.get("poison-kind", b"(a good message)").decode()
        reason = headers.get("stepstream-reason", b"").decode()
        assert headers["stepstream-source"].startswith(scenario.topic.encode() + b"/")
        assert reason in DECODE_REASONS, f"unnamed reason {reason!r} for {kind}"
        if reason not in EXPECTED.get(kind, ()):
            wrong.append((kind, reason, headers.get("stepstream-detail", b"").decode()[:120]))
        got[kind] += 1
    assert not wrong, f"{len(wrong)} dead letters with an unexpected reason, e.g. {wrong[:8]}"
    assert got == bad, f"dead letters per kind {dict(got)} != injected {dict(bad)}"
    reasons = Counter(dict(r.headers)["stepstream-reason"].decode() for r in letters)
    print(f"poison: {len(mixed)} messages, {total_bad} dead letters by reason {dict(sorted(reasons.items()))}")

    after = await dump(scenario.steps_url, scenario.deep_url, companies)
    assert after == golden, first_difference(golden, after)
