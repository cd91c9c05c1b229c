"""A serving process sets start-up's objects aside from the garbage collector
(`service.collector`): its oldest-generation collections, each a stop of
the event loop, walk only what the service built since. Run in a child
process: freezing is for the whole process, and this one runs many tests."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.helpers import REPO

_CHILD = """
import gc, json, weakref
import dispatcher.service.core, apirunner.runner, webrunner.runner  # start-up's imports
from dispatcher.service.collector import settle_after_start

before = len(gc.get_objects(generation=2))
frozen = settle_after_start()
after = len(gc.get_objects(generation=2))

class Node:
    pass

# A cycle made after settling is still garbage the collector finds.
a, b = Node(), Node()
a.other, b.other = b, a
gone = weakref.ref(a)
del a, b
gc.collect()
freed = gone() is None
print(json.dumps({"before": before, "frozen": frozen, "after": after, "cycle_freed": freed}))
"""


def test_settling_sets_start_up_aside_and_later_cycles_are_still_collected() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # The imports alone are tens of thousands of objects in the oldest generation.
    assert seen["frozen"] >= seen["before"] > 20_000, seen
    # Left for collections to walk: a small fraction of what start-up built.
    assert seen["after"] < seen["frozen"] // 100, seen
    assert seen["cycle_freed"], seen
