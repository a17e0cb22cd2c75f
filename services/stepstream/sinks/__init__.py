"""Where steps, deep companions, run records and run states live (CONTRACT.md section 3).

Open a store by URL with :func:`open_step_store` / :func:`open_deep_store`; the
ports they return are the Protocols in :mod:`stepstream.sinks.ports`. Backends:
``memory`` (the reference and test fake), ``files``, ``sqlite`` (the embedded
default) and ``mongodb`` (optional extra). See ``docs/sinks.md``.
"""

from stepstream.sinks.factory import open_deep_store, open_step_store, open_stores
from stepstream.sinks.ports import (
    Capabilities,
    DeepStore,
    InvalidCursor,
    RetentionStore,
    RunFilter,
    RunsPage,
    StepStore,
)

__all__ = [
    "Capabilities",
    "DeepStore",
    "InvalidCursor",
    "RetentionStore",
    "RunFilter",
    "RunsPage",
    "StepStore",
    "open_deep_store",
    "open_step_store",
    "open_stores",
]
