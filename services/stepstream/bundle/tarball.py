"""A bundle as a POSIX tar stream: ``<run_id>.sftrace/<file>`` entries, one chunk per
header and per file, so a route can stream it (``GET .../trace.sftrace``)."""

from __future__ import annotations

import tarfile
from collections.abc import Iterator

from stepstream.bundle.build import Bundle

__all__ = ["tar_chunks"]

_BLOCK = 512


def tar_chunks(bundle: Bundle, top: str, mtime: int = 0) -> Iterator[bytes]:
    """The tar of ``bundle`` under the directory ``top`` (``<run_id>.sftrace``)."""
    info = tarfile.TarInfo(top)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
    yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    for name, data in bundle.files.items():
        info = tarfile.TarInfo(f"{top}/{name}")
        info.size, info.mode, info.mtime = len(data), 0o644, mtime
        yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        yield data
        pad = -len(data) % _BLOCK
        if pad:
            yield b"\0" * pad
    yield b"\0" * (2 * _BLOCK)
