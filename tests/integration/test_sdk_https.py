"""The SDK over ``https://``: ``Tracer("https://...")`` through a real TLS listener
(uvicorn serving ``stepstream api --ingest`` with a certificate that openssl makes
here, signed by a CA made here) to the real broker. With the CA (``ssl_cafile``, or
``STEPSTREAM_API_CAFILE`` and the token from ``STEPSTREAM_TOKEN``) the runs land
whole and in order; without it the certificate is refused: every event is counted in
``failed``, nothing lands, and no call blocks."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from ingest_support import ApiProcess, HostLoop, TopicTail, create_topic
from stepstream.api.tokens import add_token
from stepstream.emitter import Tracer
from stepstream.errors import ConfigError

pytestmark = pytest.mark.integration


def openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate for 127.0.0.1 / localhost signed by it: (cert, key, ca)."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=stepstream-test-api-ca", cwd=folder)  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "api.key", "-out", "api.csr", "-subj", "/CN=127.0.0.1",
            cwd=folder)  # fmt: skip
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "api.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
            "-extfile", "san.ext", "-out", "api.pem", cwd=folder)  # fmt: skip
    return folder / "api.pem", folder / "api.key", folder / "ca.pem"


@pytest.fixture(scope="module")
def https_api(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("https")
    tls = make_certificates(folder)
    loop = HostLoop()
    topic = loop.run(create_topic(kafka_bootstrap, partitions=2))
    token, _ = add_token(folder / "tokens.json", "acme", ["ingest"], created="2026-12-01T12:00:00Z")
    api = ApiProcess(kafka_bootstrap, topic, folder / "tokens.json", folder, tls=tls).wait_connected()
    tail = loop.run(TopicTail(kafka_bootstrap, topic).start())
    try:
        yield api, token, tls[2], loop, tail
    finally:
        loop.run(tail.stop())
        api.stop()
        loop.close()


def run_ids(loop: HostLoop, tail: TopicTail) -> dict[str, list[int]]:
    import msgspec

    runs: dict[str, list[int]] = {}
    for _, _, value in loop.run(tail.read()):
        event = msgspec.json.decode(value)
        runs.setdefault(event["run_id"], []).append(event["seq"])
    return runs


def send_runs(tracer: Tracer, prefix: str, runs: int = 3, steps: int = 20) -> float:
    """Runs of ``steps`` thoughts; the longest single call, in seconds."""
    slowest = 0.0
    for r in range(runs):
        with tracer.run("acme", f"{prefix}-{r}", agent_name="https") as run:
            for i in range(steps):
                started = time.perf_counter()
                run.thinking(f"{prefix} {r}:{i}")
                slowest = max(slowest, time.perf_counter() - started)
    return slowest


def test_with_the_api_ca_runs_land_whole_and_in_order(https_api) -> None:
    api, token, ca, loop, tail = https_api
    run_ids(loop, tail)  # what earlier tests left
    with Tracer(api.url, token=token, ssl_cafile=str(ca), batch_events=25) as tracer:
        send_runs(tracer, "trusted")
        assert tracer.flush(30)
        stats = tracer.stats()
    assert (stats.sent, stats.failed, stats.dropped) == (66, 0, 0), stats
    landed = run_ids(loop, tail)
    assert landed == {f"trusted-{r}": list(range(22)) for r in range(3)}


def test_the_token_and_the_ca_come_from_the_environment(https_api, monkeypatch) -> None:
    api, token, ca, loop, tail = https_api
    run_ids(loop, tail)
    monkeypatch.setenv("STEPSTREAM_TOKEN", token)
    monkeypatch.setenv("STEPSTREAM_API_CAFILE", str(ca))
    with Tracer(api.url) as tracer:
        send_runs(tracer, "from-env", runs=1)
        assert tracer.flush(30)
        assert tracer.stats().sent == 22 and tracer.stats().failed == 0
    assert run_ids(loop, tail) == {"from-env-0": list(range(22))}


def test_an_untrusted_certificate_fails_every_event_and_never_blocks(https_api, monkeypatch) -> None:
    api, token, _, loop, tail = https_api
    run_ids(loop, tail)
    monkeypatch.delenv("STEPSTREAM_API_CAFILE", raising=False)
    started = time.monotonic()
    with Tracer(api.url, token=token, batch_events=10) as tracer:  # the system's CAs: ours is not among them
        slowest = send_runs(tracer, "untrusted")
        assert tracer.flush(30)
        stats = tracer.stats()
    assert slowest < 0.5, f"a call took {slowest:.3f}s"
    assert time.monotonic() - started < 30  # refused, not retried until the flush timeout
    assert (stats.sent, stats.failed, stats.dropped) == (0, 66, 0), stats
    assert run_ids(loop, tail) == {}


def test_a_ca_file_that_cannot_be_read_raises_in_the_constructor(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="ssl_cafile"):
        Tracer("https://127.0.0.1:1", token="t", ssl_cafile=str(tmp_path / "missing.pem"))
    with pytest.raises(ValueError, match="https"):
        Tracer("http://127.0.0.1:1", token="t", ssl_cafile=str(tmp_path / "missing.pem"))
