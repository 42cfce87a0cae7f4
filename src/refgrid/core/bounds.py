"""Bounds on the work an input may ask for, checked before anything is allocated.

A 500-byte reference file can declare 10^8 chunks, a generator of 10^10 keys, a 10^15-element
chunk or a zlib bomb. refgrid refuses such inputs with a named error instead of running out
of memory or time. The defaults admit every real archive seen (10^7 chunks per array, chunks
of a few hundred MiB); raise them for larger ones:

    refgrid.set_limits(max_chunks=10**9)            # for the rest of the process
    with refgrid.limits(max_chunk_bytes=2**34): ...  # for a block, in this thread or task

or with the environment variables ``REFGRID_MAX_CHUNKS``, ``REFGRID_MAX_CHUNK_BYTES``,
``REFGRID_MAX_VARIABLE_CHUNK_BYTES``, ``REFGRID_MAX_REFERENCES``, ``REFGRID_MAX_URL_LENGTH``
and ``REFGRID_SCAN_TIMEOUT``, and
remote reads' ``REFGRID_CONNECT_TIMEOUT``, ``REFGRID_READ_TIMEOUT``, ``REFGRID_ATTEMPTS`` and
``REFGRID_RETRY_SECONDS`` (:mod:`refgrid.core.network`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields, replace
from typing import Any

from refgrid.errors import ArgumentError

STALL_ATTEMPTS = 2
"""Attempts of a remote request that timed out (:mod:`refgrid.core.network`): a server that
stalled once mostly stalls again, and each attempt costs a whole ``read_timeout``, where a
503 answers at once."""


@dataclass(frozen=True)
class Limits:
    max_chunks: int = 2**26
    """Chunks along one dimension of an array's grid, and in an array whose references are
    held whole (a manifest costs 20 bytes a chunk: 1.3 GiB at most). A parquet archive read
    page by page may hold more: its record files are loaded as reads need them."""
    max_chunk_bytes: int = 2**31
    """Decoded bytes of one chunk: a chunk claiming more is refused before decoding."""
    max_variable_chunk_bytes: int = 2**23
    """Decoded bytes of one chunk of variable-length strings or bytes, whose size no header
    states: a decompression bomb stops here (raise it for archives of longer texts)."""
    max_references: int = 10**8
    """Keys a reference set's generators (``gen``) may expand to."""
    max_url_length: int = 8192
    """Characters of one reference URL after templates are applied."""
    scan_timeout: float = 600.0
    """Seconds one file's scan may take in the CLI and in ``refgrid batch`` (run in a child
    process there, which is stopped when it passes: a stalled server, a hung libhdf5)."""
    connect_timeout: float = 10.0
    """Seconds to wait for a connection to a remote source (HTTP, S3)."""
    read_timeout: float = 30.0
    """Seconds a remote source may send nothing before the request is given up."""
    attempts: int = 4
    """Attempts of a request that fails transiently (HTTP 429/5xx, reset, timeout)."""
    retry_seconds: float = 60.0
    """No retry starts this long after a request's first attempt."""


def _from_environment() -> Limits:
    changes: dict[str, Any] = {}
    for f in fields(Limits):
        value = os.environ.get(f"REFGRID_{f.name.upper()}")
        if value:
            try:
                changes[f.name] = float(value) if f.type in ("float", float) else int(value)
            except ValueError:
                raise ArgumentError(f"REFGRID_{f.name.upper()}={value!r} is not a number") \
                    from None
    return Limits(**changes)


_default = _from_environment()
"""The process's limits: the environment's, changed by :func:`set_limits`."""
_block: ContextVar[Limits | None] = ContextVar("refgrid_limits", default=None)
"""The limits of an enclosing ``with limits(...)`` block: a context variable, so a block
holds for its own thread or asyncio task (and the work refgrid's thread pools do for it,
which runs in a copy of its context), never for another thread's."""


def current() -> Limits:
    """The limits in force here."""
    return _block.get() or _default


def set_limits(**changes: Any) -> Limits:
    """Change limits for the rest of the process (every thread); returns the previous ones."""
    global _default
    previous = _default
    _default = _changed(_default, changes)
    return previous


@contextmanager
def limits(**changes: Any) -> Iterator[Limits]:
    """Change limits inside a ``with`` block, for this thread or task only."""
    token = _block.set(_changed(current(), changes))
    try:
        yield current()
    finally:
        _block.reset(token)


def _changed(base: Limits, changes: dict[str, Any]) -> Limits:
    try:
        return replace(base, **changes)
    except TypeError as e:
        raise ArgumentError(f"unknown limit: {e}; limits are "
                            f"{[f.name for f in fields(Limits)]}") from e
