"""Durability: on by default in every backend, named by ``durability``, one URL
option to opt out, and an unknown option is a configuration error."""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepstream.errors import ConfigError
from stepstream.sinks import open_deep_store, open_step_store

from sink_support import COMPANY, MONGO_ENV, deep, drop_database, mongo_url, run, state, step

# backend -> (default durability, opt-out URL option, durability after opting out)
DURABILITY = {
    "memory": ("none", None, None),
    "file": ("fsync", "fsync=false", "no fsync"),
    "sqlite": ("synchronous=FULL", "synchronous=normal", "synchronous=NORMAL"),
    "mongodb": ("w=majority,j=true", "w=1", "w=1"),
}


def with_option(url: str, option: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{option}"


async def test_durability_is_on_by_default_and_named(backend: str, store_url: str) -> None:
    default, _, _ = DURABILITY[backend]
    steps, deeps = await open_step_store(store_url), await open_deep_store(store_url)
    try:
        # FerretDB accepts w=majority and j=true (and ignores them); the store says so.
        assert steps.durability.startswith(default) and deeps.durability.startswith(default)
        # The default concern is accepted by the server: every write goes through it.
        assert await steps.write([step(0)], [run()], [state(last_seq=1)]) == []
        await deeps.write([deep(0, output='"x"')])
        assert [d.output for d in await deeps.get_deep(COMPANY, "r1")] == ['"x"']
    finally:
        await steps.close()
        await deeps.close()


# Memory keeps nothing (``none``, asserted above): it has no durability to opt out of.
@pytest.mark.parametrize("backend", [name for name, (_, option, _) in DURABILITY.items() if option])
async def test_durability_opt_out(backend: str, store_url: str) -> None:
    _, option, weaker = DURABILITY[backend]
    url = with_option(store_url, option)
    steps, deeps = await open_step_store(url), await open_deep_store(url)
    try:
        assert steps.durability.startswith(weaker) and deeps.durability.startswith(weaker)
        assert await steps.write([step(0)], [run()], [state(last_seq=1)]) == []
        await deeps.write([deep(0, output='"x"')])
        assert len(await deeps.get_deep(COMPANY, "r1")) == 1
    finally:
        await steps.close()
        await deeps.close()


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("sqlite:///{tmp}/a.db?synchronus=full", "synchronus"),
        ("sqlite:///{tmp}/a.db?synchronous=sometimes", "synchronous"),
        ("sqlite:///{tmp}/a.db?synchronous=off", "synchronous"),
        ("sqlite:///{tmp}/a.db?busy_timeout_ms=-5", "busy_timeout_ms"),
        ("sqlite:///{tmp}/a.db?synchronous=full&synchronous=normal", "synchronous"),
        ("sqlite:///{tmp}/a.db?fsync=false", "fsync"),
        ("file://{tmp}/d?fsnyc=false", "fsnyc"),
        ("file://{tmp}/d?fsync=maybe", "fsync"),
        ("file://{tmp}/d?synchronous=normal", "synchronous"),
        ("mongodb://127.0.0.1:1/x?j=false", "journal"),
    ],
)
async def test_an_unknown_or_bad_option_is_a_config_error(tmp_path: Path, url: str, named: str) -> None:
    for opener in (open_step_store, open_deep_store):
        with pytest.raises(ConfigError, match=named):
            await opener(url.format(tmp=tmp_path))


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every ``os.fsync`` as the name of what it synced (a directory ends in ``/``)."""
    calls: list[str] = []
    real = os.fsync

    def recording(fd: int) -> None:
        info = os.fstat(fd)
        name = os.readlink(f"/proc/self/fd/{fd}")
        calls.append(Path(name).name + ("/" if stat.S_ISDIR(info.st_mode) else ""))
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    yield calls


async def test_file_sink_fsyncs_every_file_of_a_batch(tmp_path: Path, fsyncs: list[str]) -> None:
    root = tmp_path / "sink"
    steps, deeps = await open_step_store(f"file://{root}"), await open_deep_store(f"file://{root}")
    assert fsyncs == [f"{tmp_path.name}/"]  # the new directory's entry in its parent
    fsyncs.clear()
    await steps.write([step(0)], [run()], [state(last_seq=1)])
    # Each file written, and the directory once, since the batch created them.
    assert sorted(fsyncs) == ["run-state.jsonl", "run-steps.jsonl", "runs.jsonl", "sink/"]
    fsyncs.clear()
    await steps.write([step(1)], [], [state(last_seq=2)])
    assert sorted(fsyncs) == ["run-state.jsonl", "run-steps.jsonl"]
    fsyncs.clear()
    await deeps.write([deep(0, output='"x"')])
    assert sorted(fsyncs) == ["deep-index.jsonl", "deep-trace.jsonl", "sink/"]
    fsyncs.clear()
    await deeps.purge_run(COMPANY, "r1")  # a rewrite: the new file, then its rename; then the index line
    assert [name.endswith(".tmp") for name in fsyncs] == [True, False, False] and fsyncs[1:] == [
        "sink/",
        "deep-index.jsonl",
    ]
    await steps.close()
    await deeps.close()


async def test_file_sink_without_fsync_leaves_it_to_the_page_cache(tmp_path: Path, fsyncs: list[str]) -> None:
    url = f"file://{tmp_path / 'sink'}?fsync=false"
    steps, deeps = await open_step_store(url), await open_deep_store(url)
    await steps.write([step(0)], [run()], [state(last_seq=1)])
    await deeps.write([deep(0, output='"x"')])
    assert fsyncs == []
    assert len(await steps.get_steps(COMPANY, "r1")) == 1
    await steps.close()
    await deeps.close()


async def test_mongodb_keeps_the_write_concern_the_url_sets() -> None:
    base = os.environ.get(MONGO_ENV)
    if not base:
        pytest.fail(f"{MONGO_ENV} is not set: run the suite via `make test`, which starts FerretDB")
    url = mongo_url(base, f"stepstream_test_{uuid.uuid4().hex[:16]}")
    cases = (
        ("journal=false", "j=false"),
        ("w=1&journal=true", "w=1,j=true"),
        ("w=majority", "w=majority ("),  # w alone: no journal added
        ("wtimeoutMS=5000", "w=majority,j=true,wtimeout=5000"),  # a timeout alone keeps the default
    )
    try:
        for seq, (option, named) in enumerate(cases):
            store = await open_step_store(with_option(url, option))
            try:
                assert store.durability.startswith(named), (option, store.durability)
                assert await store.write([step(0)], [], [state(last_seq=seq)]) == []
            finally:
                await store.close()
    finally:
        await drop_database(url)


async def test_mongodb_production_defaults() -> None:
    """A majority with a timeout, retryable writes, and the write path's reads on the
    primary even when the URL lets readers use secondaries (checked on the client:
    FerretDB has no replica set to route to)."""
    base = os.environ.get(MONGO_ENV)
    if not base:
        pytest.fail(f"{MONGO_ENV} is not set: run the suite via `make test`, which starts FerretDB")
    from pymongo import ReadPreference

    url = mongo_url(base, f"stepstream_test_{uuid.uuid4().hex[:16]}")
    store = await open_step_store(with_option(url, "readPreference=secondaryPreferred"))
    try:
        assert store.durability.startswith("w=majority,j=true,wtimeout=10000")
        conn = store._conn  # type: ignore[attr-defined]
        assert conn.client.options.retry_writes is True
        assert conn.db.read_preference == ReadPreference.SECONDARY_PREFERRED  # readers: as the URL says
        assert conn.on_primary("run_state").read_preference == ReadPreference.PRIMARY
        assert await store.write([step(0)], [run()], [state(last_seq=1)]) == []
        assert (await store.load_states(COMPANY, ["r1"]))["r1"].last_seq == 1
    finally:
        await store.close()
        await drop_database(url)
    store = await open_step_store(with_option(url, "retryWrites=false"))
    try:
        assert store._conn.client.options.retry_writes is False  # type: ignore[attr-defined]
    finally:
        await store.close()
        await drop_database(url)
