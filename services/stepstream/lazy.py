"""Package attributes imported on first use (PEP 562).

``stepstream.core`` and ``stepstream.sinks`` re-export names from their modules. Importing
those modules eagerly made every import of one submodule pay for all of them: a SQLite
writer process, which needs only the row operations, imported the fold, the redactor (its
RE2 sets compiled), every sink and asyncio's TLS support before it could answer, about
0.2 s of the 0.27 s it took to start. :func:`exports` gives a package the module-level
``__getattr__`` and ``__dir__`` that import a name's module when the name is first read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def exports(
    namespace: dict[str, Any], names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the package whose ``globals()`` are ``namespace``,
    where ``names`` maps each exported name to the submodule (relative to the package)
    that defines it."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value  # found once; later reads do not come here
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
