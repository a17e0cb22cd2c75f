"""``stepstream export --company C --run R -o DIR``: a run's bundle, written to disk.

Reads the run record and step ordinals from the step store and the bodies and
envelopes from the deep store, a page at a time (:func:`write_from_stores`, which
the API's bundle route uses too), builds the bundle (``bundle.build``) and writes it
into a fresh directory: ``DIR`` itself when it ends with ``.sftrace``, else
``DIR/<run_id>.sftrace``. The files go to a temporary sibling first and the
directory is renamed into place, so a reader never sees half a bundle; an
existing non-empty target is refused.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import IO, Any

from stepstream.bundle.build import Bundle, BundleRefused, BundleStats, BundleWriter, check_exportable, created_time
from stepstream.core.records import DeepRecord
from stepstream.sinks.factory import open_deep_store, open_step_store
from stepstream.sinks.ports import DeepStore, StepStore

__all__ = ["PAGE_ROWS", "bundle_path", "export_run", "write_bundle", "write_from_stores"]

# Deep rows read and built at a time: at the caps a row holds up to about 200,000
# characters (reasoning or output, arguments, params), so a page is a few MB.
PAGE_ROWS = 16
_STEP_PAGE = 200  # step ordinals read at a time (to refuse a run with bodies missing)
Offload = Callable[..., Awaitable[Any]]


async def write_from_stores(
    steps: StepStore,
    deep: DeepStore,
    company_id: str,
    run_id: str,
    open_file: Callable[[str], IO[bytes]],
    *,
    page: int = PAGE_ROWS,
    offload: Offload = asyncio.to_thread,
) -> BundleStats:
    """Build the run's bundle into ``open_file(name)`` files, reading its bodies
    ``page`` rows at a time (``DeepStore.get_deep`` ranges) and building each page
    with ``offload`` (a thread by default: redaction and hashing are CPU work).
    Memory holds one page, whatever the run's size. Raises :class:`BundleRefused`
    (``unknown``, ``pruned``, ``purged``, ``empty``) and ``CanonicalError``.

    The pages are read one after the other, not as one snapshot: a body written
    while the bundle is built may or may not be in it (each row is whole)."""
    run = await steps.get_run(company_id, run_id)
    if run is None:
        raise BundleRefused("unknown", f"no run {run_id} of company {company_id}")
    check_exportable(run)
    first_ts = None
    if run.started_at is None:  # rare (no run_start arrived): the earliest body's time, one more pass
        async for rows in _pages(deep, company_id, run_id, page):
            first_ts = min([first_ts or rows[0].ts, *(d.ts for d in rows)])
    writer = BundleWriter(run, company_id=company_id, created_at=created_time(run, first_ts), open_file=open_file)
    async for rows in _pages(deep, company_id, run_id, page):
        await offload(writer.add, rows)
    seqs: list[int] = []
    after = None
    while True:
        batch = await steps.get_steps(company_id, run_id, after=after, limit=_STEP_PAGE)
        seqs += [s.step_seq for s in batch]
        if len(batch) < _STEP_PAGE:
            break
        after = batch[-1].step_seq
    return await offload(writer.finish, seqs)


async def _pages(deep: DeepStore, company_id: str, run_id: str, page: int) -> AsyncIterator[list[DeepRecord]]:
    after = None
    while True:
        rows = await deep.get_deep(company_id, run_id, after=after, limit=page)
        if rows:
            yield rows
        if len(rows) < page:
            return
        after = rows[-1].step_seq


def bundle_path(out: Path, run_id: str) -> Path:
    return out if out.suffix == ".sftrace" else out / f"{run_id}.sftrace"


def write_bundle(bundle: Bundle, target: Path) -> Path:
    """Write ``bundle`` as the directory ``target`` (module docstring)."""
    _check_target(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for name, data in bundle.files.items():
            with open(tmp / name, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        _move_into_place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _check_target(target: Path) -> None:
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{target} exists and is not an empty directory")
    target.parent.mkdir(parents=True, exist_ok=True)


def _move_into_place(tmp: Path, target: Path) -> None:
    if target.exists():
        target.rmdir()
    tmp.rename(target)


async def export_run(
    steps_url: str, deep_url: str, company_id: str, run_id: str, out: Path
) -> tuple[Path, BundleStats]:
    """Export one run, a page of bodies at a time, straight into the target's
    temporary directory. Raises :class:`BundleRefused` (no such run, pruned, purged)."""
    target = bundle_path(out, run_id)
    _check_target(target)
    steps = await open_step_store(steps_url)
    try:
        deep = await open_deep_store(deep_url)
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
            files: list[IO[bytes]] = []

            def open_file(name: str) -> IO[bytes]:
                files.append(open(tmp / name, "wb"))  # noqa: SIM115 (closed below)
                return files[-1]

            try:
                stats = await write_from_stores(steps, deep, company_id, run_id, open_file)
                for fh in files:
                    fh.flush()
                    os.fsync(fh.fileno())
                    fh.close()
                _move_into_place(tmp, target)
            except BaseException:
                for fh in files:
                    fh.close()
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        finally:
            await deep.close()
    finally:
        await steps.close()
    return target, stats
