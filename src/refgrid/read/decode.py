"""Batch decoding for the reader: many chunks of one array per call.

Decoding a batch (:meth:`ChunkDecoder.decompress_many`) runs each bytes→bytes codec over the
whole list of chunks in a C-level loop, and a trailing byte shuffle (HDF5's usual first
filter) as one numpy step over all of them; where the decoded size is known exactly,
libdeflate inflates straight into a buffer of that size. One chunk's values are then made by
the array's :class:`~refgrid.codecs.pipeline.ChunkCodec`.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Sequence

import imagecodecs
import numpy as np

from refgrid.codecs.bounded import Bound, inflate_many, limit_for
from refgrid.codecs.filters import CodecJSON, Pipeline
from refgrid.codecs.pipeline import ChunkCodec, byte_codec, hdf5_shuffle_decode, unshuffle
from refgrid.core.typed import Bytes

SIZE_KEEPING = frozenset({"numcodecs.shuffle", "refgrid.shuffle"})
"""Byte shuffles: decoded size equals encoded size."""
LIBDEFLATE_FROM = 2048
"""Decoded chunk size from which libdeflate beats zlib (its call costs ~1 µs more, its
inflating ~30% less)."""

Step = Callable[[Sequence[Bytes]], Sequence[Bytes]]
"""One bytes→bytes decoding step of a batch of chunks."""
Stage = Callable[[int], Step]
"""A decoding stage: given the decoded size of a batch's chunks, its step for the batch
(its bounds worked out once a batch, not once a chunk)."""


class ChunkDecodeError(ValueError):
    """Chunk ``index`` of a batch does not decode."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index = index


class ChunkDecoder:
    """Decodes the chunks of one array: built once per codec list and dtype, applied to many.

    Where the bytes are the values already (:attr:`plain`) a reader skips :meth:`to_array`
    for the batch and views the decompressed rows directly.
    """

    def __init__(self, codecs: Sequence[CodecJSON], dtype: np.dtype) -> None:
        pipeline = Pipeline.of(codecs)
        self.codec = ChunkCodec(codecs, dtype)
        self.dtype = dtype
        self.stored = self.codec.stored
        self.plain = not pipeline.numcodecs_decoded and pipeline.head["name"] == "bytes" \
            and pipeline.order is None
        """Decompressed bytes are the chunk's values in :attr:`stored` dtype and order."""
        compressors = list(pipeline.compressors)
        self.shuffle: int | None = None
        """Element size of a byte shuffle decoded last, batch-wise (None: no such step)."""
        if compressors and compressors[0]["name"] in SIZE_KEEPING:
            self.shuffle = int(compressors.pop(0).get("configuration", {})["elementsize"])
        # libdeflate needs the exact decoded size: known for a plain pipeline when only byte
        # shuffles (which keep the size) are decoded after it
        bound = self.codec.bound
        self.stages: list[Stage] = [_zlib_decoder(self.plain and all(
            later["name"] in SIZE_KEEPING for later in compressors[:k]), bound)
            if c["name"] == "numcodecs.zlib" else _limited(byte_codec(c).decode, bound)
            for k, c in reversed(list(enumerate(compressors)))]

    def decompress_many(self, chunks: Sequence[Bytes], nbytes: int) -> np.ndarray:
        """Chunks that all decompress to ``nbytes``, as a ``(len(chunks), nbytes)`` uint8
        array; a chunk that fails raises :class:`ChunkDecodeError` with its index."""
        data: Sequence[Bytes] = chunks
        for stage in self.stages:
            step = stage(nbytes)
            try:
                data = step(data)
                continue
            except Exception:  # found again below, once this exception (and the buffers
                pass           # its frames hold) is freed
            for k, chunk in enumerate(data):  # the failing chunk, for the message
                try:
                    step([chunk])
                except Exception as e:
                    raise ChunkDecodeError(k, f"{type(e).__name__}: {e}") from e
            raise ChunkDecodeError(0, "does not decode consistently")
        joined = b"".join(data)
        if len(joined) != len(data) * nbytes:
            sizes = np.fromiter(map(len, data), np.int64, len(data))
            k = int(np.flatnonzero(sizes != nbytes)[0])
            raise ChunkDecodeError(k, f"decoded to {sizes[k]} bytes, expected {nbytes}")
        raw = np.frombuffer(joined, np.uint8).reshape(len(data), nbytes)
        return raw if self.shuffle is None else unshuffle(raw, self.shuffle)

    def decode_many(self, chunks: Sequence[Bytes], shape: tuple[int, ...]) -> np.ndarray:
        """Chunks that all decode to ``shape`` (their encoded shape), as one batch: ``(len(
        chunks), *shape)`` in the stored type where the bytes are the values (:attr:`plain`,
        decompressed in one pass), else in the values' type. The one batch decoder of the
        engine, the views and refgrid's zarr pipeline; a chunk that fails raises
        :class:`ChunkDecodeError` with its index."""
        if self.plain:
            raw = self.decompress_many(chunks, math.prod(shape) * self.stored.itemsize)
            return raw.view(self.stored).reshape(len(chunks), *shape)
        out = np.empty((len(chunks), *shape), dtype=self.codec.dtype if
                       self.codec.dtype.kind not in "OT" else object)
        for k, data in enumerate(chunks):
            try:
                out[k, ...] = self.decode(data, shape)  # (a 0-d object chunk: its item)
            except Exception as e:
                raise ChunkDecodeError(k, f"{type(e).__name__}: {e}") from e
        return out

    def decode(self, data: Bytes, shape: Sequence[int]) -> np.ndarray:
        """Decode one stored chunk to its encoded ``shape``."""
        nbytes = math.prod(shape) * self.dtype.itemsize
        for stage in self.stages:
            (data,) = stage(nbytes)([data])
        if self.shuffle is not None:
            data = hdf5_shuffle_decode(data, self.shuffle)
        return self.codec.to_array(data, shape)


def _zlib_decoder(exact_stage: bool, bound: Bound) -> Stage:
    """zlib (HDF5's deflate): libdeflate, into a buffer of exactly the decoded size (which
    also bounds it), for chunks that are not tiny when this stage's output size is exact;
    else the standard library, stopping at the chunk's limit (a zlib bomb is refused, not
    inflated)."""
    def stage(size: int) -> Step:
        if exact_stage and size >= LIBDEFLATE_FROM:
            inflate = functools.partial(imagecodecs.deflate_decode, out=size)
            return lambda chunks: list(map(inflate, chunks))
        return functools.partial(inflate_many, limit=limit_for(size, bound))
    return stage


def _limited(decode: Callable[[Bytes, int], Bytes], bound: Bound) -> Stage:
    """A stage that produces at most what a chunk of ``size`` decoded bytes may hold."""
    def stage(size: int) -> Step:
        limit = limit_for(size, bound)
        return lambda chunks: [decode(data, limit) for data in chunks]
    return stage


@functools.lru_cache(maxsize=256)
def _decoder(codecs_json: str, dtype: np.dtype) -> ChunkDecoder:
    return ChunkDecoder(json.loads(codecs_json), dtype)


def chunk_decoder(codecs: Sequence[CodecJSON], dtype: np.dtype) -> ChunkDecoder:
    """The (cached) decoder of an array's codec list."""
    return _decoder(json.dumps(list(codecs), sort_keys=True), dtype)


def decoded_by_zarr(codecs: Sequence[CodecJSON], dtype: np.dtype) -> bool:
    """Whether zarr's own pipeline decodes an array's chunks even when refgrid's pipeline
    reads its store (strings, records, numcodecs filters, transposes: their values need
    zarr's own conversions; codecs refgrid cannot build: zarr may know them)."""
    try:
        return not ChunkDecoder(codecs, dtype).plain or dtype.kind in "OSUVT"
    except Exception:  # a codec's configuration checks raise anything: zarr decides
        return True
