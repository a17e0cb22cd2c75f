"""The deep route and the bundle stream, and a process runs a bounded number of them
(issue 19, item 9).

* The deep route reads its bodies a page at a time (``get_deep`` ranges) and sends
  them as they come; the bundle is built a page at a time into spooled files and
  streamed as a tar. A 200-step run at its caps is built within a small, fixed
  memory budget (``tracemalloc``, server side only: the body goes to a file), and
  the streamed bundle passes the reference validator and equals the in-memory build.
* At most ``max_exports`` of them run at once: the next waits up to
  ``export_wait_seconds`` and then gets 503 with ``Retry-After`` (an RFC 9457
  problem); a slot is given back when a body ends or its client goes away.
"""

from __future__ import annotations

import asyncio
import io
import tarfile
import tracemalloc
from pathlib import Path
from typing import Any

import msgspec
import pytest
from stepfork.trace.validation import validate_bundle

from stepstream.api.app import create_app
from stepstream.api.deep import PAGE_ROWS
from stepstream.api.tokens import TokenRegistry, add_token
from stepstream.bundle.build import build_bundle
from stepstream.core.caps import CLIP_MARKER
from stepstream.core.limits import Limits
from stepstream.core.records import DeepRecord, RunRecord, StepRecord
from stepstream.metrics import ApiMetrics
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore
from api_support import bearer, client, corpus, load

LIMITS = Limits()
COMPANY, RUN = "acme", "big"


def ts(i: int) -> str:
    return f"2026-11-29T12:{i // 60 % 60:02d}:{i % 60:02d}.000000Z"


async def seed_big_run(steps: MemoryStepStore, deep: MemoryDeepStore, n: int) -> None:
    """A run of ``n`` tool steps whose bodies are at their caps (distinct text per step)."""
    await steps.write(
        [StepRecord(company_id=COMPANY, run_id=RUN, step_seq=i, kind="tool", label="write", status="ok",
                    started_at=ts(i), ended_at=ts(i)) for i in range(n)],
        [RunRecord(company_id=COMPANY, run_id=RUN, agent_name="bot", status="completed", started_at=ts(0),
                   ended_at=ts(n), last_event_at=ts(n), step_count=n)],
    )  # fmt: skip
    for start in range(0, n, 50):
        await deep.write(
            [DeepRecord(company_id=COMPANY, run_id=RUN, step_seq=i, kind="tool", ts=ts(i),
                        arguments={"path": f"/f{i}", "text": (f"{i:05d}" * 7000)[: LIMITS.arguments_chars - 40]},
                        output=(f"out{i:05d}" * 9000)[: LIMITS.output_chars - len(CLIP_MARKER)] + CLIP_MARKER,
                        clipped=True,
                        call_event={"id": f"e{i}", "ts": ts(i), "type": "tool_call", "tool": "write"},
                        result_event={"id": f"r{i}", "ts": ts(i), "type": "tool_result", "status": "ok"})
             for i in range(start, min(n, start + 50))]
        )  # fmt: skip


class Exchange:
    """A raw ASGI GET whose body goes to a file (nothing of it is kept in memory);
    ``disconnect_after`` chunks, the client goes away."""

    def __init__(self, app: Any, path: str, token: str, out: Path, disconnect_after: int | None = None) -> None:
        self.app, self.path, self.token, self.out = app, path, token, out
        self.disconnect_after = disconnect_after
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunks = 0
        self.size = 0
        self._done = asyncio.Event()

    async def run(self) -> Exchange:
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
            "path": self.path, "raw_path": self.path.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"host", b"api.test"), (b"authorization", f"Bearer {self.token}".encode())],
            "client": ("127.0.0.1", 9), "server": ("api.test", 80),
        }  # fmt: skip
        requested = False

        async def receive() -> dict[str, Any]:
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await self._done.wait()
            return {"type": "http.disconnect"}

        with open(self.out, "wb") as fh:

            async def send(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    self.status = message["status"]
                    self.headers = {k.decode().lower(): v.decode() for k, v in message["headers"]}
                elif message["type"] == "http.response.body":
                    if message.get("body"):
                        fh.write(message["body"])
                        self.chunks += 1
                        self.size += len(message["body"])
                    if not message.get("more_body") or self.chunks == self.disconnect_after:
                        self._done.set()
                        if message.get("more_body"):
                            await asyncio.sleep(3600)  # the client is gone: this send never returns

            await self.app(scope, receive, send)
        return self


@pytest.fixture
def tokens(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "tokens.json"
    token, _ = add_token(path, COMPANY, ["steps:read", "deep:read"], created="2026-11-29T12:00:00Z")
    return path, token


def make(steps: Any, deep: Any, tokens_path: Path, **kwargs: Any) -> Any:
    return create_app(steps, deep, TokenRegistry(tokens_path), ApiMetrics(), **kwargs)


def extract(tar_path: Path, into: Path) -> dict[str, bytes]:
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


async def test_a_big_bundle_streams_within_a_fixed_memory_budget_and_validates(tmp_path, tokens):
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    await seed_big_run(steps, deep, 200)  # ~20 million characters of bodies
    app = make(steps, deep, tokens[0])
    out = tmp_path / "big.tar"
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        exchange = await Exchange(app, f"/v1/companies/{COMPANY}/runs/{RUN}/trace.sftrace", tokens[1], out).run()
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert exchange.status == 200 and exchange.headers["content-type"] == "application/x-tar"
    print(f"bundle of 200 steps at the caps: {exchange.size / 1e6:.1f} MB streamed, peak {peak / 1e6:.1f} MB")
    # About one page of bodies (16 rows, ~2 MB) and the spools' memory part; the whole
    # run is ~20 MB of text, and building it in memory (before) peaked at 132 MB.
    assert peak < 12_000_000, f"building and streaming the bundle peaked at {peak / 1e6:.0f} MB"
    assert exchange.size > 19_000_000 and exchange.chunks > 20  # streamed in chunks
    files = extract(out, tmp_path)
    result = validate_bundle(tmp_path / f"{RUN}.sftrace", strict=True, verify_integrity=True)
    assert result.valid, result.issues
    assert files["events.jsonl"].count(b"\n") == 1 + 2 * 200 + 1


async def test_the_streamed_bundle_is_the_in_memory_bundle_byte_for_byte(tmp_path, tokens):
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    await load(steps, deep, [e for e in corpus() if e["company_id"] == COMPANY])
    app = make(steps, deep, tokens[0])
    for run in await steps.list_runs(COMPANY):
        out = tmp_path / f"{run.run_id}.tar"
        exchange = await Exchange(app, f"/v1/companies/{COMPANY}/runs/{run.run_id}/trace.sftrace", tokens[1], out).run()
        assert exchange.status == 200
        seqs = [s.step_seq for s in await steps.get_steps(COMPANY, run.run_id)]
        expected = build_bundle(run, await deep.get_deep(COMPANY, run.run_id), company_id=COMPANY, step_seqs=seqs)
        assert extract(out, tmp_path / run.run_id) == expected.files


class PagedDeep(MemoryDeepStore):
    """Records every read's range; ``gate`` (when set) holds reads until it opens."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[int | None, int | None]] = []
        self.gate: asyncio.Event | None = None
        self.waiting = 0

    async def get_deep(self, company_id, run_id, *, after=None, limit=None):
        self.reads.append((after, limit))
        if self.gate is not None:
            self.waiting += 1
            await self.gate.wait()
            self.waiting -= 1
        return await super().get_deep(company_id, run_id, after=after, limit=limit)


async def test_the_deep_route_reads_and_sends_a_page_at_a_time(tmp_path, tokens):
    steps, deep = MemoryStepStore(), PagedDeep()
    await seed_big_run(steps, deep, 3 * PAGE_ROWS + 5)
    app = make(steps, deep, tokens[0])
    out = tmp_path / "deep.json"
    exchange = await Exchange(app, f"/v1/companies/{COMPANY}/runs/{RUN}/deep", tokens[1], out).run()
    assert exchange.status == 200 and exchange.headers["content-type"].startswith("application/json")
    assert deep.reads and all(limit == PAGE_ROWS for _, limit in deep.reads)  # never the whole run
    assert [after for after, _ in deep.reads] == [None, PAGE_ROWS - 1, 2 * PAGE_ROWS - 1, 3 * PAGE_ROWS - 1]
    assert exchange.chunks >= 4  # a chunk per page
    body = msgspec.json.decode(out.read_bytes())
    assert set(body) == {"company_id", "run_id", "bodies"} and (body["company_id"], body["run_id"]) == (COMPANY, RUN)
    stored = await MemoryDeepStore.get_deep(deep, COMPANY, RUN)
    assert [b["step_seq"] for b in body["bodies"]] == [r.step_seq for r in stored] == list(range(3 * PAGE_ROWS + 5))
    assert body["bodies"][7]["output"] == stored[7].output and body["bodies"][7]["clipped"] is True


async def test_an_empty_run_streams_an_empty_list(tokens):
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    await steps.write([], [RunRecord(company_id=COMPANY, run_id="empty", status="running", started_at=ts(0))])
    async with client(make(steps, deep, tokens[0])) as http:
        answer = await http.get(f"/v1/companies/{COMPANY}/runs/empty/deep", headers=bearer(tokens[1]))
        assert answer.status_code == 200
        assert answer.json() == {"company_id": COMPANY, "run_id": "empty", "bodies": []}
        answer = await http.get(f"/v1/companies/{COMPANY}/runs/nope/deep", headers=bearer(tokens[1]))
        assert answer.status_code == 404


@pytest.mark.parametrize("route", ["deep", "trace.sftrace"])
async def test_the_export_over_the_bound_gets_503_with_retry_after(tokens, route):
    steps, deep = MemoryStepStore(), PagedDeep()
    await seed_big_run(steps, deep, 3)
    app = make(steps, deep, tokens[0], max_exports=2, export_wait_seconds=0)
    deep.gate = asyncio.Event()
    async with client(app) as http:
        auth = bearer(tokens[1])
        held = [
            asyncio.create_task(http.get(f"/v1/companies/{COMPANY}/runs/{RUN}/deep", headers=auth)),
            asyncio.create_task(http.get(f"/v1/companies/{COMPANY}/runs/{RUN}/trace.sftrace", headers=auth)),
        ]
        while deep.waiting < 2:
            await asyncio.sleep(0.01)
        refused = await http.get(f"/v1/companies/{COMPANY}/runs/{RUN}/{route}", headers=auth)
        assert refused.status_code == 503
        assert refused.headers["retry-after"].isdigit() and int(refused.headers["retry-after"]) >= 1
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json() == {
            "type": "urn:stepstream:problem:unavailable", "title": "Service Unavailable", "status": 503,
            "detail": "too many exports in progress; retry later",
        }  # fmt: skip
        assert (await http.get(f"/v1/companies/{COMPANY}/runs/{RUN}", headers=auth)).status_code == 200  # not bound
        sample = app.metrics.registry.get_sample_value
        assert sample("stepstream_api_exports_in_progress") == 2 and sample("stepstream_api_exports_refused_total") == 1
        deep.gate.set()
        assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200]
        assert app.exports.active == 0
        assert (await http.get(f"/v1/companies/{COMPANY}/runs/{RUN}/{route}", headers=auth)).status_code == 200


async def test_a_request_waits_for_a_slot_within_the_wait(tokens):
    steps, deep = MemoryStepStore(), PagedDeep()
    await seed_big_run(steps, deep, 3)
    app = make(steps, deep, tokens[0], max_exports=1, export_wait_seconds=30)
    deep.gate = asyncio.Event()
    async with client(app) as http:
        auth = bearer(tokens[1])
        first = asyncio.create_task(http.get(f"/v1/companies/{COMPANY}/runs/{RUN}/deep", headers=auth))
        while deep.waiting < 1:
            await asyncio.sleep(0.01)
        second = asyncio.create_task(http.get(f"/v1/companies/{COMPANY}/runs/{RUN}/trace.sftrace", headers=auth))
        await asyncio.sleep(0.1)
        assert not second.done() and deep.waiting == 1  # queued for the slot, not reading
        deep.gate.set()
        assert [(await first).status_code, (await second).status_code] == [200, 200]
    assert app.exports.active == 0


@pytest.mark.parametrize("route", ["deep", "trace.sftrace"])
async def test_a_client_that_goes_away_gives_its_slot_back(tmp_path, tokens, route):
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    await seed_big_run(steps, deep, 4 * PAGE_ROWS)
    app = make(steps, deep, tokens[0], max_exports=1, export_wait_seconds=0)
    path = f"/v1/companies/{COMPANY}/runs/{RUN}/{route}"
    exchange = await Exchange(app, path, tokens[1], tmp_path / "cut", disconnect_after=1).run()
    assert exchange.status == 200 and exchange.chunks == 1
    assert app.exports.active == 0
    again = await Exchange(app, path, tokens[1], tmp_path / "whole").run()
    assert again.status == 200 and again.chunks > 1
