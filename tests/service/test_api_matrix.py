"""The read API's access matrix, over the real engine and the SQLite store: every
route x {no token, bad token, revoked token, other company's token, token without
the scope, right token}, two companies sharing run ids. Only the right token ever
sees data; another company's path or run answers exactly like a missing run."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import msgspec
import pytest

from stepstream.api.tokens import add_token, revoke_token
from stepstream.ingest.offline import ingest_file
from stepstream.sinks import open_deep_store, open_step_store
from api_support import (
    COMPANIES,
    SHARED_RUNS,
    Tokens,
    all_canaries,
    bearer,
    canaries,
    client,
    corpus,
    make_app,
    write_jsonl,
)

A, B = COMPANIES
RUN = SHARED_RUNS[0]

# route name -> (method, path, scope)
ROUTES = {
    "list_runs": ("GET", f"/v1/companies/{A}/runs", "steps:read"),
    "get_run": ("GET", f"/v1/companies/{A}/runs/{RUN}", "steps:read"),
    "get_deep": ("GET", f"/v1/companies/{A}/runs/{RUN}/deep", "deep:read"),
    "purge_run": ("DELETE", f"/v1/companies/{A}/runs/{RUN}/deep", "deep:purge"),
    "purge_company": ("DELETE", f"/v1/companies/{A}/deep", "deep:purge"),
    "get_bundle": ("GET", f"/v1/companies/{A}/runs/{RUN}/trace.sftrace", "deep:read"),
}
# A token of company A that lacks the route's scope.
NO_SCOPE = {"steps:read": "deep", "deep:read": "steps", "deep:purge": "steps"}
RIGHT = {"steps:read": "steps", "deep:read": "deep", "deep:purge": "purge"}
CASES = ("none", "bad", "revoked", "other_company", "no_scope", "right")


@pytest.fixture(scope="module")
def seeded_db(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("api-db")
    db = base / "seed.db"
    url = f"sqlite:///{db}?synchronous=normal"
    asyncio.run(ingest_file(write_jsonl(base / "events.jsonl", corpus()), url, url, progress=False))
    return db


@pytest.fixture
async def api(tmp_path, seeded_db):
    db = tmp_path / "api.db"
    shutil.copy(seeded_db, db)
    url = f"sqlite:///{db}?synchronous=normal"
    steps, deep = await open_step_store(url), await open_deep_store(url)
    tokens = Tokens(tmp_path / "tokens.json")
    async with client(make_app(steps, deep, tokens.path)) as http:
        yield http, tokens, steps, deep
    await steps.close()
    await deep.close()


def token_for(case: str, scope: str, tokens: Tokens) -> str | None:
    return {
        "none": None,
        "bad": tokens.bad,
        "revoked": tokens[(A, "revoked")],
        "other_company": tokens[(B, "all")],
        "no_scope": tokens[(A, NO_SCOPE[scope])],
        "right": tokens[(A, RIGHT[scope])],
    }[case]


def comparable(response) -> tuple[int, bytes, list[tuple[str, str]]]:
    return response.status_code, response.content, sorted((k, v) for k, v in response.headers.items() if k != "date")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("route", list(ROUTES))
async def test_matrix(api, route, case):
    http, tokens, steps, deep = api
    method, path, scope = ROUTES[route]
    bodies_before = len(await deep.get_deep(A, RUN)) + len(await deep.get_deep(B, RUN))
    response = await http.request(method, path, headers=bearer(token_for(case, scope, tokens)))
    problem_type = response.json().get("type") if response.status_code >= 400 else None

    if case in ("none", "bad", "revoked"):
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith('Bearer realm="stepstream"')
        assert ("error=" in response.headers["www-authenticate"]) is (case != "none")
        assert problem_type == "urn:stepstream:problem:unauthorized"
    elif case == "other_company":
        missing = await http.get(f"/v1/companies/{A}/runs/no-such-run", headers=bearer(tokens[(A, "all")]))
        assert missing.status_code == 404
        assert comparable(response) == comparable(missing)
    elif case == "no_scope":
        assert response.status_code == 403
        assert f'scope="{scope}"' in response.headers["www-authenticate"]
        assert problem_type == "urn:stepstream:problem:forbidden"
    else:
        assert response.status_code == 200, response.text
        media = "application/x-tar" if route == "get_bundle" else "application/json"
        assert response.headers["content-type"].startswith(media)
    if response.status_code >= 400:
        assert response.headers["content-type"] == "application/problem+json"
        assert set(response.json()) == {"type", "title", "status", "detail"}
        assert response.json()["status"] == response.status_code
        # No data of either company in a refusal, and nothing was purged.
        for text in (A + "-only", B + "-only", RUN, *all_canaries()):
            assert text not in response.text
        assert len(await deep.get_deep(A, RUN)) + len(await deep.get_deep(B, RUN)) == bodies_before
    else:
        assert B not in response.text  # the other company's rows never show, even for a shared run id


async def test_right_tokens_see_their_own_company(api):
    http, tokens, steps, deep = api
    for company, other in ((A, B), (B, A)):
        runs = (await http.get(f"/v1/companies/{company}/runs", headers=bearer(tokens[(company, "steps")]))).json()
        assert {r["company_id"] for r in runs["runs"]} == {company}
        assert {r["run_id"] for r in runs["runs"]} >= set(SHARED_RUNS)
        detail = (await http.get(f"/v1/companies/{company}/runs/{RUN}", headers=bearer(tokens[(company, "steps")]))).json()
        assert detail["run"]["agent_name"] == f"agent-{company}"
        assert [s["step_seq"] for s in detail["steps"]] == sorted(s["step_seq"] for s in detail["steps"])
        assert any(s["kind"] == "tool" and s["arguments"]["query"] == f"visible {company}" for s in detail["steps"])
        deep_body = (await http.get(f"/v1/companies/{company}/runs/{RUN}/deep", headers=bearer(tokens[(company, "deep")])))
        assert deep_body.status_code == 200
        assert all(canary in deep_body.text for canary, owner in all_canaries().items() if owner == company
                   and RUN.replace("-", "") in canary)  # fmt: skip
        assert other not in deep_body.text


async def test_purge_run_destroys_bodies_of_one_company_and_keeps_steps(api):
    http, tokens, steps, deep = api
    path = f"/v1/companies/{A}/runs/{RUN}/deep"
    before = len(await deep.get_deep(A, RUN))
    assert before > 0
    first = await http.delete(path, headers=bearer(tokens[(A, "purge")]))
    assert first.status_code == 200 and first.json() == {"purged": before}
    again = await http.delete(path, headers=bearer(tokens[(A, "purge")]))
    assert again.status_code == 200 and again.json() == {"purged": 0}
    assert (await http.get(path, headers=bearer(tokens[(A, "deep")]))).json()["bodies"] == []
    detail = await http.get(f"/v1/companies/{A}/runs/{RUN}", headers=bearer(tokens[(A, "steps")]))
    assert detail.status_code == 200 and detail.json()["steps"]
    assert len(await deep.get_deep(B, RUN)) > 0  # the other company's run of the same id keeps its bodies
    missing = await http.delete(f"/v1/companies/{A}/runs/no-such-run/deep", headers=bearer(tokens[(A, "purge")]))
    assert missing.status_code == 404


async def test_purge_company_destroys_every_body_of_that_company_only(api):
    http, tokens, steps, deep = api
    runs = (await http.get(f"/v1/companies/{A}/runs", headers=bearer(tokens[(A, "steps")]))).json()["runs"]
    expected = 0
    for run in runs:
        expected += len(await deep.get_deep(A, run["run_id"]))
    response = await http.delete(f"/v1/companies/{A}/deep", headers=bearer(tokens[(A, "purge")]))
    assert response.json() == {"purged": expected} and expected > 0
    assert await deep.list_deep_runs(A) == []
    assert len(await deep.list_deep_runs(B)) > 0
    assert len((await http.get(f"/v1/companies/{A}/runs", headers=bearer(tokens[(A, "steps")]))).json()["runs"]) == 4


async def test_revocation_applies_without_restart(api):
    http, tokens, steps, deep = api
    token, entry = add_token(tokens.path, A, ["steps:read"], created="2026-11-29T12:00:00Z")
    path = f"/v1/companies/{A}/runs"
    assert (await http.get(path, headers=bearer(token))).status_code == 200
    assert revoke_token(tokens.path, entry.id, revoked="2026-11-29T12:00:02Z")
    assert (await http.get(path, headers=bearer(token))).status_code == 401


async def test_runs_page_most_recent_first_with_cursor(api):
    http, tokens, steps, deep = api
    headers = bearer(tokens[(A, "steps")])
    seen, before = [], None
    while True:
        params = {"limit": 1} | ({"before": before} if before else {})
        page = (await http.get(f"/v1/companies/{A}/runs", params=params, headers=headers)).json()
        seen += [r["started_at"] for r in page["runs"]]
        before = page["next_cursor"]
        if before is None:
            break
    assert len(seen) == 4 and seen == sorted(seen, reverse=True)


@pytest.mark.parametrize(
    "query", [{"before": "not-a-cursor"}, {"before": "eyJ4IjoxfQ"}, {"limit": 0}, {"limit": 201}, {"limit": "x"}]
)
async def test_bad_paging_parameters_are_400_problems(api, query):
    http, tokens, steps, deep = api
    response = await http.get(f"/v1/companies/{A}/runs", params=query, headers=bearer(tokens[(A, "steps")]))
    assert response.status_code == 400
    body = msgspec.json.decode(response.content)
    assert body["type"] == "urn:stepstream:problem:bad-request"
    assert str(query.get("before", "\x00")) not in response.text  # never quotes the rejected value


async def test_an_id_with_a_trailing_newline_is_a_400(api):
    """Path ids are matched whole, like the wire's (``$`` alone matches before a final
    newline). A company with one is not the token's: the guard's 404, as for any other."""
    http, tokens, steps, deep = api
    headers = bearer(tokens[(A, "all")])
    response = await http.get(f"/v1/companies/{A}/runs/{RUN}%0A", headers=headers)
    assert response.status_code == 400
    assert response.json()["type"] == "urn:stepstream:problem:bad-request"
    other = await http.get(f"/v1/companies/{A}%0A/runs/{RUN}", headers=headers)
    assert other.status_code == 404


async def test_unknown_route_and_method_are_problems(api):
    http, tokens, steps, deep = api
    nowhere = await http.get("/v2/nothing")
    assert nowhere.status_code == 404 and nowhere.headers["content-type"] == "application/problem+json"
    wrong = await http.post(f"/v1/companies/{A}/runs", headers=bearer(tokens[(A, "all")]))
    assert wrong.status_code == 405 and "GET" in wrong.headers["allow"]
    assert wrong.json()["type"] == "urn:stepstream:problem:method-not-allowed"


async def test_bundle_route_streams_a_valid_tar_and_refuses_a_purged_run(api, tmp_path):
    import io
    import tarfile

    from stepfork.trace.validation import validate_bundle

    http, tokens, steps, deep = api
    path = f"/v1/companies/{A}/runs/{RUN}/trace.sftrace"
    response = await http.get(path, headers=bearer(tokens[(A, "deep")]))
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/x-tar")
    with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path, filter="data")
    assert f"{RUN}.sftrace/events.jsonl" in names and f"{RUN}.sftrace/integrity.json" in names
    result = validate_bundle(tmp_path / f"{RUN}.sftrace", strict=True, verify_integrity=True)
    assert result.valid, result.issues
    # Secrets under sensitive keys and credential-shaped ones never leave in a bundle
    # (plain-text canaries in outputs and thinking are bodies, exported as they are).
    text = response.content.decode("utf-8", "replace")
    for kind in ("argument", "argument_value", "state", "error"):
        assert canaries(A, RUN)[kind] not in text
    assert "/trace.sftrace" in (await http.get("/openapi.json")).text
    assert (await http.delete(f"/v1/companies/{A}/runs/{RUN}/deep", headers=bearer(tokens[(A, "purge")]))).status_code == 200
    gone = await http.get(path, headers=bearer(tokens[(A, "deep")]))
    assert gone.status_code == 410 and gone.json()["type"] == "urn:stepstream:problem:gone"
    assert RUN not in gone.text


async def test_access_log_names_the_token_id_never_the_token(api, caplog):
    http, tokens, steps, deep = api
    token = tokens[(A, "steps")]
    token_id = token.split("_")[1]
    with caplog.at_level("INFO", logger="stepstream.api.access"):
        assert (await http.get(f"/v1/companies/{A}/runs/{RUN}", headers=bearer(token))).status_code == 200
        assert (await http.get(f"/v1/companies/{A}/runs/{RUN}", headers=bearer(tokens.bad))).status_code == 401
    lines = [r.getMessage() for r in caplog.records if r.name == "stepstream.api.access"]
    assert len(lines) == 2
    assert f"caller={token_id}" in lines[0] and "/v1/companies/{company}/runs/{run_id} 200" in lines[0]
    assert "caller=-" in lines[1]
    secret = token.split("_", 2)[2]  # sst_<id>_<secret>; the secret is base64url, so it may hold "_" itself
    assert len(secret) == 43
    assert not any(secret in line or tokens.bad in line or RUN in line for line in lines)


async def test_no_response_may_be_cached(api):
    http, tokens, steps, deep = api
    for path in (f"/v1/companies/{A}/runs/{RUN}/deep", f"/v1/companies/{B}/runs", "/v1/companies/x%2Fy/runs", "/healthz"):
        response = await http.get(path, headers=bearer(tokens[(A, "all")]))
        assert response.headers["cache-control"] == "no-store", path
