"""``stepstream.core`` and ``stepstream.sinks`` import a name's module when the name is
first read (``stepstream.lazy``): every exported name still resolves to its module's
object, and a SQLite writer process starts without the fold, the redactor or asyncio."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PACKAGES = ["stepstream.core", "stepstream.sinks"]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_is_its_modules_object(package):
    module = importlib.import_module(package)
    names = module.__all__
    assert names, package
    for name in names:
        value = getattr(module, name)
        defining = getattr(value, "__module__", None)
        if defining and defining.startswith(package + "."):
            assert getattr(importlib.import_module(defining), name) is value, name
    assert set(names) <= set(dir(module))


@pytest.mark.parametrize("package", PACKAGES)
def test_an_unknown_name_is_an_attribute_error(package):
    module = importlib.import_module(package)
    with pytest.raises(AttributeError, match="no_such_name"):
        module.no_such_name  # noqa: B018


def test_from_import_of_a_submodule_still_gives_the_module():
    from stepstream.core import redact, wire

    assert redact.__name__ == "stepstream.core.redact" and callable(redact.redact)
    assert wire.__name__ == "stepstream.core.wire"


def test_the_sqlite_writer_child_imports_only_its_operations():
    probe = (
        "import sys, stepstream.sinks.sqlite_writer\n"
        "heavy = ['asyncio', 'ssl', 'stepstream.core.fold', 'stepstream.core.credentials', 'stepstream.core.wire',\n"
        "         'stepstream.sinks.factory', 'stepstream.sinks.mongodb', 'stepstream.sinks.sqlite']\n"
        "print(' '.join(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "", f"the writer's child imports {done.stdout.strip()}"
