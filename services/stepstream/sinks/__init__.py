"""Where steps, deep companions, run records and run states live (CONTRACT.md section 3).

Open a store by URL with :func:`open_step_store` / :func:`open_deep_store`; the
ports they return are the Protocols in :mod:`stepstream.sinks.ports`. Backends:
``memory`` (the reference and test fake), ``files``, ``sqlite`` (the embedded
default) and ``mongodb`` (optional extra). See ``docs/sinks.md``.
"""

from typing import TYPE_CHECKING

from stepstream.lazy import exports

if TYPE_CHECKING:
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

# Imported when first read (stepstream.lazy): a SQLite writer process imports
# stepstream.sinks.sqlite_operations without every backend and its drivers.
__getattr__, __dir__ = exports(
    globals(),
    {
        "open_deep_store": "factory", "open_step_store": "factory", "open_stores": "factory",
        "Capabilities": "ports", "DeepStore": "ports", "InvalidCursor": "ports", "RetentionStore": "ports",
        "RunFilter": "ports", "RunsPage": "ports", "StepStore": "ports",
    },
)  # fmt: skip

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
