"""The run viewer's pages: server time, and the 500-step page in a real browser.

    PYTHONPATH=services python -m benchmarks.bench_viewer [--requests 60] [--no-browser]

A SQLite store (durable defaults, as ``make run``) holding 200 runs of one company and
one run of 500 steps (the per-run step ceiling) whose redacted arguments are at the
argument cap (32,768 characters each). Server time is measured in process (the ASGI
app called through httpx's transport, no socket): the request to the last byte of
the answer, p50 and p99 over ``--requests`` requests each, for

* the runs page (``/ui/.../runs``, 200 runs) beside its JSON twin (``/v1/.../runs?limit=200``);
* the 500-step run page beside its JSON twin (``/v1/.../runs/{run_id}``, pages of 200 steps
  read to the end, as a client would);

printed with their ratio (page / JSON). Then, unless ``--no-browser``, Debian's
Chromium (tests/browser's setup) opens the 500-step page over uvicorn on 127.0.0.1
and reports the navigation's ``domInteractive`` and ``domContentLoadedEventEnd``
(the ES module has run by then: the page answers keys), p50 over 5 loads.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from stepstream.api.app import create_app
from stepstream.api.tokens import TokenRegistry, add_token
from stepstream.api.ui.present import PREVIEW_CHARS
from stepstream.api.ui.session import COOKIE
from stepstream.core.limits import Limits
from stepstream.core.records import RunRecord, StepRecord
from stepstream.metrics import ApiMetrics
from stepstream.sinks import open_deep_store, open_step_store

COMPANY = "bench"
BIG = "big-run"


def at(second: int) -> str:
    return f"2026-11-29T{12 + second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}.000000Z"


async def seed(steps) -> None:
    runs = [
        RunRecord(company_id=COMPANY, run_id=f"run-{i:03d}", agent_name=f"agent-{i % 5}",
                  status=("completed", "failed", "running", "abandoned")[i % 4], started_at=at(i * 10),
                  ended_at=at(i * 10 + 7), step_count=12, input_tokens=100 * i, output_tokens=50 * i,
                  seq_gaps=1 if i % 17 == 0 else 0)
        for i in range(200)
    ]  # fmt: skip
    await steps.write([], runs)
    cap = Limits().arguments_chars
    big_steps = [
        StepRecord(company_id=COMPANY, run_id=BIG, step_seq=n, kind=("tool", "llm", "state")[n % 3],
                   label=f"step-{n}", status="error" if n % 50 == 7 else "ok", call_id=f"c{n}",
                   arguments={"query": "x" * (cap - 40)}, input_shape="object{query}", output_shape="12 items",
                   started_at=at(3000 + n * 2), ended_at=at(3001 + n * 2))
        for n in range(Limits().max_steps)
    ]  # fmt: skip
    big = RunRecord(company_id=COMPANY, run_id=BIG, agent_name="agent-big", status="completed",
                    started_at=at(3000), ended_at=at(3000 + 2 * len(big_steps)), step_count=len(big_steps))  # fmt: skip
    for start in range(0, len(big_steps), 100):
        await steps.write(big_steps[start : start + 100], [big])


def quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def timed(http: httpx.AsyncClient, paths: list[str], headers: dict[str, str], requests: int) -> list[float]:
    samples = []
    for _ in range(requests):
        started = time.perf_counter()
        for path in paths:
            answer = await http.get(path, headers=headers)
            assert answer.status_code == 200, (path, answer.status_code)
        samples.append(time.perf_counter() - started)
    return samples


async def server_times(folder: Path, requests: int) -> str:
    steps = await open_step_store(f"sqlite:///{folder}/bench.db")
    deep = await open_deep_store(f"sqlite:///{folder}/bench.db")
    try:
        await seed(steps)
        token, _ = add_token(folder / "tokens.json", COMPANY, ["steps:read", "deep:read"], created="2026-11-29T12:00:00Z")
        app = create_app(steps, deep, TokenRegistry(folder / "tokens.json"), ApiMetrics())
        cookie = {"cookie": f"{COOKIE}={token}"}
        bearer = {"authorization": f"Bearer {token}"}
        json_pages = [f"/v1/companies/{COMPANY}/runs/{BIG}?limit=200"] + [
            f"/v1/companies/{COMPANY}/runs/{BIG}?limit=200&after={after}" for after in (199, 399)
        ]
        lines = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
            size = len((await http.get(f"/ui/companies/{COMPANY}/runs/{BIG}", headers=cookie)).content)
            for name, page, twin in (
                ("runs page (200 runs)", [f"/ui/companies/{COMPANY}/runs"], [f"/v1/companies/{COMPANY}/runs?limit=200"]),
                ("run page (500 steps at the cap)", [f"/ui/companies/{COMPANY}/runs/{BIG}"], json_pages),
            ):
                await timed(http, page, cookie, 3)  # warm
                page_p50, page_p99 = quantiles(await timed(http, page, cookie, requests))
                json_p50, json_p99 = quantiles(await timed(http, twin, bearer, requests))
                lines.append(
                    f"  {name:32s} page p50 {page_p50 * 1e3:7.1f} ms  p99 {page_p99 * 1e3:7.1f} ms | "
                    f"JSON twin p50 {json_p50 * 1e3:7.1f} ms  p99 {json_p99 * 1e3:7.1f} ms | page/JSON p50 {page_p50 / json_p50:4.2f}x"
                )
        lines.append(f"  the 500-step page is {size / 1e6:.2f} MB of HTML (arguments previewed at {PREVIEW_CHARS:,} characters)")
        return "\n".join(lines)
    finally:
        await deep.close()
        await steps.close()


def browser_times(folder: Path) -> str:
    import uvicorn
    from playwright.sync_api import sync_playwright

    loop = asyncio.new_event_loop()
    state: dict[str, object] = {}

    async def open_stores():
        state["steps"] = await open_step_store(f"sqlite:///{folder}/bench.db")
        state["deep"] = await open_deep_store(f"sqlite:///{folder}/bench.db")

    loop.run_until_complete(open_stores())
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token, _ = add_token(folder / "tokens.json", COMPANY, ["steps:read"], created="2026-11-29T12:00:00Z")
    app = create_app(state["steps"], state["deep"], TokenRegistry(folder / "tokens.json"), ApiMetrics())  # type: ignore[arg-type]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False, lifespan="off"))
    thread = threading.Thread(target=lambda: loop.run_until_complete(server.serve()), daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            context = browser.new_context()
            page = context.new_page()
            page.goto(f"http://127.0.0.1:{port}/ui/login")  # signed in through the form, as a person would
            page.get_by_label("Token").fill(token)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(f"**/ui/companies/{COMPANY}/runs")
            interactive, loaded = [], []
            for _ in range(5):
                page.goto(f"http://127.0.0.1:{port}/ui/companies/{COMPANY}/runs/{BIG}")
                timing = page.evaluate("(() => { const n = performance.getEntriesByType('navigation')[0]; return [n.domInteractive, n.domContentLoadedEventEnd]; })()")
                interactive.append(timing[0])
                loaded.append(timing[1])
            browser.close()
        return (
            f"  browser, 500-step page: domInteractive p50 {statistics.median(interactive):6.0f} ms, "
            f"DOMContentLoaded (module run, keys work) p50 {statistics.median(loaded):6.0f} ms (budget 1000 ms)"
        )
    finally:
        server.should_exit = True
        thread.join(timeout=10)

        async def close():
            await state["deep"].close()  # type: ignore[attr-defined]
            await state["steps"].close()  # type: ignore[attr-defined]

        loop.run_until_complete(close())
        loop.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_viewer")
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="stepstream-bench-viewer-") as tmp:
        folder = Path(tmp)
        print(asyncio.run(server_times(folder, args.requests)), flush=True)
        if not args.no_browser:
            print(browser_times(folder), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
