"""Open a store from its URL: the one place that knows every backend.

=========================  ==========================================================
``memory://[name]``        in-process dicts; every open is fresh and private
``file:///dir``            JSON lines in ``dir`` (``file://rel/dir`` is relative);
                           option ``fsync=false`` (default ``true``)
``sqlite:///path.db``      SQLite via aiosqlite (``sqlite:////abs/path.db``), default;
                           options ``synchronous=full|normal`` (default ``full``),
                           ``busy_timeout_ms=N`` (default 30000)
``mongodb://host:port/db`` MongoDB or FerretDB via pymongo (extra ``[mongodb]``);
                           ``mongodb+srv://`` too; options are pymongo's (``w``,
                           ``journal`` override the default ``w=majority, j=true``)
=========================  ==========================================================

Backends are imported only when their scheme is used, so the optional MongoDB
driver is needed only by ``mongodb://`` URLs (a :class:`ConfigError` says what
to install). Any other scheme, an unknown option of a file or SQLite URL, or an
option value that cannot work is a :class:`ConfigError`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, unquote

from stepstream.core.limits import Limits
from stepstream.errors import ConfigError
from stepstream.sinks.ports import DeepStore, StepStore

SCHEMES = ("memory", "file", "sqlite", "mongodb", "mongodb+srv")


def _scheme(url: str) -> str:
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise ConfigError(
            f"unknown sink URL {url!r}: use one of memory://, file:///dir, sqlite:///path.db, mongodb://host:port/db"
        )
    return scheme.lower()


def _file_path(url: str) -> str:
    path = unquote(url.partition("://")[2].split("?", 1)[0])
    if not path:
        raise ConfigError(f"file sink needs a directory, e.g. file:///var/lib/stepstream (got {url!r})")
    return path


def _flag(name: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"sink URL option {name}={value!r}: use true or false")


def _synchronous(name: str, value: str) -> str:
    if value.lower() not in ("full", "normal"):
        raise ConfigError(f"sink URL option {name}={value!r}: use full (the default) or normal")
    return value.upper()


def _milliseconds(name: str, value: str) -> int:
    if not value.isdigit():
        raise ConfigError(f"sink URL option {name}={value!r}: use a whole number of milliseconds")
    return int(value)


FILE_OPTIONS: dict[str, Callable[[str, str], Any]] = {"fsync": _flag}
SQLITE_OPTIONS: dict[str, Callable[[str, str], Any]] = {
    "synchronous": _synchronous,
    "busy_timeout_ms": _milliseconds,
}


def url_options(url: str, known: dict[str, Callable[[str, str], Any]]) -> dict[str, Any]:
    """The query options of ``url``, converted; an option not in ``known`` (or given
    twice) is a :class:`ConfigError` naming it, so a typo never silently weakens
    durability."""
    query = url.partition("://")[2].partition("?")[2]
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise ConfigError(f"sink URL query {query!r} is malformed: {exc}") from None
    names = [name for name, _ in pairs]
    unknown = sorted({n for n in names if n not in known})
    if unknown:
        raise ConfigError(
            f"unknown sink URL option(s) {', '.join(unknown)} in {url!r}; known: {', '.join(known) or 'none'}"
        )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"sink URL option(s) {', '.join(repeated)} given more than once in {url!r}")
    return {name: known[name](name, value) for name, value in pairs}


async def open_step_store(url: str) -> StepStore:
    """The step store (steps, run records, run states) at ``url``, opened and ready."""
    scheme = _scheme(url)
    if scheme == "memory":
        from stepstream.sinks.memory import MemoryStepStore

        return MemoryStepStore()
    if scheme == "file":
        from stepstream.sinks.files import FileStepStore, open_directory

        options = url_options(url, FILE_OPTIONS)
        return FileStepStore(open_directory(_file_path(url), **options), **options)
    if scheme == "sqlite":
        from stepstream.sinks.sqlite import SqliteStepStore, sqlite_path

        return await SqliteStepStore(sqlite_path(url), **url_options(url, SQLITE_OPTIONS)).open()
    from stepstream.sinks.mongodb import MongoStepStore

    return await MongoStepStore(url).open()


async def open_deep_store(
    url: str,
    *,
    limits: Limits | None = None,
    on_clip: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.time,
) -> DeepStore:
    """The deep store at ``url``, opened and ready. ``limits`` (a ``core.limits.Limits``)
    sets the caps the port clips to; ``None`` means the contract's defaults. ``on_clip``
    hears the field name of every body the port clips (``semantics.clip_batch``).
    ``clock`` (seconds since the epoch) stamps when bodies are received: retention ranks
    a run by its event times capped at that (``sinks.retention``); tests inject it."""
    store = await _open_deep_store(url, limits, clock)
    store.on_clip = on_clip  # type: ignore[attr-defined]
    return store


async def open_stores(
    steps_url: str, deep_url: str, *, on_clip: Callable[[str], None] | None = None
) -> tuple[StepStore, DeepStore]:
    """Both stores, the step store first; when the deep store fails to open, the step
    store is closed again and the failure raised.

    One after the other on purpose: two SQLite writer processes making the schema of
    one new file at once can find it locked ("database is locked", seen under load)."""
    steps = await open_step_store(steps_url)
    try:
        deep = await open_deep_store(deep_url, on_clip=on_clip)
    except BaseException:
        await steps.close()
        raise
    return steps, deep


async def _open_deep_store(url: str, limits: Limits | None, clock: Callable[[], float]) -> DeepStore:
    scheme = _scheme(url)
    if scheme == "memory":
        from stepstream.sinks.memory import MemoryDeepStore

        return MemoryDeepStore(limits, clock)
    if scheme == "file":
        from stepstream.sinks.files import FileDeepStore, open_directory

        options = url_options(url, FILE_OPTIONS)
        return FileDeepStore(open_directory(_file_path(url), **options), limits, clock=clock, **options)
    if scheme == "sqlite":
        from stepstream.sinks.sqlite import SqliteDeepStore, sqlite_path

        return await SqliteDeepStore(sqlite_path(url), limits, clock=clock, **url_options(url, SQLITE_OPTIONS)).open()
    from stepstream.sinks.mongodb import MongoDeepStore

    return await MongoDeepStore(url, limits, clock=clock).open()
