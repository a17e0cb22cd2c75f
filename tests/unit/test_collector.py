"""stepstream.collector: the data-plane processes' collector settings (in a child
process, so this test process keeps CPython's defaults)."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import gc, json, weakref
from stepstream import collector
before = gc.get_freeze_count()
collector.tune()
class Node:
    pass
a, b = Node(), Node()
a.other, b.other = b, a  # a cycle made after tune: still collected
alive = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({"threshold": gc.get_threshold(), "enabled": gc.isenabled(), "frozen_before": before,
                  "frozen": gc.get_freeze_count(), "cycle_freed": alive() is None}))
"""


def test_tune_raises_the_thresholds_freezes_startup_and_still_collects_cycles() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=60)
    seen = json.loads(out.stdout)
    from stepstream import collector

    assert seen["threshold"] == [collector.YOUNG, collector.MIDDLE_EVERY, collector.FULL_EVERY]
    assert collector.YOUNG > 700  # above CPython's default, or the setting does nothing
    assert seen["enabled"] is True
    assert seen["frozen_before"] == 0 and seen["frozen"] > 1000  # the imported modules at least
    assert seen["cycle_freed"] is True
