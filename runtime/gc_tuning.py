"""The garbage collector's settings for a process that streams records.

Capture's loop makes several short-lived objects per change (frames, records, header
lists, delivery callbacks) and keeps a few per record in flight until Kafka
acknowledges it. With CPython's default thresholds (700, 10, 10) that meant a young
collection every ~100 changes and a full one every ~30,000, each full one walking
every object made at start-up (modules, settings, clients): measured in the drain
bench (``bench/capture_drain.py``), 1.15 s of 21 s of the loop's CPU, 5 %.

So, once start-up is done:

- :func:`gc.freeze` moves what exists into the permanent generation, which the
  collector never walks again: it lives as long as the process anyway;
- the young generation is collected after 50,000 allocations rather than 700. Almost
  everything the loop makes is freed by reference counting long before that; a young
  collection then finds little and costs about as much as before, 70 times less often.
  The middle generation is collected after 20 young collections, the oldest after 10
  of the middle one.

Reference cycles are still collected, only later: at most the objects of 50,000
allocations wait, a few megabytes. Reference counting, which frees nearly all of the
loop's objects, is unaffected.

Only entry points call this: it changes the whole interpreter, so a library (or a test
process that runs a service in-process) keeps the defaults.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
"""Allocations (minus deallocations) of tracked objects between young collections."""
OLDER_THRESHOLDS = (20, 10)
"""Collections of the generation below between those of the middle and of the oldest."""


def tune_for_streaming() -> None:
    """Freeze what start-up made and collect the young generation less often."""
    gc.collect()  # garbage from start-up is freed, not frozen
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
