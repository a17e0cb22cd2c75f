"""`stepstream compactor` as a service (loop, /metrics, /healthz, SIGTERM, --once) and
`stepstream purge` (dry run, confirmation, counts, steps kept), on SQLite, no Kafka
(abandoning runs is off here; tests/integration/test_compactor.py covers it)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stepstream import cli
from stepstream.compactor.policy import CompanyPolicy, load_policy
from stepstream.compactor.purge import purge
from stepstream.core.wire import encode_event
from stepstream.emitter.corpus import generate_events
from stepstream.errors import ConfigError
from stepstream.sinks import open_deep_store, open_step_store


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A SQLite store holding 16 runs of 2 companies (ingest-file of the corpus)."""
    src = tmp_path / "events.jsonl"
    src.write_bytes(b"".join(encode_event(e) + b"\n" for e in generate_events(3, runs=16, companies=2)))
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert cli.main(["ingest-file", str(src), "--steps-sink", url, "--no-progress"]) == 0
    return url


async def _bodies(url: str) -> dict[str, dict[str, int]]:
    deep = await open_deep_store(url)
    try:
        return {c: {r.run_id: r.bodies for r in await deep.retention_index(c)} for c in await deep.list_companies()}
    finally:
        await deep.close()


async def _steps(url: str) -> dict[str, int]:
    steps = await open_step_store(url)
    try:
        out = {}
        for company in await steps.list_companies():
            for run in await steps.list_runs(company, limit=1000):
                out[f"{company}/{run.run_id}"] = len(await steps.get_steps(company, run.run_id))
        return out
    finally:
        await steps.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_the_service_prunes_serves_metrics_and_stops_on_sigterm(db: str, tmp_path: Path) -> None:
    steps_before = asyncio.run(_steps(db))
    port = _free_port()
    env = {**os.environ, "STEPSTREAM_STEPS_SINK": db, "STEPSTREAM_COMPACTOR_WEB_PORT": str(port),
           "STEPSTREAM_ABANDON_AFTER_SECONDS": "0"}  # fmt: skip
    log = (tmp_path / "compactor.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "stepstream.cli", "compactor", "--interval", "0.2", "--deep-runs", "3"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if _metric(port, "stepstream_compactor_last_success_timestamp_seconds") > 0:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "compactor.log").read_text()
            time.sleep(0.1)
        health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read())
        assert health["ok"] and health["passes"] >= 1 and health["last_success"] > 0
        pruned = _metric(port, "stepstream_runs_pruned_total")
        assert pruned == 16 - 2 * 3
        assert _metric(port, "stepstream_deep_bodies_purged_total") > 0
        assert _metric(port, "stepstream_compactor_pass_seconds_count") >= 1
        assert _metric(port, "stepstream_compactor_passes_total") >= 1  # ok passes (no store error here)
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        served = {f.name for f in text_string_to_metric_families(page)}
        # Abandoning needs a broker and the TTLs are off here: these are served at 0 (the
        # conformance and integration tests count what they do).
        assert {"stepstream_runs_abandoned", "stepstream_runs_expired", "stepstream_compactor_errors"} <= served
        assert _metric(port, "stepstream_compactor_errors_total") == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert all(sum(1 for n in runs.values() if n) == 3 for runs in asyncio.run(_bodies(db)).values())
    assert asyncio.run(_steps(db)) == steps_before  # no step touched


def test_once_uses_the_overrides_file(db: str, tmp_path: Path) -> None:
    companies = sorted(asyncio.run(_bodies(db)))
    overrides = tmp_path / "retention.toml"
    overrides.write_text(f'[defaults]\ndeep_runs = 5\n\n[companies."{companies[0]}"]\ndeep_runs = 1\n')
    rc = cli.main(["compactor", "--once", "--steps-sink", db, "--retention-file", str(overrides),
                   "--abandon-after-seconds", "0"])  # fmt: skip
    assert rc == 0
    kept = {c: sum(1 for n in runs.values() if n) for c, runs in asyncio.run(_bodies(db)).items()}
    assert kept == {companies[0]: 1, companies[1]: 5}


def test_a_bad_overrides_file_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[companies.acme]\ndeep_runz = 3\n")
    with pytest.raises(ConfigError, match="bad.toml"):
        load_policy(CompanyPolicy(), bad)
    bad.write_text("[companies.acme]\ndeep_runs = -1\n")
    with pytest.raises(ConfigError):
        load_policy(CompanyPolicy(), bad)
    good = tmp_path / "good.toml"
    good.write_text("[defaults]\nabandon_after_seconds = 0\n[companies.acme]\ndeep_ttl_seconds = 60\n")
    policy = load_policy(CompanyPolicy(deep_runs=7), good)
    assert policy.for_company("acme") == CompanyPolicy(deep_runs=7, deep_ttl_seconds=60, abandon_after_seconds=0)
    assert policy.for_company("other") == CompanyPolicy(deep_runs=7, abandon_after_seconds=0)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


async def test_purge_counts_confirms_and_keeps_steps(db: str) -> None:
    bodies = await _bodies(db)
    company = sorted(bodies)[0]
    steps_before = await _steps(db)
    total = sum(bodies[company].values())
    one = sorted(bodies[company])[0]
    dry = await purge(db, company, dry_run=True, stderr=io.StringIO())
    assert (dry.bodies, dry.runs, dry.destroyed) == (total, len(bodies[company]), 0)
    refused = await purge(db, company, stdin=io.StringIO("y\n"), stderr=io.StringIO())  # not a terminal
    assert not refused.confirmed and refused.destroyed == 0
    wrong = await purge(db, company, stdin=_Tty("nope\n"), stderr=io.StringIO())
    assert not wrong.confirmed and (await _bodies(db)) == bodies
    single = await purge(db, company, one, yes=True, progress=False, stderr=io.StringIO())
    assert single.destroyed == bodies[company][one]
    rest = await purge(db, company, stdin=_Tty(f"{company}\n"), stderr=io.StringIO())
    assert rest.destroyed == total - bodies[company][one]
    after = await _bodies(db)
    assert sum(after.get(company, {}).values()) == 0
    other = sorted(bodies)[1]
    assert after[other] == bodies[other]  # another company untouched
    assert await _steps(db) == steps_before  # steps are never touched


def test_purge_cli_prints_the_count(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    company = sorted(asyncio.run(_bodies(db)))[0]
    assert cli.main(["purge", "--steps-sink", db, "--company", company, "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("would destroy ")
    assert cli.main(["purge", "--steps-sink", db, "--company", company, "--yes", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("destroyed ") and out.split()[1] != "0"
