"""The ingest route (``POST /v1/companies/{company}/events``) on the real broker: the
access matrix, decode errors per line, the body and rate bounds, and a hypothesis
property that no request makes an event of another company land. What landed is read
back from the topic each time: a test that only looked at the answers would not see a
request that was refused and produced anyway."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepstream.api.ingest import IngestLimits
from stepstream.api.tokens import add_token, revoke_token
from stepstream.core.wire import DECODE_REASONS
from ingest_support import NDJSON, HostLoop, IngestApp, TopicTail, create_topic, event, ndjson, run_events

pytestmark = pytest.mark.integration

A, B = "acme", "globex"


class Tokens:
    def __init__(self, path: Path) -> None:
        self.path = path

        def add(company: str, *scopes: str) -> str:
            return add_token(path, company, list(scopes), created="2026-12-01T12:00:00Z")[0]

        self.right = add(A, "ingest")
        self.right_b = add(B, "ingest")
        self.other_company = add(B, "ingest", "steps:read", "deep:read", "deep:purge")
        self.no_scope = add(A, "steps:read", "deep:read", "deep:purge")
        token, entry = add_token(path, A, ["ingest"], created="2026-12-01T12:00:00Z")
        revoke_token(path, entry.id, revoked="2026-12-01T12:00:01Z")
        self.revoked = token
        self.bad = "sst_0123456789ab_" + "A" * 43


@pytest.fixture(scope="module")
def env(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory):
    loop = HostLoop()
    topic = loop.run(create_topic(kafka_bootstrap))
    tokens = Tokens(tmp_path_factory.mktemp("ingest") / "tokens.json")
    app = IngestApp(loop, kafka_bootstrap, topic, tokens.path).start()
    tail = loop.run(TopicTail(kafka_bootstrap, topic).start())
    try:
        yield app, tokens, tail
    finally:
        loop.run(tail.stop())
        app.close()
        loop.close()


def landed(app: IngestApp, tail: TopicTail) -> list[tuple[bytes, dict[str, Any]]]:
    return [(key, msgspec.json.decode(value)) for _, key, value in app.loop.run(tail.read())]


CASES = {
    # case -> (token attribute, status with matching company_id, with a mismatching one)
    "none": (None, 401, 401),
    "bad": ("bad", 401, 401),
    "revoked": ("revoked", 401, 401),
    "other_company": ("other_company", 404, 404),
    "no_scope": ("no_scope", 403, 403),
    "right": ("right", 202, 403),
}


def test_access_matrix_only_the_right_token_with_its_own_company_lands(env) -> None:
    app, tokens, tail = env
    landed(app, tail)  # start from what earlier tests left
    sent_ok: set[str] = set()
    for case, (attribute, matching, mismatching) in CASES.items():
        token = None if attribute is None else getattr(tokens, attribute)
        for company_ids, expected in (((A, A, A), matching), ((A, B, A), mismatching)):
            events = [event(c, f"matrix-{case}", seq, tag=f"{case}{expected}-") for seq, c in enumerate(company_ids)]
            response = app.post(A, token, ndjson(events))
            assert response.status_code == expected, (case, company_ids, response.text)
            assert response.headers["content-type"].startswith("application/problem+json" if expected != 202 else "application/json")
            body = response.json()
            if expected == 202:
                assert body == {"accepted": 3}
                sent_ok |= {e["event_id"] for e in events}
            else:
                # never a company, a run id or a token in the answer
                assert B not in response.text and A not in body["detail"] and "matrix" not in response.text
                assert token is None or token not in response.text
            if case == "right" and expected == 403:
                assert body["detail"] == "line 2: company_id is not the company of the path"
            if expected == 401:
                assert response.headers["www-authenticate"].startswith('Bearer realm="stepstream"')
            if case == "no_scope":
                assert 'scope="ingest"' in response.headers["www-authenticate"]
    # The right token of B on B's path also works; A's token on B's path is 404.
    assert app.post(B, tokens.right_b, ndjson([event(B, "matrix-b", 0, tag="b-")])).status_code == 202
    assert app.post(B, tokens.right, ndjson([event(B, "matrix-b", 1, tag="b-")])).status_code == 404
    sent_ok.add(f"b-{B}/matrix-b/0")
    records = landed(app, tail)
    assert sorted(e["event_id"] for _, e in records) == sorted(sent_ok)
    for key, e in records:
        assert key == f"{e['company_id']}/{e['run_id']}".encode()
    assert app.metric("stepstream_ingest_requests_total", outcome="foreign_company") >= 1


def test_202_means_the_broker_holds_every_event_in_order(env) -> None:
    app, tokens, tail = env
    landed(app, tail)
    events = [e for r in range(5) for e in run_events(A, f"ordered-{r}", 40, tag="ord-")]
    response = app.post(A, tokens.right, msgspec.json.encode(events), media="application/json")
    assert response.status_code == 202 and response.json() == {"accepted": len(events)}
    records = landed(app, tail)  # read right after the answer: nothing is still on its way
    assert len(records) == len(events)
    per_run: dict[str, list[int]] = {}
    for key, e in records:
        per_run.setdefault(e["run_id"], []).append(e["seq"])
    assert per_run == {f"ordered-{r}": list(range(42)) for r in range(5)}
    # The value produced is the client's own bytes, item for item.
    assert {msgspec.json.encode(e) for e in events} == {msgspec.json.encode(e) for _, e in records}
    assert app.metric("stepstream_ingest_produce_seconds_count") >= 1


def test_decode_errors_are_answered_per_line_and_nothing_is_produced(env) -> None:
    app, tokens, tail = env
    landed(app, tail)
    good = ndjson([event(A, "lines", 0), event(A, "lines", 1)])
    missing = msgspec.json.encode({k: v for k, v in event(A, "lines", 2).items() if k != "seq"})
    secret_value = "sk-CANARYingest0123456789"
    wrong_type = msgspec.json.encode({**event(A, "lines", 3), "seq": secret_value})
    not_utf8 = msgspec.json.encode(event(A, "lines", 4)).replace(b"thought", b"\xff")
    body = good + b"\n" + b"{not json\n" + missing + b"\r\n" + wrong_type + b"\n" + b"[1, 2]\n" + not_utf8 + b"\n"
    response = app.post(A, tokens.right, body)
    assert response.status_code == 400, response.text
    problem = response.json()
    assert problem["type"] == "urn:stepstream:problem:bad-request" and problem["count"] == 5
    reasons = [(e["line"], e["reason"]) for e in problem["errors"]]
    assert reasons == [(4, "not_json"), (5, "missing_field"), (6, "wrong_type"), (7, "not_object"), (8, "not_utf8")]
    assert all(e["reason"] in DECODE_REASONS for e in problem["errors"])
    assert secret_value not in response.text
    array = app.post(A, tokens.right, b'{"v": 1}', media="application/json")
    assert array.status_code == 400 and "not a JSON array" in array.json()["detail"]
    unsupported = app.post(A, tokens.right, good, media="text/plain")
    assert unsupported.status_code == 415
    empty = app.post(A, tokens.right, b"\n\n")
    assert empty.status_code == 400
    assert landed(app, tail) == []
    assert app.metric("stepstream_ingest_rejected_lines_total", reason="not_json") >= 1


def test_a_body_over_the_limit_is_413_before_it_is_read_whole(env) -> None:
    """Straight at the ASGI app: the body comes in 1 MiB chunks, and the answer must
    start before the ninth is asked for; with a Content-Length over the limit, before any."""
    app, tokens, tail = env
    landed(app, tail)

    async def call(chunks: int, content_length: int | None) -> tuple[int, int]:
        asked = 0
        status = 0
        chunk = ndjson([event(A, "big", 0, pad=1000)]) * (1024 * 1024 // 1100)

        async def receive() -> dict[str, Any]:
            nonlocal asked
            asked += 1
            if status:
                return {"type": "http.disconnect"}
            return {"type": "http.request", "body": chunk, "more_body": asked < chunks}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]

        headers = [(b"authorization", f"Bearer {tokens.right}".encode()), (b"content-type", NDJSON.encode())]
        if content_length is not None:
            headers.append((b"content-length", str(content_length).encode()))
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": f"/v1/companies/{A}/events", "raw_path": f"/v1/companies/{A}/events".encode(), "query_string": b"",
            "root_path": "", "headers": headers, "client": ("127.0.0.1", 1), "server": ("api.test", 80),
        }  # fmt: skip
        await app.app(scope, receive, send)
        return status, asked

    status, asked = app.loop.run(call(chunks=64, content_length=None))
    assert status == 413 and asked <= 9, asked  # 8 MiB limit: the ninth chunk passes it
    status, asked = app.loop.run(call(chunks=64, content_length=64 * 1024 * 1024))
    assert status == 413 and asked == 0
    assert landed(app, tail) == []
    assert app.metric("stepstream_ingest_requests_total", outcome="body_too_large") == 2


def test_the_company_bucket_answers_429_with_retry_after(kafka_bootstrap: str, env) -> None:
    app, tokens, tail = env
    limited = IngestApp(app.loop, kafka_bootstrap, tail.topic, tokens.path, rate=10, burst=100,
                        limits=IngestLimits(max_events=100)).start()  # fmt: skip
    try:
        landed(app, tail)
        first = limited.post(A, tokens.right, ndjson([event(A, "rate", seq) for seq in range(80)]))
        assert first.status_code == 202
        second = limited.post(A, tokens.right, ndjson([event(A, "rate", seq) for seq in range(80, 160)]))
        assert second.status_code == 429
        assert int(second.headers["retry-after"]) == 6  # 60 events missing at 10/s
        # Another company has a bucket of its own.
        assert limited.post(B, tokens.right_b, ndjson([event(B, "rate", 0)])).status_code == 202
        assert limited.post(A, tokens.right, ndjson([event(A, "rate", 80)] * 101)).status_code == 413
        assert len(landed(app, tail)) == 81
        assert limited.metric("stepstream_ingest_requests_total", outcome="rate") == 1
    finally:
        limited.close()


# -- the property ----------------------------------------------------------------------

COMPANIES = (A, B, "initech")
_example_ids = itertools.count()  # unique event ids without randomness in the strategy
line_kinds = st.sampled_from(("own", "own", "own", "path", "other", "broken", "blank"))


@st.composite
def requests(draw: Any) -> tuple[str, str, list[tuple[str, bytes]]]:
    token_company = draw(st.sampled_from((A, B)))
    path_company = draw(st.sampled_from(COMPANIES))
    lines: list[tuple[str, bytes]] = []
    for n, kind in enumerate(draw(st.lists(line_kinds, min_size=1, max_size=12))):
        company = {"own": token_company, "path": path_company,
                   "other": draw(st.sampled_from(COMPANIES))}.get(kind, token_company)  # fmt: skip
        e = event(company, draw(st.sampled_from(("r1", "r2"))), n, tag=f"p{next(_example_ids)}-")
        if kind == "broken":
            raw = msgspec.json.encode({k: v for k, v in e.items() if k != draw(st.sampled_from(list(e)))})
        elif kind == "blank":
            raw = b"  "
        else:
            raw = msgspec.json.encode(e)
        lines.append((company, raw))
    return token_company, path_company, lines


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=requests(), as_array=st.booleans())
def test_no_request_makes_an_event_of_another_company_land(env, request, as_array) -> None:
    app, tokens, tail = env
    landed(app, tail)
    token_company, path_company, lines = request
    token = tokens.right if token_company == A else tokens.right_b
    if as_array:
        body = b"[" + b",".join(raw for _, raw in lines if raw.strip()) + b"]"
        media = "application/json"
    else:
        body = b"\n".join(raw for _, raw in lines)
        media = NDJSON
    response = app.post(path_company, token, body, media)
    records = landed(app, tail)
    for key, e in records:  # the property: whatever was asked, only the token's company lands
        assert e["company_id"] == token_company == path_company
        assert key == f"{token_company}/{e['run_id']}".encode()
    if response.status_code == 202:
        assert len(records) == response.json()["accepted"]
    else:
        assert records == [], response.status_code
    if path_company != token_company:
        assert response.status_code == 404
