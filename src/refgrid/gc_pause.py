"""Pausing Python's cyclic garbage collector around bulk creation of small objects.

Building 10^6 acyclic objects (selection pieces, h5py's per-chunk records) triggers repeated
collector passes over all of them, costing more than the construction itself.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
