"""``stepstream purge --company C [--run R]``: destroy bodies, never steps.

Counts first (from the retention index), asks for confirmation unless ``--yes``
(on a terminal: type the company id; without a terminal it refuses), then calls
the deep port: ``purge_run(company, run) -> int`` for each run, with a progress
bar on stderr, and for a whole company a final ``purge_company(company) -> int``
that takes whatever was written meanwhile. The read API's purge routes call the
same two port methods. ``--dry-run`` only counts.
"""

from __future__ import annotations

import sys
from typing import IO

import msgspec
from tqdm import tqdm

from stepstream.metrics import Metrics
from stepstream.sinks import open_deep_store


class PurgeReport(msgspec.Struct):
    runs: int = 0
    bodies: int = 0
    destroyed: int = 0
    dry_run: bool = False
    confirmed: bool = True


async def purge(
    deep_url: str,
    company: str,
    run: str | None = None,
    *,
    dry_run: bool = False,
    yes: bool = False,
    progress: bool = True,
    stdin: IO[str] | None = None,
    stderr: IO[str] | None = None,
    metrics: Metrics | None = None,
) -> PurgeReport:
    stdin = stdin if stdin is not None else sys.stdin
    stderr = stderr if stderr is not None else sys.stderr
    deep = await open_deep_store(deep_url)
    try:
        index = [r for r in await deep.retention_index(company) if r.bodies > 0 and (run is None or r.run_id == run)]
        report = PurgeReport(runs=len(index), bodies=sum(r.bodies for r in index), dry_run=dry_run)
        what = f"run {company}/{run}" if run is not None else f"company {company}"
        print(f"purge: {what}: {report.bodies} bodies in {report.runs} runs (steps are kept)", file=stderr)
        if dry_run:
            return report
        if not yes:
            if not stdin.isatty():
                print("purge: not a terminal; pass --yes to purge without confirmation", file=stderr)
                report.confirmed = False
                return report
            print(f"purge: type the company id ({company}) to destroy these bodies: ", end="", file=stderr, flush=True)
            if stdin.readline().strip() != company:
                print("purge: not confirmed; nothing destroyed", file=stderr)
                report.confirmed = False
                return report
        with tqdm(total=report.bodies, unit="bodies", desc="purge", file=stderr, disable=not progress) as bar:
            for entry in index:
                gone = await deep.purge_run(company, entry.run_id)
                report.destroyed += gone
                bar.update(gone)
            if run is None:
                report.destroyed += await deep.purge_company(company)
            elif not index:
                report.destroyed += await deep.purge_run(company, run)
        if metrics is not None:
            metrics.bodies_purged.labels("purge").inc(report.destroyed)
        return report
    finally:
        await deep.close()
