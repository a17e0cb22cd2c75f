"""Every client on the locked-down broker (issue 20): SASL_SSL with SCRAM-SHA-512 and
the least-privilege ACLs of deploy/kafka/acls.sh, mTLS for the worker, and each refusal
said in one line within 30 s, with no secret literal anywhere."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from stepfork.recorder import record

from harness import KILLED_SESSION, dump, first_difference, golden_dump, read_topic, wait_caught_up, wait_for
from secure_kafka import SecureKafka, SecureScenario
from stepstream.cli import main
from stepstream.core import wire
from stepstream.core.wire import decode_event
from stepstream.emitter.corpus import generate_events
from stepstream.emitter.demo import replay_on
from stepstream.emitter.producer import Emitter
from stepstream.emitter.tracer import Tracer

pytestmark = pytest.mark.integration

REFUSAL_SECONDS = 30.0


def run_cli(env: dict[str, str], argv: list[str]) -> int:
    """``stepstream ARGV`` in this process with ``env`` set (the CLI reads it once)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return main(argv)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def scenario_of(secure_kafka, tmp_path):
    """``scenario_of(partitions)``: a SecureScenario whose workers are all stopped at the end."""
    made: list[SecureScenario] = []

    def make(partitions: int = 4) -> SecureScenario:
        made.append(SecureScenario(secure_kafka, tmp_path, partitions))
        return made[-1]

    yield make
    for scenario in made:
        scenario.stop_all()


def bundle_of(path: Path, calls: int) -> Path:
    with record("ref", output=path) as session:
        for i in range(calls):
            call = session.record_tool_call(name="t", input={"i": i})
            session.record_tool_result(call, i)
    return path


def assert_no_secret(secure: SecureKafka, where: str, text: str) -> None:
    for secret in secure.secrets():
        assert secret not in text, f"a secret literal appears in {where}"


async def test_every_client_over_sasl_ssl_with_least_privilege_equals_ingest_file(secure_kafka, scenario_of, tmp_path,
                                                                                   capfd):  # fmt: skip
    s = scenario_of()
    await s.create_topics()
    worker = s.start_worker()
    # The SDK, as an agent (WRITE on the raw topic only).
    events = generate_events(2026120, runs=16, companies=2)
    with Tracer(secure_kafka.connection("agents"), s.topic, max_queue=len(events) + 1, flush_timeout=60) as tracer:
        replay_on(tracer, events)
        assert tracer.flush(60)
    stats = tracer.stats()
    assert (stats.sent, stats.failed, stats.dropped) == (len(events), 0, 0), stats
    agents = secure_kafka.env("agents")
    # stepstream demo and import --publish, as the same agent principal.
    demo = ["demo", "--runs", "6", "--companies", "2", "--seed", "11", "--topic", s.topic, "--no-create-topics"]
    assert await asyncio.to_thread(run_cli, agents, demo) == 0
    bundle = bundle_of(tmp_path / "rec.sftrace", 4)
    imported = ["import", str(bundle), "--company", "co-imp", "--run-id", "imp-1", "-o", str(tmp_path / "imp.jsonl"),
                "--publish", "--topic", s.topic]  # fmt: skip
    assert await asyncio.to_thread(run_cli, agents, imported) == 0
    # A message the worker refuses: its dead-letter copy goes out as the worker principal.
    async with Emitter(secure_kafka.connection("agents"), s.topic) as emitter:
        await emitter.emit_raw(b"co-00/bad", b"not an event")
    await asyncio.to_thread(worker.wait_web)
    await wait_caught_up(s.broker, s.group, s.topic, [worker], timeout=180)
    # The compactor, as its own principal, closes the runs the demo left open (its run_close events).
    await asyncio.sleep(2.0)
    compactor = ["compactor", "--once", "--abandon-after-seconds", "1", "--deep-runs", "1000", "--topic", s.topic,
                 "--steps-sink", s.steps_url, "--deep-sink", s.deep_url]  # fmt: skip
    closed = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "stepstream.cli", *compactor],
        env={**os.environ, **secure_kafka.env("compactor")}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert closed.returncode == 0, closed.stderr[-2000:]
    await asyncio.sleep(1.0)
    await wait_caught_up(s.broker, s.group, s.topic, [worker], timeout=120)
    metrics, ready = worker.metrics(), worker.ready()
    assert worker.stop(timeout=30) == 0, worker.tail()

    records = await read_topic(s.broker, s.topic)
    good = [decode_event(r.value) for r in records if r.value != b"not an event"]
    closes = [e for e in good if isinstance(e, wire.RunClose)]
    assert closes, "the compactor closed no run"
    assert {e.company_id for e in good} == {"co-00", "co-01", "co-imp"}
    companies = sorted({e.company_id for e in good})
    got = await dump(s.steps_url, s.deep_url, companies)
    golden = await golden_dump(good, tmp_path / "golden", companies)
    assert got == golden, first_difference(golden, got)

    dead = await read_topic(s.broker, s.dlq)
    assert len(dead) == 1
    headers = "".join(f"{k}={v!r}" for r in dead for k, v in r.headers)
    err = capfd.readouterr()
    for where, text in (("the worker log", worker.log_path.read_text(errors="replace")), ("/metrics", metrics),
                        ("/ready", repr(ready)), ("dead-letter headers", headers), ("CLI output", err.out + err.err + closed.stdout + closed.stderr)):  # fmt: skip
        assert_no_secret(secure_kafka, where, text)


async def test_sigkill_mid_stream_over_sasl_ssl_converges(scenario_of, tmp_path):
    s = scenario_of()
    await s.create_topics()
    events = generate_events(2026121, runs=60, companies=3)
    companies = sorted({e.company_id for e in events})
    rng = random.Random(20)
    chunk = len(events) // 4 + 1
    worker = s.start_worker(name="k0", **KILLED_SESSION)
    kills = 0
    at_work = 0  # kills of a worker that had folded events (every other one waits for its partitions)
    for n, i in enumerate(range(0, len(events), chunk)):
        await s.produce(events[i : i + chunk])
        if n % 2 == 0:
            await wait_for(lambda: worker.ready_status()[0] == 200, 60, "the worker to get its partitions")
        await asyncio.sleep(rng.uniform(1.0, 3.0))
        at_work += worker.metric_sum("stepstream_events_total") > 0
        worker.kill()
        kills += 1
        worker = s.start_worker(name=f"k{kills}", **KILLED_SESSION)
    await wait_caught_up(s.broker, s.group, s.topic, [worker], timeout=240)
    assert worker.stop(timeout=30) == 0, worker.tail()
    assert kills >= 4
    assert at_work >= 1, f"none of {kills} kills hit a worker that had folded events"
    got = await dump(s.steps_url, s.deep_url, companies)
    golden = await golden_dump(events, tmp_path / "golden", companies)
    assert got == golden, first_difference(golden, got)


async def test_the_worker_over_mtls_equals_ingest_file(scenario_of, tmp_path):
    s = scenario_of(partitions=2)
    await s.create_topics()
    worker = s.start_worker(mtls=True)  # User:worker from its certificate's CN: the same ACLs
    events = generate_events(2026122, runs=20, companies=2)
    companies = sorted({e.company_id for e in events})
    await s.produce(events)
    await asyncio.to_thread(worker.wait_web)
    await wait_caught_up(s.broker, s.group, s.topic, [worker], timeout=180)
    assert worker.stop(timeout=30) == 0, worker.tail()
    got = await dump(s.steps_url, s.deep_url, companies)
    golden = await golden_dump(events, tmp_path / "golden", companies)
    assert got == golden, first_difference(golden, got)


# -- refusals ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory) -> Path:
    """A CA the broker's certificate does not chain to."""
    folder = tmp_path_factory.mktemp("other-ca")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(folder / "ca.key"),
         "-out", str(folder / "ca.pem"), "-days", "1", "-subj", "/CN=not the stepstream test CA"],
        check=True, capture_output=True,
    )  # fmt: skip
    return folder / "ca.pem"


def refusal_env(secure: SecureKafka, kind: str, tmp: Path, other_ca: Path) -> tuple[dict[str, str], str]:
    """The environment of a client refused for ``kind``, and the phrase its line must hold."""
    wrong = tmp / "wrong.password"
    wrong.write_text("not-the-password\n")
    if kind == "wrong password":
        return secure.env("worker", password_file=wrong), "authentication failed"
    if kind == "unknown user":
        return secure.env("nobody", password_file=wrong), "authentication failed"
    if kind == "missing ACL":
        return secure.env("api"), "not authorized on topic"  # the API principal has no ACL
    if kind == "untrusted certificate":
        return secure.env("worker", cafile=other_ca), "certificate is not trusted"
    if kind == "mismatched certificate":
        port = secure.sasl_ssl.rsplit(":", 1)[1]
        return secure.env("worker", brokers=f"localhost:{port}"), "Hostname mismatch"
    raise AssertionError(kind)


def assert_one_refusal_line(secure: SecureKafka, stderr: str, env: dict[str, str], phrase: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    (line,) = lines
    assert line.startswith("stepstream: Kafka refused SASL_SSL SCRAM-SHA-512 user "), line
    assert env["STEPSTREAM_BROKER"] in line and phrase in line, line
    assert_no_secret(secure, "a refusal line", stderr)


KINDS = ["wrong password", "unknown user", "missing ACL", "untrusted certificate", "mismatched certificate"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_worker_exits_with_one_line_within_30s(secure_kafka, tmp_path, other_ca, kind):
    env, phrase = refusal_env(secure_kafka, kind, tmp_path, other_ca)
    env |= {"STEPSTREAM_TOPIC": "secure.raw.refused", "STEPSTREAM_DLQ_TOPIC": "secure.dlq.refused",
            "STEPSTREAM_APP_ID": "secure-group-refused", "STEPSTREAM_STEPS_SINK": f"sqlite:///{tmp_path / 's.db'}"}  # fmt: skip
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "stepstream.cli", "worker"], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=REFUSAL_SECONDS + 30)  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode != 0 and took < REFUSAL_SECONDS, (done.returncode, took, done.stderr[-2000:])
    assert_one_refusal_line(secure_kafka, done.stderr, env, phrase)


@pytest.mark.parametrize("command", ["compactor", "demo", "import"])
@pytest.mark.parametrize("kind", KINDS[:4])
async def test_a_refused_compactor_or_cli_exits_with_one_line_within_30s(secure_kafka, tmp_path, other_ca, capfd,
                                                                        command, kind):  # fmt: skip
    env, phrase = refusal_env(secure_kafka, kind, tmp_path, other_ca)
    topic = "secure.raw.refused"
    argv = {
        "compactor": ["compactor", "--once", "--topic", topic, "--steps-sink", f"sqlite:///{tmp_path / 's.db'}"],
        "demo": ["demo", "--runs", "2", "--companies", "1", "--topic", topic, "--no-create-topics"],
        "import": ["import", str(bundle_of(tmp_path / "r.sftrace", 1)), "--company", "c", "-o", str(tmp_path / "i.jsonl"),
                   "--publish", "--topic", topic],
    }[command]  # fmt: skip
    capfd.readouterr()
    started = time.monotonic()
    rc = await asyncio.wait_for(asyncio.to_thread(run_cli, env, argv), REFUSAL_SECONDS)
    took = time.monotonic() - started
    err = capfd.readouterr().err
    assert rc != 0 and took < REFUSAL_SECONDS, (rc, took, err)
    assert_one_refusal_line(secure_kafka, err, env, phrase)


async def test_a_refused_sdk_never_blocks_and_counts_the_refusals_as_failed(secure_kafka, tmp_path):
    wrong = secure_kafka.connection("agents", password="not-the-password")
    tracer = Tracer(wrong, "secure.raw.refused", flush_timeout=5)
    try:
        started = time.monotonic()
        with tracer.run("co-x", agent_name="refused") as run:
            for i in range(5):
                run.thinking(f"step {i}")
        assert time.monotonic() - started < 5.0  # no call waited for the broker (which takes up to 30 s)
        deadline = time.monotonic() + REFUSAL_SECONDS
        while tracer.stats().failed < 7 and time.monotonic() < deadline:  # run_start, 5 deltas, run_end
            await asyncio.sleep(0.2)
        stats = tracer.stats()
        assert (stats.failed, stats.sent) == (7, 0), stats
    finally:
        await tracer.aclose()


async def test_no_create_topics_checks_existence_and_partition_count(kafka_bootstrap, kafka_topic_factory):
    from stepstream.config import load_settings
    from stepstream.errors import ConfigError
    from stepstream.kafka.topics import ensure_topics

    raw = await kafka_topic_factory(2, prefix="precreated")
    settings = load_settings({"broker": kafka_bootstrap, "topic": raw, "partitions": 2}, environ={})
    with pytest.raises(ConfigError, match=rf"topic {raw}\.dlq is not there"):
        await ensure_topics(settings, create=False)  # and it did not create it
    with pytest.raises(ConfigError, match="is not there"):
        await ensure_topics(settings, create=False)
    dlq = await kafka_topic_factory(2, prefix="precreated-dlq")
    await ensure_topics(load_settings({"broker": kafka_bootstrap, "topic": raw, "dlq_topic": dlq, "partitions": 2},
                                      environ={}), create=False)  # fmt: skip
    wrong = load_settings({"broker": kafka_bootstrap, "topic": raw, "dlq_topic": dlq, "partitions": 4}, environ={})
    with pytest.raises(ConfigError, match=rf"topic {raw} has 2 partitions, the settings say 4"):
        await ensure_topics(wrong, create=False)
