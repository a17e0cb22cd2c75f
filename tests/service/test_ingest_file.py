"""`stepstream ingest-file`: the worker's engine without Kafka; bad lines are reported
with their line numbers and kept in a rejects file, never dropped silently."""

from __future__ import annotations

import asyncio
import json

import pytest

from stepstream import cli
from stepstream.core.wire import encode_event
from stepstream.emitter.corpus import generate_events
from stepstream.sinks import open_deep_store, open_step_store


def _write(path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(line + b"\n" for line in lines))


async def _runs(url: str, company: str):
    store = await open_step_store(url)
    try:
        return await store.list_runs(company, limit=1000)
    finally:
        await store.close()


def test_bad_lines_are_reported_with_line_numbers_and_kept(tmp_path, capsys):
    events = generate_events(5, runs=6, companies=2)
    good = [encode_event(e) for e in events]
    lines = list(good)
    bad = {3: b"{not json", 10: b'{"v":2}', 11: b"", 25: b'"just a string"', 40: b'{"v":1,"type":"dream"}'}
    for number in sorted(bad):
        lines.insert(number - 1, bad[number])
    src = tmp_path / "events.jsonl"
    _write(src, lines)
    db = f"sqlite:///{tmp_path / 'out.db'}"
    rc = cli.main(["ingest-file", str(src), "--steps-sink", db, "--deep-sink", db, "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1  # some lines were rejected
    rejected = {n for n in bad if bad[n]}  # the blank line is skipped, not rejected
    for number in rejected:
        assert f"line {number}:" in err
    rejects = [json.loads(line) for line in (tmp_path / "events.jsonl.rejects.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rejects] == sorted(rejected)
    assert {r["raw"] for r in rejects} == {bad[n].decode() for n in rejected}
    assert all(r["reason"] and r["detail"] for r in rejects)
    assert f"ingested {len(good)} events" in err
    companies = sorted({e.company_id for e in events})
    total = sum(len(asyncio.run(_runs(db, c))) for c in companies)
    assert total == len({(e.company_id, e.run_id) for e in events})


def test_clean_file_exits_zero_and_shows_progress(tmp_path, capsys):
    events = generate_events(6, runs=3, companies=1)
    src = tmp_path / "e.jsonl"
    _write(src, [encode_event(e) for e in events])
    out = tmp_path / "files"
    rc = cli.main(["ingest-file", str(src), "--steps-sink", f"file://{out}", "--deep-sink", f"file://{out}"])
    err = capsys.readouterr().err
    assert rc == 0
    assert "ingest" in err and "0 rejected" in err
    assert (out / "run-steps.jsonl").stat().st_size > 0
    assert (out / "deep-trace.jsonl").stat().st_size > 0
    assert not (tmp_path / "e.jsonl.rejects.jsonl").exists()


def test_missing_file_is_a_clear_error(tmp_path, capsys):
    assert cli.main(["ingest-file", str(tmp_path / "nope.jsonl"), "--no-progress"]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.parametrize("url", ["redis://x", "sqlite:"])
def test_unknown_sink_url_is_a_clear_error(tmp_path, capsys, url):
    src = tmp_path / "e.jsonl"
    _write(src, [encode_event(generate_events(1, runs=1, companies=1)[0])])
    assert cli.main(["ingest-file", str(src), "--steps-sink", url, "--no-progress"]) == 2
    assert "stepstream:" in capsys.readouterr().err


def test_same_records_through_every_file_backend(tmp_path):
    """ingest-file into sqlite and into files gives the same records (one engine)."""
    events = generate_events(8, runs=5, companies=2)
    src = tmp_path / "e.jsonl"
    _write(src, [encode_event(e) for e in events])
    db, files = f"sqlite:///{tmp_path / 'a.db'}", f"file://{tmp_path / 'f'}"
    for url in (db, files):
        assert cli.main(["ingest-file", str(src), "--steps-sink", url, "--deep-sink", url, "--no-progress"]) == 0

    async def dump(url):
        steps, deep = await open_step_store(url), await open_deep_store(url)
        out = {}
        for company in sorted({e.company_id for e in events}):
            for run in await steps.list_runs(company, limit=100):
                out[(company, run.run_id)] = (run, await steps.get_steps(company, run.run_id), await deep.get_deep(company, run.run_id))
        await steps.close()
        await deep.close()
        return out

    assert asyncio.run(dump(db)) == asyncio.run(dump(files))
