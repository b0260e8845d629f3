"""The garbage collector's streaming settings, in a process of their own: they change
the whole interpreter, which a test must not do to the suite's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from runtime import gc_tuning

_PROBE = """
import gc, json, weakref
start_up = [object() for _ in range(10)]
from runtime import gc_tuning
gc_tuning.tune_for_streaming()
frozen = gc.get_freeze_count()
class Node:
    pass
a, b = Node(), Node()
a.other, b.other = b, a  # a cycle: only the collector frees it
gone = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({"threshold": gc.get_threshold(), "frozen": frozen, "cycle": gone() is None}))
"""


def test_start_up_objects_are_frozen_young_collections_are_rarer_and_cycles_still_go() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[3],  # where ``runtime`` imports from
    )
    seen = json.loads(result.stdout)
    assert seen["threshold"] == [gc_tuning.YOUNG_THRESHOLD, *gc_tuning.OLDER_THRESHOLDS]
    assert seen["frozen"] > 1000  # the interpreter's and the modules' objects
    assert seen["cycle"] is True
