"""A bundle as a POSIX tar stream: ``<run_id>.sftrace/<file>`` entries, so a route can
stream it (``GET .../trace.sftrace``) from the files a :class:`~stepstream.bundle.build.BundleWriter`
wrote, a chunk at a time: the stream never holds a whole file."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable, Iterator
from typing import IO

from stepstream.bundle.build import Bundle

__all__ = ["CHUNK_BYTES", "bundle_entries", "tar_chunks"]

_BLOCK = 512
CHUNK_BYTES = 1 << 20

Entry = tuple[str, int, IO[bytes]]  # name, size, a readable file positioned at its start


def _header(name: str, size: int, mtime: int, directory: bool = False) -> bytes:
    info = tarfile.TarInfo(name)
    if directory:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    else:
        info.size, info.mode = size, 0o644
    info.mtime = mtime
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def tar_chunks(entries: Iterable[Entry], top: str, mtime: int = 0) -> Iterator[bytes]:
    """The tar of ``entries`` under the directory ``top`` (``<run_id>.sftrace``): a
    header per file, then its bytes in chunks of at most :data:`CHUNK_BYTES`. A file
    that holds fewer bytes than its size is an error (the tar would be corrupt)."""
    yield _header(top, 0, mtime, directory=True)
    for name, size, fh in entries:
        yield _header(f"{top}/{name}", size, mtime)
        left = size
        while left:
            chunk = fh.read(min(left, CHUNK_BYTES))
            if not chunk:
                raise OSError(f"bundle file {name} ended {left} bytes short")
            left -= len(chunk)
            yield chunk
        pad = -size % _BLOCK
        if pad:
            yield b"\0" * pad
    yield b"\0" * (2 * _BLOCK)


def bundle_entries(bundle: Bundle) -> list[Entry]:
    """The entries of an in-memory bundle."""
    return [(name, len(data), io.BytesIO(data)) for name, data in bundle.files.items()]
