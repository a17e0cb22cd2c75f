"""The run viewer in a real browser (issue 24): two companies that share run ids, signed
in through the form, every page checked for leaked canaries (HTML, storage, console),
axe-core (no serious or critical violation) and CSP violations (none in the console).
Screenshots of every page go to tests/browser/artifacts/. The first test checks the
browser itself: the system's Chromium, on a secure origin (127.0.0.1)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import expect

from api_support import COMPANIES, Tokens, all_canaries, corpus, load
from browser_support import CHROMIUM, ViewerServer, Watched
from stepstream.api.tokens import revoke_token
from stepstream.api.ui.live import LiveSettings
from stepstream.core.records import DeepRecord, RunRecord, StepRecord
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore

CANARIES = all_canaries()
AXE = Axe()


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ViewerServer]:
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    folder = tmp_path_factory.mktemp("viewer")
    tokens = Tokens(folder / "tokens.json")
    with ViewerServer((steps, deep), tokens.path, live=LiveSettings(tick_seconds=0.2, keepalive_seconds=1)) as running:
        running.tokens = tokens  # type: ignore[attr-defined]
        running.call(load(steps, deep, corpus()))  # on the server's loop (Playwright's runs in this thread)
        yield running


def test_the_system_chromium_starts_and_reaches_the_api(browser, watched, tmp_path):
    assert browser.version.split(".")[0].isdigit()
    with ViewerServer((MemoryStepStore(), MemoryDeepStore()), tmp_path / "tokens.json") as server:
        view = watched()
        answer = view.page.goto(f"{server.base_url}/healthz")
        assert answer is not None and answer.status == 200
        assert view.page.evaluate("window.isSecureContext") is True
    assert CHROMIUM.endswith("chromium")


def sign_in(view: Watched, server: ViewerServer, token: str) -> None:
    view.page.goto(f"{server.base_url}/ui/login")
    view.page.get_by_label("Token").fill(token)
    view.page.get_by_role("button", name="Sign in").click()
    view.page.wait_for_url(re.compile(r"/ui/companies/[a-z]+/runs$"))


def check_page(view: Watched, name: str, *, canaries: bool = True, status: int | None = None) -> None:
    """No canary in the HTML or the browser's storage, no serious/critical axe finding,
    no CSP violation or error in the console; a screenshot kept."""
    page = view.page
    html = page.content()
    storage = page.evaluate(
        "() => JSON.stringify([document.cookie, Object.entries(localStorage), Object.entries(sessionStorage)])"
    )
    cookies = str(view.context.cookies())
    if canaries:
        leaked = [c for c in CANARIES if c in html or c in storage]
        assert leaked == [], f"{name}: canaries in the page: {leaked[:3]}"
    assert "sst_" not in storage and "sst_" not in html  # the token never reaches a script or the page
    assert "httpOnly': True" in cookies or cookies == "[]"
    results = AXE.run(page)
    bad = [v for v in results.response["violations"] if v["impact"] in ("serious", "critical")]
    assert bad == [], f"{name}: axe: {[(v['id'], v['nodes'][0]['target']) for v in bad]}"
    expected = f"the server responded with a status of {status}" if status else None
    console = [
        m for m in view.console
        if ("Content Security Policy" in m or "Trusted Type" in m or m.startswith(("error", "pageerror")))
        and not (expected and expected in m)  # the page's own status, which the test asked for
    ]  # fmt: skip
    assert console == [], f"{name}: console: {console}"
    assert not any(c in m for m in view.console for c in CANARIES)
    view.screenshot(name)


def test_sign_in_list_filter_open_a_run_and_sign_out(server, watched):
    view = watched()
    sign_in(view, server, server.tokens["acme", "steps"])
    page = view.page
    cookie = next(c for c in view.context.cookies() if c["name"] == "__Host-stepstream")
    assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Lax" and cookie["path"] == "/"
    expect(page.get_by_role("heading", name="Runs of acme")).to_be_visible()
    rows = page.locator("table.runs tbody tr")
    expect(rows).to_have_count(4)
    assert "curl -H" in page.locator("pre.command").first.inner_text()
    check_page(view, "runs")

    page.get_by_label("Agent").fill("agent-globex")  # another company's agent: nothing of it here
    page.get_by_role("button", name="Filter").click()
    expect(page.get_by_text("No run matches.")).to_be_visible()
    page.get_by_label("Agent").fill("agent-acme")
    page.get_by_label("Status").select_option("completed")
    page.get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(4)
    assert "status=completed" in page.url and "agent=agent-acme" in page.url

    page.get_by_role("link", name="run-1", exact=True).click()
    expect(page.get_by_role("heading", name="Run run-1")).to_be_visible()
    expect(page.locator(".integrity")).to_contain_text("Complete")
    expect(page.locator("ol.steps > li")).to_have_count(5)  # thinking, tool, state, llm, error
    expect(page.locator("[data-show-raw]")).to_have_count(0)  # steps:read only: no raw
    assert "stepstream export --company acme --run run-1" in page.content()
    check_page(view, "run")

    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(re.compile(r"/ui/login$"))
    assert [c for c in view.context.cookies() if c["name"] == "__Host-stepstream"] == []
    page.goto(f"{server.base_url}/ui/companies/acme/runs")
    assert "/ui/login" in page.url
    check_page(view, "login")


def test_show_raw_needs_deep_read_and_renders_text(server, watched):
    view = watched()
    sign_in(view, server, server.tokens["acme", "all"])
    page = view.page
    page.goto(f"{server.base_url}/ui/companies/acme/runs/run-1")
    check_page(view, "run-deep-token")  # nothing raw on the page until asked
    page.set_viewport_size({"width": 960, "height": 600})
    page.screenshot(path=str(view.screenshot("run-deep-token").parent / "readme-run.png"))  # docs/img/viewer-run.png
    page.set_viewport_size({"width": 1280, "height": 900})
    step = page.locator("#step-1")  # the tool call: raw arguments hold the canary
    step.locator("summary").click()
    step.get_by_role("button", name="Show raw").click()
    raw = step.locator("[data-raw-out] pre").first
    expect(raw).to_contain_text("CANARYargacmerun1")
    assert step.locator("[data-raw-out] pre script, [data-raw-out] pre b").count() == 0
    assert not any("globex" in c for c in re.findall(r"CANARY\w+", step.inner_text()))

    # A body over the cap is shown clipped, and says so; a pruned run's raw says pruned.
    at = "2026-11-30T08:00:00.000000Z"
    server.call(server.steps.write(
        [StepRecord(company_id="acme", run_id="clip-run", step_seq=0, kind="tool", label="big", status="ok", started_at=at)],
        [RunRecord(company_id="acme", run_id="clip-run", status="completed", started_at=at, ended_at=at, step_count=1)],
    ))  # fmt: skip
    server.call(server.deep.write([DeepRecord(company_id="acme", run_id="clip-run", step_seq=0, kind="tool", ts=at,
                                              arguments="y" * 100_000)]))  # fmt: skip
    page.goto(f"{server.base_url}/ui/companies/acme/runs/clip-run#step-0")
    page.locator("#step-0").get_by_role("button", name="Show raw").click()
    expect(page.locator("#step-0 .raw .clip")).to_contain_text("Clipped at the body cap")
    server.call(server.steps.mark_deep_pruned("acme", ["clip-run"], at))
    server.call(server.deep.purge_run("acme", "clip-run"))
    page.reload()
    page.locator("#step-0").get_by_role("button", name="Show raw").click()
    expect(page.locator("#step-0 .raw")).to_contain_text("pruned by retention")
    check_page(view, "raw-pruned")

    steps_only = watched()
    sign_in(steps_only, server, server.tokens["acme", "steps"])
    answer = steps_only.page.goto(f"{server.base_url}/ui/companies/acme/runs/run-1/raw/1")
    assert answer is not None and answer.status == 403
    assert "CANARY" not in steps_only.page.content()


def test_another_companys_run_is_the_same_404_as_a_missing_one(server, watched):
    view = watched()
    sign_in(view, server, server.tokens["globex", "all"])
    page = view.page
    bodies = []
    for path in ("/ui/companies/acme/runs/globex-only-2", "/ui/companies/acme/runs/run-1",
                 "/ui/companies/globex/runs/acme-only-2", "/ui/companies/globex/runs/nope"):  # fmt: skip
        answer = page.goto(server.base_url + path)
        assert answer is not None and answer.status == 404, path
        bodies.append(answer.body())
    assert len(set(bodies)) == 1
    check_page(view, "not-found", status=404)
    page.goto(f"{server.base_url}/ui/companies/globex/runs/run-1")  # its own run-1: globex's data only
    assert "agent-globex" in page.content() and "agent-acme" not in page.content()


def test_keyboard_navigation_and_permalinks(server, watched):
    view = watched()
    sign_in(view, server, server.tokens["acme", "steps"])
    page = view.page
    page.keyboard.press("j")
    page.keyboard.press("j")
    expect(page.locator("table.runs tbody tr.current")).to_have_count(1)
    page.keyboard.press("o")
    page.wait_for_url(re.compile(r"/runs/[^/]+$"))
    run_url = page.url
    page.keyboard.press("]")  # the next error step
    assert page.evaluate("location.hash") == "#step-4"
    page.keyboard.press("e")
    expect(page.locator("#step-4 details")).to_have_attribute("open", "")
    page.keyboard.press("k")
    page.keyboard.press("k")
    assert page.evaluate("location.hash") == "#step-2"
    page.keyboard.press("]")
    assert page.evaluate("location.hash") == "#step-4"
    page.keyboard.press("[")  # no error before it: stays
    assert page.evaluate("location.hash") == "#step-4"
    page.keyboard.press("?")
    expect(page.get_by_role("dialog")).to_be_visible()
    check_page(view, "help")
    page.keyboard.press("Escape")

    page.goto(run_url.split("#")[0] + "#step-3")  # a permalink opens its step
    expect(page.locator("#step-3 details")).to_have_attribute("open", "")
    expect(page.locator("#step-3")).to_be_focused()
    page.goto(f"{server.base_url}/ui/companies/acme/runs")
    page.keyboard.press("/")
    expect(page.get_by_label("Agent")).to_be_focused()


def test_compare_two_runs(server, watched):
    view = watched()
    sign_in(view, server, server.tokens["acme", "steps"])
    page = view.page
    page.goto(f"{server.base_url}/ui/companies/acme/compare?a=run-1&b=run-2")
    # Same calls, but the redacted inputs name the run's company only: the same.
    expect(page.locator("[data-verdict]")).to_contain_text("same 2 calls")
    check_page(view, "compare")


def test_a_revoked_token_stops_at_the_next_request(server, watched, tmp_path):
    from stepstream.api.tokens import add_token

    token, entry = add_token(server.tokens.path, "acme", ["steps:read"], created="2026-11-29T12:00:00Z")
    view = watched()
    sign_in(view, server, token)
    revoke_token(server.tokens.path, entry.id, revoked="2026-11-29T12:00:05Z")
    view.page.goto(f"{server.base_url}/ui/companies/acme/runs")
    assert "/ui/login" in view.page.url


def test_live_tail_shows_new_steps_and_fills_a_late_one_in_place(server, watched):
    def at(second: int) -> str:
        return f"2026-11-30T09:00:{second:02d}.000000Z"

    run = RunRecord(company_id="acme", run_id="live-1", agent_name="agent-acme", status="running",
                    started_at=at(0), last_event_at=at(1), step_count=1)  # fmt: skip
    first = StepRecord(company_id="acme", run_id="live-1", step_seq=0, kind="tool", label="search",
                       status="running", call_id="c1", started_at=at(0))  # fmt: skip
    server.call(server.steps.write([first], [run]))
    view = watched()
    sign_in(view, server, server.tokens["acme", "steps"])
    page = view.page
    page.goto(f"{server.base_url}/ui/companies/acme/runs/live-1")
    expect(page.locator("[data-live-state]")).to_have_text("live")
    second = StepRecord(company_id="acme", run_id="live-1", step_seq=1, kind="llm", label="openai/gpt",
                        status="running", started_at=at(2))  # fmt: skip
    server.call(server.steps.write([second], [RunRecord(**{**_fields(run), "step_count": 2, "last_event_at": at(2)})]))
    expect(page.locator("#step-1")).to_contain_text("openai/gpt", timeout=2_000)
    # A result for step 0 arrives late: the step is filled in place, not appended.
    done = StepRecord(company_id="acme", run_id="live-1", step_seq=0, kind="tool", status="ok",
                      output_shape="object{hits}", ended_at=at(3))  # fmt: skip
    server.call(server.steps.write([done], [RunRecord(**{**_fields(run), "step_count": 2, "last_event_at": at(3), "late_events": 1})]))
    expect(page.locator("#step-0 .status")).to_contain_text("ok", timeout=2_000)
    expect(page.locator("ol.steps > li")).to_have_count(2)
    check_page(view, "live")
    # Hidden: the stream closes; visible again: a fresh snapshot.
    page.evaluate("Object.defineProperty(document, 'hidden', {value: true, configurable: true});"
                  "document.dispatchEvent(new Event('visibilitychange'))")  # fmt: skip
    expect(page.locator("[data-live-state]")).to_have_text("paused while hidden")
    page.evaluate("Object.defineProperty(document, 'hidden', {value: false, configurable: true});"
                  "document.dispatchEvent(new Event('visibilitychange'))")  # fmt: skip
    expect(page.locator("[data-live-state]")).to_have_text("live")
    server.call(server.steps.write([], [RunRecord(**{**_fields(run), "status": "completed", "ended_at": at(4), "step_count": 2})]))
    expect(page.locator("[data-live-state]")).to_have_text("ended", timeout=2_000)


def _fields(record: RunRecord) -> dict:
    import msgspec

    return msgspec.structs.asdict(record)


def test_every_company_sees_only_itself(server, watched):
    for company in COMPANIES:
        view = watched()
        sign_in(view, server, server.tokens[company, "steps"])
        other = next(c for c in COMPANIES if c != company)
        assert f"agent-{other}" not in view.page.content()
