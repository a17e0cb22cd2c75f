"""Open a store from its URL: the one place that knows every backend.

=========================  ==========================================================
``memory://[name]``        in-process dicts; every open is fresh and private
``file:///dir``            JSON lines in ``dir`` (``file://rel/dir`` is relative)
``sqlite:///path.db``      SQLite via aiosqlite (``sqlite:////abs/path.db``), default
``mongodb://host:port/db`` MongoDB or FerretDB via pymongo (extra ``[mongodb]``);
                           ``mongodb+srv://`` too
=========================  ==========================================================

Backends are imported only when their scheme is used, so the optional MongoDB
driver is needed only by ``mongodb://`` URLs (a :class:`ConfigError` says what
to install). Any other scheme is a :class:`ConfigError`.
"""

from __future__ import annotations

from urllib.parse import unquote

from stepstream.core.fold import Limits
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


async def open_step_store(url: str) -> StepStore:
    """The step store (steps, run records, run states) at ``url``, opened and ready."""
    scheme = _scheme(url)
    if scheme == "memory":
        from stepstream.sinks.memory import MemoryStepStore

        return MemoryStepStore()
    if scheme == "file":
        from stepstream.sinks.files import FileStepStore, open_directory

        return FileStepStore(open_directory(_file_path(url)))
    if scheme == "sqlite":
        from stepstream.sinks.sqlite import SqliteStepStore, sqlite_path

        return await SqliteStepStore(sqlite_path(url)).open()
    from stepstream.sinks.mongodb import MongoStepStore

    return await MongoStepStore(url).open()


async def open_deep_store(url: str, *, limits: Limits | None = None) -> DeepStore:
    """The deep store at ``url``, opened and ready. ``limits`` (a ``core.fold.Limits``)
    sets the caps the port clips to; ``None`` means the contract's defaults."""
    scheme = _scheme(url)
    if scheme == "memory":
        from stepstream.sinks.memory import MemoryDeepStore

        return MemoryDeepStore(limits)
    if scheme == "file":
        from stepstream.sinks.files import FileDeepStore, open_directory

        return FileDeepStore(open_directory(_file_path(url)), limits)
    if scheme == "sqlite":
        from stepstream.sinks.sqlite import SqliteDeepStore, sqlite_path

        return await SqliteDeepStore(sqlite_path(url), limits).open()
    from stepstream.sinks.mongodb import MongoDeepStore

    return await MongoDeepStore(url, limits).open()
