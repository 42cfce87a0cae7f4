"""Remote files held in memory while one piece of work uses them.

A batch worker scans a small remote file and then reads its concat coordinate and the
variables it digests. Fetched once with :func:`held_file`, the file serves the scan's
metadata reads (:class:`~refgrid.scan.source.Source`) and those chunk reads
(:mod:`refgrid.read.fetch`) from memory: one request per file instead of one per step.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from refgrid.sources import SourceIdentity

_held: dict[str, tuple[bytes, SourceIdentity]] = {}
_lock = threading.Lock()


@contextmanager
def held_file(url: str, data: bytes, identity: SourceIdentity) -> Iterator[None]:
    """Within the block, reads of ``url`` (in this process) are served from ``data``."""
    with _lock:
        _held[url] = (data, identity)
    try:
        yield
    finally:
        with _lock:
            _held.pop(url, None)


def held(url: str) -> tuple[bytes, SourceIdentity] | None:
    """The bytes and identity of ``url`` if it is held, else ``None``."""
    return _held.get(url)
