"""Chunk bytes ↔ values: the byte-level codecs refgrid implements and one chunk's pipeline.

The ``refgrid.*`` codecs (HDF5's lzf, szip, HDF5-framed lz4, bitshuffle with its block
framing, HDF5's shuffle, and fixed-length strings read as HDF5 reads them: space-padded,
C strings, strings of unknown padding) are implemented over
imagecodecs and numpy; every other bytes→bytes codec is
numcodecs'. :class:`ChunkCodec` runs a whole codec list over one chunk — what scanners and
combine need to re-encode or inspect a few chunks. The reader decodes in batches with
:mod:`refgrid.read.decode`, built on the same pieces.
"""

from __future__ import annotations

import functools
import json
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict

import imagecodecs
import numcodecs
import numcodecs.abc
import numpy as np

from refgrid.codecs.bounded import Bound, bounded_numcodec, header_size, limit_for
from refgrid.codecs.filters import NATIVE_HEADS, CodecJSON, Pipeline, stored_dtype
from refgrid.core.typed import Bytes, Untyped, as_buffer

# -- byte-level codecs for the filters zarr lacks --------------------------------------------

def lzf_decode(data: Bytes, nbytes: int) -> bytes:
    return bytes(imagecodecs.lzf_decode(as_buffer(data), out=nbytes))


def lzf_encode(data: bytes) -> bytes:
    return bytes(imagecodecs.lzf_encode(data))


def szip_decode(data: Bytes, config: Mapping[str, int], limit: int) -> bytes:
    """HDF5's szip: the decoded size, stated in its 4-byte header, checked against
    ``limit`` and decoded into exactly that (a larger buffer is returned whole)."""
    header_size(data, limit, 0, "<I")
    (nbytes,) = struct.unpack_from("<I", data, 0)
    return bytes(imagecodecs.szip_decode(
        as_buffer(data), config["options_mask"], config["pixels_per_block"],
        config["bits_per_pixel"], config["pixels_per_scanline"], header=True, out=nbytes))


def szip_encode(data: bytes, config: Mapping[str, int]) -> bytes:
    return bytes(imagecodecs.szip_encode(
        data, config["options_mask"], config["pixels_per_block"], config["bits_per_pixel"],
        config["pixels_per_scanline"], header=True))


def lz4h5_decode(data: Bytes, limit: int) -> bytes:
    """HDF5's lz4 framing: the total decoded size first (8 bytes), checked against ``limit``
    and decoded into exactly that (its block loop needs the exact size)."""
    header_size(data, limit, 0, ">Q")
    (nbytes,) = struct.unpack_from(">Q", data, 0)
    return bytes(imagecodecs.lz4h5_decode(as_buffer(data), out=nbytes))


def lz4h5_encode(data: bytes) -> bytes:
    return bytes(imagecodecs.lz4h5_encode(data))


_BSHUF_TARGET_BLOCK_BYTES, _BSHUF_MULT, _BSHUF_MIN_BLOCK = 8192, 8, 128


def _bitshuffle_block_elems(itemsize: int, blocksize: int) -> int:
    if blocksize:
        return blocksize
    default = (_BSHUF_TARGET_BLOCK_BYTES // itemsize) // _BSHUF_MULT * _BSHUF_MULT
    return max(default, _BSHUF_MIN_BLOCK)


def _bitshuffle_blocks(nelems: int, block: int) -> tuple[list[int], int]:
    """Block lengths (elements) bitshuffle cuts ``nelems`` into, and the unshuffled tail."""
    last = nelems % block
    sizes = [block] * (nelems // block) + ([last - last % _BSHUF_MULT] if last >= 8 else [])
    return sizes, last % _BSHUF_MULT


class BitshuffleConfig(TypedDict):
    """The configuration of ``refgrid.bitshuffle`` (from HDF5's filter 32008)."""

    itemsize: int
    blocksize: int
    """Elements per block; 0: bitshuffle's default for the item size."""
    compression: str | None
    """``lz4``, ``zstd``, or None (shuffled only)."""


def bitshuffle_decode(data: Bytes, config: BitshuffleConfig, nbytes: int) -> bytes:
    """Undo the HDF5 bitshuffle filter (32008), its block framing included."""
    itemsize, compression = int(config["itemsize"]), config["compression"]
    if compression is None:
        block = _bitshuffle_block_elems(itemsize, int(config["blocksize"]))
        return bytes(imagecodecs.bitshuffle_decode(as_buffer(data), itemsize=itemsize,
                                                   blocksize=block))
    header_size(data, nbytes, 0, ">Q")
    total, block_bytes = struct.unpack(">QI", data[:12])
    sizes, tail = _bitshuffle_blocks(total // itemsize, block_bytes // itemsize)
    decompress = imagecodecs.lz4_decode if compression == "lz4" else imagecodecs.zstd_decode
    pos, out = 12, bytearray()
    for n in sizes:
        (size,) = struct.unpack(">I", data[pos:pos + 4])
        raw = decompress(as_buffer(data[pos + 4:pos + 4 + size]), out=n * itemsize)
        out += imagecodecs.bitshuffle_decode(raw, itemsize=itemsize, blocksize=n)
        pos += 4 + size
    out += data[pos:pos + tail * itemsize]
    return bytes(out)


def bitshuffle_encode(data: bytes, config: BitshuffleConfig) -> bytes:
    itemsize, compression = int(config["itemsize"]), config["compression"]
    block = _bitshuffle_block_elems(itemsize, int(config["blocksize"]))
    if compression is None:
        return bytes(imagecodecs.bitshuffle_encode(data, itemsize=itemsize, blocksize=block))
    sizes, tail = _bitshuffle_blocks(len(data) // itemsize, block)
    compress = imagecodecs.lz4_encode if compression == "lz4" else imagecodecs.zstd_encode
    out, pos = bytearray(struct.pack(">QI", len(data), block * itemsize)), 0
    for n in sizes:
        packed = compress(imagecodecs.bitshuffle_encode(
            data[pos:pos + n * itemsize], itemsize=itemsize, blocksize=n))
        out += struct.pack(">I", len(packed)) + packed
        pos += n * itemsize
    out += data[pos:pos + tail * itemsize]
    return bytes(out)


Places = Sequence[Sequence[int]] | None
"""Where the strings lie in each element of a string codec's ``length`` bytes: ``[offset,
length]`` pairs (a compound's string members); None: the element is one string."""


def spacepad_decode(data: Bytes, length: int, places: Places = None) -> bytes:
    """Fixed-length strings stored space-padded, as HDF5 reads them: each string's trailing
    spaces become NULs (numpy's ``S`` type then ends the string there, as h5py shows it)."""
    return _each_string(data, length, places, lambda s: np.where(_trailing(s, 0x20), 0, s))


def spacepad_encode(data: bytes, length: int, places: Places = None) -> bytes:
    return _each_string(data, length, places, lambda s: np.where(_trailing(s, 0), 0x20, s))


def nullterm_decode(data: Bytes, length: int, places: Places = None) -> bytes:
    """C strings (``H5T_STR_NULLTERM``) as HDF5 reads them: each string ends at its first
    NUL, whatever bytes the file holds after it (they read as NULs)."""
    return _each_string(data, length, places,
                        lambda s: np.where(np.logical_or.accumulate(s == 0, axis=1), 0, s))


def anypad_decode(data: Bytes, length: int, places: Places = None) -> bytes:
    """Fixed-length strings whose padding the source does not give (C strings, null- or
    space-padded): the bytes as they are where every padding reads them alike — no byte but
    NUL after a NUL, no space last — and a ``ValueError`` where they would not."""
    def check(s: np.ndarray) -> np.ndarray:
        after_nul = np.logical_or.accumulate(s == 0, axis=1) & (s != 0)
        if after_nul.any() or (s[:, -1:] == 0x20).any():
            raise ValueError("fixed-length strings whose padding the source does not give "
                             "read differently as C strings, null-padded or space-padded "
                             "ones (bytes after a NUL, or a space last): refused")
        return s
    return _each_string(data, length, places, check)


def _trailing(strings: np.ndarray, byte: int) -> np.ndarray:
    """Where each row of ``strings`` ends in a run of ``byte``."""
    ends = np.flip(strings == byte, axis=1)
    return np.flip(np.logical_and.accumulate(ends, axis=1), axis=1)


def _each_string(data: Bytes, length: int, places: Places,
                 change: Callable[[np.ndarray], np.ndarray]) -> bytes:
    """``data`` with ``change`` applied to the strings of each ``length``-byte element (a
    ``(elements, string length)`` array of bytes at a time); a trailing part element
    stays as it is."""
    out = np.frombuffer(data, np.uint8).copy()
    n = len(out) // length
    body = out[:n * length].reshape(n, length)
    for offset, size in places if places is not None else ((0, length),):
        if size:
            body[:, offset:offset + size] = change(body[:, offset:offset + size])
    return out.tobytes()


def hdf5_shuffle_decode(data: Bytes, elementsize: int) -> bytes:
    """Unshuffle one chunk like HDF5 (see :func:`unshuffle`)."""
    return unshuffle(np.frombuffer(data, np.uint8).reshape(1, -1), elementsize).tobytes()


def hdf5_shuffle_encode(data: bytes, elementsize: int) -> bytes:
    n = len(data) // elementsize
    body = np.frombuffer(data, np.uint8, n * elementsize).reshape(n, elementsize)
    return body.T.tobytes() + data[n * elementsize:]


def unshuffle(chunks: np.ndarray, elementsize: int) -> np.ndarray:
    """Undo HDF5's byte shuffle on each row of ``chunks`` (bytes beyond the last whole
    element stay where they are)."""
    n = chunks.shape[1] // elementsize
    out = np.empty_like(chunks)
    body = chunks[:, : n * elementsize].reshape(len(chunks), elementsize, n)
    target = np.reshape(out[:, : n * elementsize], (len(chunks), n, elementsize), copy=False)
    target[...] = body.transpose(0, 2, 1)
    out[:, n * elementsize:] = chunks[:, n * elementsize:]
    return out


@dataclass(frozen=True)
class ByteCodec:
    """A bytes→bytes codec usable without zarr (refgrid's reader and scan-time re-encoding)."""

    decode: Callable[[Bytes, int], bytes]
    """``decode(data, limit)``: never more than ``limit`` bytes (:mod:`.bounded`)."""
    encode: Callable[[bytes], bytes]


REFGRID_CODECS = ("refgrid.lzf", "refgrid.szip", "refgrid.lz4h5", "refgrid.bitshuffle",
                  "refgrid.shuffle", "refgrid.spacepad", "refgrid.nullterm", "refgrid.anypad")
"""refgrid's own byte codecs (the HDF5 filters zarr and numcodecs lack, and the string
paddings): one class each for zarr (:mod:`.zarr_v3`) and numcodecs (:mod:`.numcodecs_v2`),
found through the entry points in ``pyproject.toml``."""


def _unchanged(data: bytes, length: int, places: Places = None) -> bytes:
    return data


STRING_CODERS: dict[str, tuple[Callable[[Bytes, int, Places], bytes],
                               Callable[[bytes, int, Places], bytes]]] = {
    "refgrid.spacepad": (spacepad_decode, spacepad_encode),
    "refgrid.nullterm": (nullterm_decode, _unchanged),
    "refgrid.anypad": (anypad_decode, _unchanged),
}
"""Fixed-length strings read as HDF5 reads them (:func:`refgrid.codecs.filters.string_codecs`):
decoding and encoding (what decoding gives is stored as it is: a C string ended by NULs,
strings no padding reads otherwise)."""


ZARR_V3_COMPRESSORS: dict[str, Callable[[Mapping[str, object]], numcodecs.abc.Codec]] = {
    "zstd": lambda c: numcodecs.Zstd(level=c.get("level", 0)),
    "gzip": lambda c: numcodecs.GZip(level=c.get("level", 5)),
    "blosc": lambda c: numcodecs.Blosc(cname=c.get("cname", "zstd"),
                                       clevel=c.get("clevel", 5)),  # (decoding reads its header)
    "crc32c": lambda c: numcodecs.CRC32C(),
}
"""Zarr v3 core bytes→bytes codecs → numcodecs equivalents (decoding needs no more config)."""


def byte_codec(codec: CodecJSON) -> ByteCodec:
    """The byte-level decoder/encoder of a bytes→bytes codec JSON entry (built once per
    distinct entry: numcodecs objects are not free to make)."""
    return _byte_codec(json.dumps(codec, sort_keys=True))


@functools.lru_cache(maxsize=256)
def _byte_codec(codec_json: str) -> ByteCodec:
    codec = json.loads(codec_json)
    name, config = codec["name"], codec.get("configuration", {})
    if name == "refgrid.lzf":
        return ByteCodec(lambda d, n: lzf_decode(d, n), lzf_encode)
    if name == "refgrid.szip":
        return ByteCodec(lambda d, n: szip_decode(d, config, n), lambda d: szip_encode(d, config))
    if name == "refgrid.lz4h5":
        return ByteCodec(lambda d, n: lz4h5_decode(d, n), lz4h5_encode)
    if name == "refgrid.shuffle":
        size = int(config["elementsize"])
        return ByteCodec(lambda d, n: hdf5_shuffle_decode(d, size),
                         lambda d: hdf5_shuffle_encode(d, size))
    if name in STRING_CODERS:
        length, places = int(config["length"]), config.get("strings")
        decode, encode = STRING_CODERS[name]
        return ByteCodec(lambda d, n: decode(d, length, places)[:n],
                         lambda d: encode(d, length, places))
    if name == "refgrid.bitshuffle":
        return ByteCodec(lambda d, n: bitshuffle_decode(d, config, n),
                         lambda d: bitshuffle_encode(d, config))
    if name in ZARR_V3_COMPRESSORS:  # Zarr v3's own codecs, as native stores use them
        codec_obj = ZARR_V3_COMPRESSORS[name](config)
    elif name.startswith("numcodecs."):
        codec_obj = numcodecs.get_codec({"id": name.removeprefix("numcodecs."), **config})
    else:
        raise KeyError(f"no byte-level codec for {name!r}")
    return ByteCodec(bounded_numcodec(name, codec_obj), lambda d: bytes(codec_obj.encode(d)))


def numcodec(codec: CodecJSON) -> numcodecs.abc.Codec:
    """The numcodecs codec of a ``numcodecs.<id>`` entry (imagecodecs' codecs included)."""
    config = {"id": codec["name"].removeprefix("numcodecs."), **codec.get("configuration", {})}
    try:
        return numcodecs.get_codec(config)
    except ValueError:
        if not config["id"].startswith("imagecodecs_"):
            raise
    import imagecodecs.numcodecs

    imagecodecs.numcodecs.register_codecs(verbose=False)
    return numcodecs.get_codec(config)


class ChunkCodec:
    """One array's codec list applied to single chunks: built once, used for many chunks."""

    def __init__(self, codecs: Sequence[CodecJSON], dtype: np.dtype) -> None:
        pipeline = Pipeline.of(codecs)
        self.dtype = dtype
        self.stored = stored_dtype(dtype, codecs)
        """``dtype`` in the byte order the chunks hold."""
        self.compressors = [byte_codec(c) for c in pipeline.compressors]
        self.head_name = pipeline.head["name"]
        self._head = None if self.head_name in NATIVE_HEADS else numcodec(pipeline.head)
        self._filters = [numcodec(c) for c in pipeline.filters]
        self._numcodecs = pipeline.numcodecs_decoded
        self.order = pipeline.order
        """Stored axes order (a ``transpose`` codec), None: as the array's."""

    def to_array(self, data: Bytes, shape: Sequence[int]) -> np.ndarray:
        """The values of one decompressed chunk, shaped like its encoded ``shape`` (a
        transposed chunk read in its stored order, then its axes put back)."""
        if self.order is None:
            return self._stored_values(data, shape)
        if len(self.order) != len(shape) or sorted(self.order) != list(range(len(shape))):
            raise ValueError(f"transpose order {list(self.order)} does not permute "
                             f"{len(shape)} axes")
        stored = self._stored_values(data, [shape[i] for i in self.order])
        return stored.transpose(np.argsort(self.order))

    def _stored_values(self, data: Bytes, shape: Sequence[int]) -> np.ndarray:
        count = math.prod(shape)
        if self._numcodecs:
            decoded: Untyped = data if self._head is None else self._head.decode(data)
            for codec in reversed(self._filters):
                decoded = codec.decode(decoded)
            values = np.asarray(decoded) if isinstance(decoded, np.ndarray) else np.frombuffer(
                decoded, self.dtype)
            if values.dtype != self.dtype:  # as Zarr v2 does: the filters' output as dtype
                values = np.ascontiguousarray(values).reshape(-1).view(self.dtype)
            return values.reshape(shape)
        if self.head_name in ("vlen-utf8", "vlen-bytes"):
            vlen = numcodecs.VLenUTF8() if self.head_name == "vlen-utf8" else \
                numcodecs.VLenBytes()
            return np.asarray(vlen.decode(data), dtype=object).reshape(shape)
        if len(data) != count * self.stored.itemsize:
            raise ValueError(f"decoded to {len(data)} bytes, expected "
                             f"{count * self.stored.itemsize} for shape {tuple(shape)}")
        return np.frombuffer(data, dtype=self.stored, count=count).reshape(shape)

    @property
    def bound(self) -> Bound:
        """How well a chunk's decompressed size is known (:data:`.bounded.Bound`)."""
        if self.head_name in ("vlen-utf8", "vlen-bytes") or self.dtype.kind in "OT":
            return "variable"
        return "scaled" if self._numcodecs else "exact"

    def decode(self, data: Bytes, shape: Sequence[int]) -> np.ndarray:
        """Decode one stored chunk (fletcher32 checksums are verified by its decoder); no
        stage produces more than the chunk can hold."""
        limit = limit_for(math.prod(shape) * self.dtype.itemsize, self.bound)
        for codec in reversed(self.compressors):
            data = codec.decode(data, limit)
        return self.to_array(data, shape)

    def encode(self, array: np.ndarray) -> bytes:
        """Encode one chunk (already in its stored dtype and byte order)."""
        data: Untyped = np.ascontiguousarray(array if self.order is None else
                                         array.transpose(self.order))
        for codec in self._filters:
            data = codec.encode(data)
        if self._head is None:
            data = np.ascontiguousarray(data).tobytes()
        else:
            data = bytes(self._head.encode(data))
        for compressor in self.compressors:
            data = compressor.encode(data)
        return bytes(data)


def encode_chunk(array: np.ndarray, codecs: Sequence[CodecJSON]) -> bytes:
    """Encode one chunk (already in its stored dtype and byte order) through ``codecs``."""
    return ChunkCodec(codecs, array.dtype).encode(array)


def decode_chunk(data: bytes, codecs: Sequence[CodecJSON], dtype: np.dtype,
                 shape: Sequence[int]) -> np.ndarray:
    """Decode one stored chunk to an array of its encoded ``shape``."""
    return ChunkCodec(codecs, dtype).decode(data, shape)
