"""``stepstream export --company C --run R -o DIR``: a run's bundle, written to disk.

Reads the run record and step ordinals from the step store and the bodies and
envelopes from the deep store, builds the bundle (``bundle.build``) and writes it
into a fresh directory: ``DIR`` itself when it ends with ``.sftrace``, else
``DIR/<run_id>.sftrace``. The files go to a temporary sibling first and the
directory is renamed into place, so a reader never sees half a bundle; an
existing non-empty target is refused.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from stepstream.bundle.build import Bundle, BundleRefused, build_bundle
from stepstream.sinks.factory import open_deep_store, open_step_store

__all__ = ["bundle_path", "export_run", "write_bundle"]


def bundle_path(out: Path, run_id: str) -> Path:
    return out if out.suffix == ".sftrace" else out / f"{run_id}.sftrace"


def write_bundle(bundle: Bundle, target: Path) -> Path:
    """Write ``bundle`` as the directory ``target`` (module docstring)."""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{target} exists and is not an empty directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for name, data in bundle.files.items():
            with open(tmp / name, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        if target.exists():
            target.rmdir()
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


async def export_run(steps_url: str, deep_url: str, company_id: str, run_id: str, out: Path) -> tuple[Path, Bundle]:
    """Export one run. Raises :class:`BundleRefused` (no such run, pruned, purged)."""
    steps = await open_step_store(steps_url)
    try:
        run = await steps.get_run(company_id, run_id)
        if run is None:
            raise BundleRefused("unknown", f"no run {run_id} of company {company_id}")
        step_seqs = [s.step_seq for s in await steps.get_steps(company_id, run_id)]
    finally:
        await steps.close()
    deep = await open_deep_store(deep_url)
    try:
        deeps = await deep.get_deep(company_id, run_id)
    finally:
        await deep.close()
    bundle = build_bundle(run, deeps, company_id=company_id, step_seqs=step_seqs)
    return write_bundle(bundle, bundle_path(out, run_id)), bundle
