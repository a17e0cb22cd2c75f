"""The ingest route's pure parts: reading a body into records (``api/ingest_body.py``),
the per-company buckets (``api/ratelimit.py``) and the SDK's request cut
(``emitter/http_sender.py``). The producer's partitioner is proven on the broker
(tests/integration/test_ingest_partitions.py)."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepstream.api.ingest_body import (
    JSON,
    MAX_LISTED_ERRORS,
    NDJSON,
    ForeignCompany,
    LinesRefused,
    NotABatch,
    TooManyEvents,
    read_events,
)
from stepstream.api.ratelimit import CompanyBuckets, retry_after
from stepstream.emitter.http_sender import _cut, _retry_after


def event(company: str = "acme", run: str = "r1", seq: int = 0) -> dict:
    return {"v": 1, "event_id": f"e{seq}", "company_id": company, "run_id": run, "seq": seq,
            "ts": "2026-12-01T12:00:00Z", "type": "thinking_delta", "payload": {"text": "x"}}  # fmt: skip


def line(**kw) -> bytes:
    return msgspec.json.encode(event(**kw))


def read(body: bytes, media: str = NDJSON, **kw):
    return read_events(body, media, "acme", max_event_bytes=kw.get("max_event_bytes", 10_000),
                       max_events=kw.get("max_events", 100))  # fmt: skip


def test_ndjson_and_array_give_the_lines_own_bytes_keyed_by_run() -> None:
    lines = [line(seq=0), line(run="r2", seq=0), line(seq=1)]
    records = read(b"\n".join(lines) + b"\r\n\n")
    assert records == [(b"acme/r1", lines[0]), (b"acme/r2", lines[1]), (b"acme/r1", lines[2])]
    spaced = b"[ " + b" ,\n".join(lines) + b" ]"
    assert read(spaced, JSON) == records


def test_a_foreign_company_names_the_first_line_and_wins_over_bad_lines() -> None:
    body = b"\n".join([line(), b"{bad", b"", line(company="globex"), line(company="initech")])
    with pytest.raises(ForeignCompany) as refused:
        read(body)
    assert refused.value.line == 4 and "globex" not in str(refused.value)


def test_bad_lines_carry_the_wire_reasons_and_are_bounded() -> None:
    body = b"\n".join([line(), line(seq=-1), b"[]", line(seq=2, run="bad run id")])
    with pytest.raises(LinesRefused) as refused:
        read(body)
    assert [(e.line, e.reason) for e in refused.value.errors] == [(2, "out_of_range"), (3, "not_object"), (4, "bad_id")]
    many = b"\n".join([b"{"] * (MAX_LISTED_ERRORS + 5))
    with pytest.raises(LinesRefused) as refused:
        read(many, max_events=1000)
    assert len(refused.value.errors) == MAX_LISTED_ERRORS and refused.value.count == MAX_LISTED_ERRORS + 5
    with pytest.raises(LinesRefused) as refused:
        read(line() + b" " * 20_000)
    assert refused.value.errors[0].reason == "oversize"


def test_bounds_and_non_arrays() -> None:
    with pytest.raises(TooManyEvents):
        read(b"\n".join([line(seq=i) for i in range(101)]))
    assert len(read(b"\n".join([line(seq=i) for i in range(100)]))) == 100
    for body, reason in ((b'{"v": 1}', "not_object"), (b"[1,", "not_json"), (b"\xff[]", "not_json")):
        with pytest.raises(NotABatch) as refused:
            read(body, JSON)
        assert refused.value.reason == reason, body
    assert read(b"", NDJSON) == [] and read(b"[]", JSON) == []


@given(st.lists(st.tuples(st.sampled_from(["acme", "globex"]), st.booleans()), max_size=20), st.booleans())
def test_every_record_is_of_the_path_company_or_the_request_is_refused(lines, as_array) -> None:
    raws = [line(company=c, seq=i) if ok else b'{"v": 1, "company_id": "%s"}' % c.encode() for i, (c, ok) in enumerate(lines)]
    body = (b"[" + b",".join(raws) + b"]") if as_array else b"\n".join(raws)
    try:
        records = read(body, JSON if as_array else NDJSON)
    except (ForeignCompany, LinesRefused):
        assert any(c != "acme" or not ok for c, ok in lines)
        return
    assert len(records) == len(lines)
    assert all(key.startswith(b"acme/") and msgspec.json.decode(value)["company_id"] == "acme" for key, value in records)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_buckets_take_all_or_nothing_refill_and_give_back() -> None:
    clock = Clock()
    buckets = CompanyBuckets(10, 100, clock=clock)
    assert buckets.take("acme", 80) == 0
    assert buckets.take("acme", 30) == pytest.approx(1.0)  # 10 missing at 10/s; nothing taken
    assert buckets.wait_for("acme", 20) == 0
    assert buckets.take("globex", 100) == 0  # a bucket per company
    clock.now += 1.0
    assert buckets.take("acme", 30) == 0
    assert buckets.wait_for("acme", 1) == pytest.approx(0.1)  # empty: 1 event in 0.1 s
    buckets.give_back("acme", 1000)  # never past the burst
    assert buckets.take("acme", 100) == 0 and buckets.take("acme", 1) > 0
    assert buckets.take("acme", 101) == math.inf
    assert CompanyBuckets(0, 0).take("acme", 10**9) == 0  # off
    assert retry_after(0.01) == "1" and retry_after(5.2) == "6"


def test_buckets_forget_the_oldest_companies_past_the_bound() -> None:
    buckets = CompanyBuckets(1, 10, clock=Clock(), max_companies=3)
    for company in "abcd":
        assert buckets.take(company, 10) == 0
    assert buckets.take("a", 10) == 0  # forgotten: full again
    assert buckets.take("d", 1) > 0


def test_the_sdk_cuts_a_request_at_a_company_change_or_the_byte_bound() -> None:
    batch = [(b"acme/r1", b"x" * 10), (b"acme/r2", b"y" * 10), (b"globex/r1", b"z"), (b"acme/r1", b"w")]
    assert _cut(batch, 1000) == 2
    assert _cut(batch, 15) == 1
    assert _cut([(b"acme/r1", b"x" * 100)], 10) == 1  # one event always goes
    assert _cut(batch[2:], 1000) == 1
    assert _retry_after("3", 0.1) == 3.0 and _retry_after(None, 0.4) == 0.4
    assert _retry_after("soon", 0.2) == 0.2 and _retry_after("99999", 0.1) == 30.0
