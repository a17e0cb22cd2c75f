"""``ingest-file`` reads, decodes and loads by chunk (``ingest.offline``): the rows
are the same whatever the chunk and batch sizes, also when a run leaves memory
mid-chunk (it ended and its batch was written) and comes back (a replayed file)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from stepstream.core.wire import encode_event
from stepstream.emitter.corpus import generate_events, generate_many_runs
from stepstream.ingest import offline
from stepstream.sinks import open_stores


async def _dump(url: str, companies: list[str]) -> dict:
    steps, deep = await open_stores(url, url)
    out: dict = {}
    try:
        for company in companies:
            for run in await steps.list_runs(company, limit=100_000):
                out[f"{company}/{run.run_id}"] = {
                    "run": msgspec.to_builtins(run),
                    "steps": [msgspec.to_builtins(s) for s in await steps.get_steps(company, run.run_id)],
                    "deep": [msgspec.to_builtins(d) for d in await deep.get_deep(company, run.run_id)],
                }
    finally:
        await steps.close()
        await deep.close()
    return out


@pytest.fixture(scope="module")
def corpus():
    events = generate_many_runs(3, runs=40, companies=3) + generate_events(4, runs=3, companies=2)
    return events, sorted({e.company_id for e in events})


def _ingest(path, url: str, monkeypatch, chunk_lines: int, batch_records: int) -> offline.IngestReport:
    monkeypatch.setattr(offline, "CHUNK_LINES", chunk_lines)
    return asyncio.run(offline.ingest_file(path, url, url, batch_records=batch_records, progress=False))


@pytest.mark.parametrize(("chunk_lines", "batch_records"), [(7, 5000), (5000, 40), (1, 40)])
def test_rows_do_not_depend_on_chunks_or_batches(tmp_path, monkeypatch, corpus, chunk_lines, batch_records):
    events, companies = corpus
    once = tmp_path / "once.jsonl"
    once.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    reference = f"sqlite:///{tmp_path / 'reference.db'}"
    assert _ingest(once, reference, monkeypatch, 1, 5000).events == len(events)  # one load per line

    # The file twice in a row: the second copy is all duplicates, of runs that ended and
    # left memory while the same chunk was being folded.
    twice = tmp_path / "twice.jsonl"
    twice.write_bytes(once.read_bytes() * 2)
    url = f"sqlite:///{tmp_path / 'chunked.db'}"
    report = _ingest(twice, url, monkeypatch, chunk_lines, batch_records)
    assert (report.events, report.rejected, report.lines) == (2 * len(events), 0, 2 * len(events))
    if batch_records < 100:
        assert report.batches >= 10  # written mid-chunk, while the chunk is folded (group commit)
    expected = asyncio.run(_dump(reference, companies))
    assert len(expected) >= 43
    assert asyncio.run(_dump(url, companies)) == expected


def test_rejects_stay_in_line_order_across_chunks(tmp_path, monkeypatch, capsys):
    events = generate_events(9, runs=3, companies=1)
    lines = [encode_event(e) for e in events]
    bad = {2: b"{not json", 9: b'{"v":2}', 10: b"[]", len(lines) + 3: b'"x"'}
    for number in sorted(bad):
        lines.insert(number - 1, bad[number])
    src = tmp_path / "e.jsonl"
    src.write_bytes(b"".join(line + b"\n" for line in lines))
    monkeypatch.setattr(offline, "CHUNK_LINES", 4)
    url = f"sqlite:///{tmp_path / 'out.db'}"
    report = asyncio.run(offline.ingest_file(src, url, url, progress=False))
    assert (report.events, report.rejected) == (len(events), len(bad))
    rejects = [msgspec.json.decode(line) for line in (tmp_path / "e.jsonl.rejects.jsonl").read_bytes().splitlines()]
    assert [r["line"] for r in rejects] == sorted(bad)
    err = capsys.readouterr().err
    assert [int(line.split()[1].rstrip(":")) for line in err.splitlines() if line.startswith("line ")] == sorted(bad)
