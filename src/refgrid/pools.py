"""Process-wide thread pools, made on first use and anew in a forked child (whose threads
are gone)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

_pools: dict[str, tuple[int, ThreadPoolExecutor]] = {}
_lock = threading.Lock()


def thread_pool(name: str, workers: int) -> ThreadPoolExecutor:
    """The pool called ``name`` (its threads are named after it)."""
    with _lock:
        found = _pools.get(name)
        if found is None or found[0] != os.getpid():
            found = _pools[name] = (os.getpid(), ThreadPoolExecutor(workers,
                                                                    thread_name_prefix=name))
        return found[1]
