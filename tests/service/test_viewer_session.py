"""The viewer's sign-in and guard over HTTP (issue 24): the ``__Host-`` cookie and its
attributes, cross-site posts refused (``Sec-Fetch-Site``, ``Origin``, ``Origin: null``),
the cookie counted on viewer GETs only (``/v1`` and purges stay bearer-only), one 404
page for another company's run and a missing one, the hardening headers."""

from __future__ import annotations

import pytest

from api_support import Tokens, client, corpus, load, make_app
from stepstream.api.app import CONTENT_SECURITY_POLICY
from stepstream.api.ui.session import COOKIE
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore


@pytest.fixture
async def served(tmp_path):
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    await load(steps, deep, corpus())
    tokens = Tokens(tmp_path / "tokens.json")
    async with client(make_app(steps, deep, tokens.path)) as http:
        http.stores = (steps, deep)  # type: ignore[attr-defined]
        yield http, tokens


def session(token: str) -> dict[str, str]:
    return {"cookie": f"{COOKIE}={token}"}


async def test_sign_in_sets_a_host_cookie_and_goes_to_the_runs(served):
    http, tokens = served
    answer = await http.post("/ui/login", data={"token": tokens["acme", "steps"]}, headers={"sec-fetch-site": "same-origin"})
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/companies/acme/runs"
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}={tokens['acme', 'steps']};")
    assert {"HttpOnly", "Secure", "Path=/", "SameSite=lax"} <= {part.strip() for part in cookie.split(";")}
    assert "domain" not in cookie.lower()  # a __Host- cookie has none
    bad = await http.post("/ui/login", data={"token": tokens.bad}, headers={"sec-fetch-site": "same-origin"})
    assert bad.status_code == 401 and "set-cookie" not in bad.headers and tokens.bad not in bad.text
    revoked = await http.post("/ui/login", data={"token": tokens["acme", "revoked"]})
    assert revoked.status_code == 401


@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ({"sec-fetch-site": "same-origin", "origin": "null"}, True),  # Chromium under no-referrer
        ({"sec-fetch-site": "none"}, True),  # typed into the address bar, a bookmark
        ({"sec-fetch-site": "cross-site", "origin": "http://api.test"}, False),
        ({"sec-fetch-site": "same-site"}, False),  # a sibling subdomain is another site's page
        ({"origin": "null"}, False),  # no Sec-Fetch-Site: nothing says where it came from
        ({"origin": "http://evil.test"}, False),
        ({"origin": "http://api.test"}, True),
        ({}, True),  # not a browser (curl): no cookie rides on it
    ],
)
async def test_login_and_logout_refuse_cross_site_posts(served, headers, allowed):
    http, tokens = served
    login = await http.post("/ui/login", data={"token": tokens["acme", "steps"]}, headers=headers)
    logout = await http.post("/ui/logout", headers={**headers, **session(tokens["acme", "steps"])})
    if allowed:
        assert login.status_code == 303 and logout.status_code == 303
        assert "Max-Age=0" in logout.headers["set-cookie"] and "Secure" in logout.headers["set-cookie"]
    else:
        assert login.status_code == 403 and "set-cookie" not in login.headers
        assert logout.status_code == 403 and "set-cookie" not in logout.headers


async def test_the_cookie_counts_on_viewer_pages_only(served):
    http, tokens = served
    cookie = session(tokens["acme", "all"])
    assert (await http.get("/ui/companies/acme/runs", headers=cookie)).status_code == 200
    assert (await http.get("/ui/companies/acme/runs/run-1/raw/1", headers=cookie)).status_code == 200
    # /v1 stays bearer-first and bearer-only: a cookie is no token there, purges included.
    assert (await http.get("/v1/companies/acme/runs", headers=cookie)).status_code == 401
    assert (await http.get("/v1/companies/acme/runs/run-1/deep/1", headers=cookie)).status_code == 401
    assert (await http.delete("/v1/companies/acme/runs/run-1/deep", headers=cookie)).status_code == 401
    assert (await http.delete("/v1/companies/acme/deep", headers=cookie)).status_code == 401
    # No token at all on a page: to the sign-in form, with the way back.
    anonymous = await http.get("/ui/companies/acme/runs/run-1")
    assert anonymous.status_code == 303
    assert anonymous.headers["location"] == "/ui/login?next=/ui/companies/acme/runs/run-1"
    # A bearer works on the pages too (curl), and a revoked cookie is cleared.
    assert (await http.get("/ui/companies/acme/runs", headers={"authorization": f"Bearer {tokens['acme', 'steps']}"})).status_code == 200
    stale = await http.get("/ui/companies/acme/runs", headers=session(tokens["acme", "revoked"]))
    assert stale.status_code == 303 and "Max-Age=0" in stale.headers["set-cookie"]


async def test_raw_needs_deep_read_and_another_companys_run_is_the_missing_page(served):
    http, tokens = served
    steps_only = session(tokens["acme", "steps"])
    assert (await http.get("/ui/companies/acme/runs/run-1/raw/1", headers=steps_only)).status_code == 403
    page = await http.get("/ui/companies/acme/runs/run-1", headers=steps_only)
    assert "data-show-raw" not in page.text and "CANARY" not in page.text
    deep = session(tokens["acme", "all"])
    raw = await http.get("/ui/companies/acme/runs/run-1/raw/1", headers=deep)
    assert raw.json()["state"] == "present" and "CANARYargacmerun1" in raw.text
    absent = await http.get("/ui/companies/acme/runs/run-1/raw/999", headers=deep)
    assert absent.json() == {"state": "absent", "body": None}
    missing = [
        await http.get(path, headers=deep)
        for path in (
            "/ui/companies/acme/runs/nope",
            "/ui/companies/globex/runs/run-1",  # exists, but globex's
            "/ui/companies/globex/runs/nope",
            "/ui/companies/acme/runs/bad%20id",
            "/ui/companies/acme/runs/nope/raw/1",
            "/ui/companies/globex/runs/run-1/raw/1",
            "/ui/companies/globex/runs/run-1/live",
        )
    ]
    assert {m.status_code for m in missing} == {404}
    assert len({m.content for m in missing}) == 1


async def test_every_viewer_response_carries_the_hardening_headers(served):
    http, tokens = served
    cookie = session(tokens["acme", "steps"])
    for path in ("/ui/login", "/ui/companies/acme/runs", "/ui/companies/acme/runs/run-1", "/ui/companies/acme/runs/nope",
                 "/ui/static/viewer.js", "/v1/companies/acme/runs"):  # fmt: skip
        answer = await http.get(path, headers=cookie)
        assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, path
        assert answer.headers["referrer-policy"] == "no-referrer"
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["cache-control"] == "no-store"
    for needed in ("frame-ancestors 'none'", "require-trusted-types-for 'script'", "script-src 'self'"):
        assert needed in CONTENT_SECURITY_POLICY
    assert "unsafe-inline" not in CONTENT_SECURITY_POLICY


async def test_a_bad_filter_on_the_runs_page_is_a_400_page(served):
    http, tokens = served
    cookie = session(tokens["acme", "steps"])
    answer = await http.get("/ui/companies/acme/runs?since=yesterday", headers=cookie)
    assert answer.status_code == 400 and "not an RFC 3339 time" in answer.text
    dated = await http.get("/ui/companies/acme/runs?since=2026-11-29&status=completed&problems=true", headers=cookie)
    assert dated.status_code == 200
    assert (await http.get("/ui/companies/acme/runs?nope=1", headers=cookie)).status_code == 400


async def test_the_run_page_names_the_events_that_never_arrived(tmp_path):
    from stepstream.core.records import RunRecord, RunState, StepRecord

    steps = MemoryStepStore()
    record = RunRecord(company_id="acme", run_id="gappy", status="running", seq_gaps=1, started_at="2026-11-29T12:00:00.000000Z")
    await steps.write(
        [StepRecord(company_id="acme", run_id="gappy", step_seq=0, kind="tool", label="search")],
        [record],
        [RunState(company_id="acme", run_id="gappy", last_seq=15, skipped_seqs=((12, 14),), run=record)],
    )
    tokens = Tokens(tmp_path / "tokens.json")
    async with client(make_app(steps, MemoryDeepStore(), tokens.path)) as http:
        page = await http.get("/ui/companies/acme/runs/gappy", headers=session(tokens["acme", "steps"]))
    assert page.status_code == 200
    assert "3 events never arrived (seq 12-14)" in page.text and "has-problems" in page.text
    assert 'data-live="/ui/companies/acme/runs/gappy/live"' in page.text  # running: the live tail


async def test_the_sftrace_download_takes_the_cookie_and_deep_read(served):
    http, tokens = served
    answer = await http.get("/ui/companies/acme/runs/run-1/trace.sftrace", headers=session(tokens["acme", "all"]))
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/x-tar"
    assert answer.headers["content-disposition"] == 'attachment; filename="run-1.sftrace.tar"'
    twin = await http.get("/v1/companies/acme/runs/run-1/trace.sftrace", headers={"authorization": f"Bearer {tokens['acme', 'all']}"})
    assert twin.content == answer.content
    assert (await http.get("/ui/companies/acme/runs/run-1/trace.sftrace", headers=session(tokens["acme", "steps"]))).status_code == 403
    assert (await http.get("/ui/companies/globex/runs/run-1/trace.sftrace", headers=session(tokens["acme", "all"]))).status_code == 404


async def test_show_raw_says_pruned_and_purged_as_such(served):
    http, tokens = served
    deep = session(tokens["acme", "all"])
    bearer = {"authorization": f"Bearer {tokens['acme', 'all']}"}
    assert (await http.delete("/v1/companies/acme/runs/run-2/deep", headers=bearer)).json()["purged"] > 0
    purged = await http.get("/ui/companies/acme/runs/run-2/raw/1", headers=deep)
    assert purged.json() == {"state": "absent", "body": None}
    assert (await http.get("/v1/companies/acme/runs/run-2/deep/1", headers=bearer)).json() == purged.json()
    steps, _ = http.stores
    await steps.mark_deep_pruned("acme", ["run-2"], "2026-11-30T00:00:00.000000Z")
    pruned = await http.get("/ui/companies/acme/runs/run-2/raw/1", headers=deep)
    assert pruned.json() == {"state": "pruned", "body": None}
    page = await http.get("/ui/companies/acme/runs/run-2", headers=deep)
    assert "pruned by retention at 2026-11-30T00:00:00.000000Z" in page.text
