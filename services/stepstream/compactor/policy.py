"""The retention policy: what a compactor pass keeps, drops and closes. Pure (no I/O
beyond reading the overrides file once, at the edge).

* **Deep retention** keeps the bodies of the newest ``deep_runs`` runs of each
  company, ranked by :attr:`~stepstream.sinks.ports.DeepRun.rank` (the run's event
  times capped at when the store received them), and drops whole runs past them.
* **Deep TTL** (off by default): bodies of runs whose rank is older than
  ``deep_ttl_seconds`` go too.
* **Step TTL** (off by default): whole runs (steps, run record, state and bodies)
  whose last activity is older than ``step_ttl_seconds`` are deleted.
* **Abandoned runs**: a ``running`` run with no activity for ``abandon_after_seconds``
  (default one hour; 0 turns it off) gets a ``run_close``.

*Activity* is the time the deep store last received a body for the run
(``DeepRun.received_at``), else the run's ``last_event_at`` / ``started_at``
(agent clocks; only for runs that never stored a body).

Per-company overrides come from a TOML file::

    [defaults]                 # optional: overrides the flags' defaults
    deep_runs = 50

    [companies.acme]           # any of deep_runs, deep_ttl_seconds, step_ttl_seconds,
    deep_runs = 200            # abandon_after_seconds
    deep_ttl_seconds = 604800
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Annotated

import msgspec

from stepstream.core.records import RunRecord
from stepstream.core.timefmt import parse_ts
from stepstream.errors import ConfigError
from stepstream.sinks.ports import DeepRun

__all__ = ["CompanyPolicy", "Overrides", "RetentionPolicy", "activity", "choose_pruned", "is_idle", "load_policy"]

NonNegative = Annotated[float, msgspec.Meta(ge=0)]


class CompanyPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The limits for one company. A TTL or ``abandon_after_seconds`` of 0 is off."""

    deep_runs: Annotated[int, msgspec.Meta(ge=0)] = 50
    deep_ttl_seconds: NonNegative = 0.0
    step_ttl_seconds: NonNegative = 0.0
    abandon_after_seconds: NonNegative = 3600.0


class Overrides(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Any subset of :class:`CompanyPolicy`'s fields (the TOML tables)."""

    deep_runs: Annotated[int, msgspec.Meta(ge=0)] | None = None
    deep_ttl_seconds: NonNegative | None = None
    step_ttl_seconds: NonNegative | None = None
    abandon_after_seconds: NonNegative | None = None

    def over(self, base: CompanyPolicy) -> CompanyPolicy:
        given = {k: v for k, v in msgspec.structs.asdict(self).items() if v is not None}
        return msgspec.structs.replace(base, **given)


class _File(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    defaults: Overrides = Overrides()
    companies: dict[str, Overrides] = {}


class RetentionPolicy(msgspec.Struct, frozen=True):
    """The default policy and the per-company ones."""

    default: CompanyPolicy = CompanyPolicy()
    companies: dict[str, CompanyPolicy] = {}

    def for_company(self, company_id: str) -> CompanyPolicy:
        return self.companies.get(company_id, self.default)


def load_policy(base: CompanyPolicy, path: str | Path | None) -> RetentionPolicy:
    """``base`` (from flags and ``STEPSTREAM_*``) with the file's overrides on top.
    Raises :class:`ConfigError` naming the file and what is wrong in it."""
    if not path:
        return RetentionPolicy(base)
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        parsed = msgspec.convert(data, _File)
    except (OSError, tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(f"retention file {path}: {exc}") from None
    default = parsed.defaults.over(base)
    return RetentionPolicy(default, {company: o.over(default) for company, o in parsed.companies.items()})


def _age(text: str, now: float) -> float:
    return now - parse_ts(text).timestamp()


def choose_pruned(index: Sequence[DeepRun], policy: CompanyPolicy, now: float) -> list[DeepRun]:
    """The runs whose bodies this pass drops: past the newest ``deep_runs`` of the
    company, or (with a deep TTL) ranked older than it. Never a run already marked.
    ``index`` is ordered as ``retention_index`` returns it (highest rank first)."""
    live = [r for r in index if r.pruned_at is None and r.bodies > 0]
    dropped = live[policy.deep_runs :]
    if policy.deep_ttl_seconds > 0:
        dropped = [r for r in live[: policy.deep_runs] if _age(r.rank, now) > policy.deep_ttl_seconds] + dropped
    return dropped


def activity(run: RunRecord, entry: DeepRun | None) -> datetime | None:
    """When the run was last active (module docstring), or ``None`` if unknown."""
    if entry is not None and entry.received_at:
        return parse_ts(entry.received_at)
    text = run.last_event_at or run.started_at
    return parse_ts(text) if text else None


def is_idle(run: RunRecord, entry: DeepRun | None, seconds: float, now: float) -> bool:
    """Whether the run saw no activity for ``seconds`` (a time in the future is not idle)."""
    last = activity(run, entry)
    return last is not None and now - last.timestamp() >= seconds
