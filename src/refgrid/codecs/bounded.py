"""Decompression that never produces more than a chunk can hold.

A reference set is untrusted input: a 1 MB stream may inflate to gigabytes (a bomb) in an
array whose chunks hold 40 bytes. Every decoder here is given the most bytes the chunk may
decode to and refuses past it — streaming decompressors (zlib, gzip, bz2, lzma) stop at
the limit, fixed-buffer ones (zstd) decode into a buffer of that size, and formats whose
header states the decoded size (blosc, numcodecs' lz4, HDF5's lz4 and bitshuffle framing)
are refused from the header before anything is allocated. Peak memory is then bounded by
the chunk's size, not by what the stream claims.
"""

from __future__ import annotations

import bz2
import lzma
import os
import struct
import threading
import zlib
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Literal

import imagecodecs

from refgrid.core.bounds import current
from refgrid.core.typed import Bytes, Untyped, as_buffer

SLACK = 4096
"""Bytes a stage may produce beyond the chunk's decoded size (checksums that later stages
strip)."""


class TooLarge(ValueError):
    """A stream decodes to more than its chunk can hold."""


Bound = Literal["exact", "scaled", "variable"]
"""How well a chunk's decoded size is known: ``exact`` (fixed-size values: its shape times the
item size), ``scaled`` (numcodecs filters that change the size by small factors) or
``variable`` (variable-length strings and bytes: no header states it)."""
SCALE = 8
"""How much numcodecs filters may grow a chunk (``astype`` to a wider type, say)."""


def limit_for(nbytes: int, bound: Bound) -> int:
    """The most bytes a decoding stage may produce for a chunk of ``nbytes`` decoded bytes
    (of its element type; 8 a value for variable-length ones): that plus :data:`SLACK`
    when the size is exact; :data:`SCALE` times it for filters that change sizes; for
    variable-length values the ``max_variable_chunk_bytes`` limit (a bomb of a text chunk
    is refused at a few MiB, not at the 2 GiB any chunk may decode to). Never more than
    ``max_chunk_bytes``."""
    limits = current()
    if bound == "exact":
        return nbytes + SLACK
    if bound == "scaled":
        return min(SCALE * nbytes + SLACK, max(nbytes + SLACK, limits.max_chunk_bytes))
    return min(max(nbytes + SLACK, limits.max_variable_chunk_bytes), limits.max_chunk_bytes)


def _refuse(limit: int) -> TooLarge:
    return TooLarge(f"decodes to more than {limit:,} bytes, more than the chunk holds "
                    "(refused before decompressing further)")


DEFLATE_MAX_RATIO = 1032
"""The most bytes one byte of a deflate stream can inflate to (258 bytes for a 2-bit code)."""


ONE_CALL_BYTES = 2**20
"""A deflate stream that cannot inflate to more than this is inflated in one call."""


def inflate(data: Bytes, limit: int, wbits: int = zlib.MAX_WBITS) -> bytes:
    """zlib (or, with ``wbits=16 + MAX_WBITS``, gzip), refused beyond ``limit`` bytes. A
    stream too short to inflate to more than ``max(limit, ONE_CALL_BYTES)`` whatever it
    holds is inflated in one call, then checked (a third faster for the small chunks of HDF5
    files, most of them; the memory it may take is bounded all the same); a longer one
    stops at the limit."""
    if len(data) * DEFLATE_MAX_RATIO <= max(limit, ONE_CALL_BYTES):
        out = zlib.decompress(data, wbits)
        if len(out) > limit:
            raise _refuse(limit)
        return out
    inflater = zlib.decompressobj(wbits)
    out = inflater.decompress(data, limit)
    if inflater.unconsumed_tail or (not inflater.eof and inflater.decompress(b"", 1)):
        raise _refuse(limit)
    if not inflater.eof:
        raise ValueError("truncated stream")
    return out


def inflate_many(chunks: Sequence[Bytes], limit: int) -> list[bytes]:
    """zlib streams each refused beyond ``limit`` bytes, as :func:`inflate` — many at once.
    When none of them can inflate to more than ``max(limit, ONE_CALL_BYTES)`` (the small
    chunks of HDF5 files, most of them), they are inflated by one C-level loop and their
    sizes checked after: no Python frame runs per chunk. Tiny chunks (:data:`TINY_LIMIT`)
    are inflated by one thread at a time (:data:`_TINY_INFLATES`)."""
    if chunks and max(map(len, chunks)) * DEFLATE_MAX_RATIO <= max(limit, ONE_CALL_BYTES):
        with _TINY_INFLATES if limit <= TINY_LIMIT else nullcontext():
            out = list(map(zlib.decompress, chunks))
        if max(map(len, out)) > limit:
            raise _refuse(limit)
        return out
    return [inflate(data, limit) for data in chunks]


TINY_LIMIT = 8192
"""Chunks inflating to at most this many bytes (with :data:`SLACK`: 4 KiB of values) are
tiny: inflating one takes a few microseconds."""
_TINY_INFLATES = threading.Lock()
"""Held while a batch of tiny chunks is inflated. ``zlib.decompress`` releases the
interpreter lock for every call; two threads doing microsecond-long calls each take it
back from the other 10^5 times and run slower together than one alone (187k chunks of a
file: 0.45 s in one thread, 0.59 s in two). With this lock one thread inflates while the
others fetch, unshuffle and copy (which run without the interpreter lock): the full read
of that file ~15% faster on two cores."""


def _unlocked_in_child() -> None:  # a fork while another thread held it
    global _TINY_INFLATES
    _TINY_INFLATES = threading.Lock()


os.register_at_fork(after_in_child=_unlocked_in_child)


def _streaming(make: Callable[[], Untyped]) -> Callable[[Bytes, int], bytes]:
    def decode(data: Bytes, limit: int) -> bytes:
        decompressor = make()
        out = decompressor.decompress(bytes(data), max_length=limit + 1)
        if len(out) > limit:
            raise _refuse(limit)
        if not decompressor.eof:
            raise ValueError("truncated stream")
        return bytes(out)
    return decode


def _zstd(data: Bytes, limit: int) -> bytes:
    try:
        return bytes(imagecodecs.zstd_decode(as_buffer(data), out=limit))
    except imagecodecs.ZstdError as e:
        if "too small" in str(e):
            raise _refuse(limit) from e
        raise


def header_size(data: Bytes, limit: int, offset: int, fmt: str) -> None:
    """Refuse a stream whose header (``fmt`` at ``offset``) states more than ``limit``."""
    if len(data) < offset + struct.calcsize(fmt):
        raise ValueError("too short for its header")
    (stated,) = struct.unpack_from(fmt, data, offset)
    if stated > limit:
        raise TooLarge(f"its header states {stated:,} decoded bytes, more than the "
                       f"{limit:,} the chunk holds")


def bounded_numcodec(name: str, codec: Untyped) -> Callable[[Bytes, int], bytes]:
    """``decode(data, limit)`` for a numcodecs (or Zarr v3 core) bytes→bytes codec."""
    short = name.removeprefix("numcodecs.")
    if short == "zlib":
        return inflate
    if short == "gzip":
        return lambda data, limit: inflate(data, limit, 16 + zlib.MAX_WBITS)
    if short == "zstd":
        return _zstd
    if short == "bz2":
        return _streaming(bz2.BZ2Decompressor)
    if short == "lzma":
        return _streaming(lzma.LZMADecompressor)
    checks: dict[str, tuple[int, str]] = {"blosc": (4, "<I"), "lz4": (0, "<I")}
    if short in checks:
        offset, fmt = checks[short]

        def checked(data: Bytes, limit: int) -> bytes:
            header_size(memoryview(data).cast("B"), limit, offset, fmt)
            return bytes(codec.decode(data))
        return checked
    # the rest keep the size or shrink it (shuffles, checksums): no bomb to fear
    return lambda data, limit: bytes(codec.decode(data))
