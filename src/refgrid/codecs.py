"""HDF5 filters ↔ Zarr v3 codec JSON ↔ decoders: the one table.

An HDF5 pipeline (data → shuffle → deflate → fletcher32) becomes the Zarr v3 codec list
``[bytes, numcodecs.shuffle, numcodecs.zlib, numcodecs.fletcher32]``. zarr ships ``numcodecs.*``
codecs for the common filters; the four it lacks (lzf, szip, HDF5-framed lz4, bitshuffle with
HDF5 framing) are refgrid codecs, implemented here over imagecodecs and registered with zarr
through entry points (:mod:`refgrid.zarr_codecs`).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import imagecodecs
import numcodecs
import numpy as np

CodecJSON = dict[str, Any]


class UnsupportedFilter(Exception):
    """An HDF5 filter with no Zarr codec (n-bit, scale-offset, unknown plugins)."""

    def __init__(self, filter_id: int, name: str) -> None:
        super().__init__(f"HDF5 filter {filter_id} ({name}) has no Zarr codec")
        self.filter_id = filter_id
        self.name = name


# -- HDF5 filter → Zarr v3 codec JSON ---------------------------------------------------------

_BLOSC_COMPRESSORS = {0: "blosclz", 1: "lz4", 2: "lz4hc", 3: "snappy", 4: "zlib", 5: "zstd"}
_BITSHUFFLE_COMPRESSION = {0: None, 2: "lz4", 3: "zstd"}


def _deflate(cd: Sequence[int], dtype: np.dtype) -> CodecJSON:
    return {"name": "numcodecs.zlib", "configuration": {"level": int(cd[0]) if cd else 6}}


def _shuffle(cd: Sequence[int], dtype: np.dtype) -> CodecJSON:
    return {"name": "numcodecs.shuffle",
            "configuration": {"elementsize": int(cd[0]) if cd else dtype.itemsize}}


def _fletcher32(cd: Sequence[int], dtype: np.dtype) -> CodecJSON:
    return {"name": "numcodecs.fletcher32", "configuration": {}}


def _szip(cd: Sequence[int], dtype: np.dtype) -> CodecJSON:
    mask, ppb, bpp, pps = (int(v) for v in cd[:4])
    return {"name": "refgrid.szip", "configuration": {
        "options_mask": mask, "pixels_per_block": ppb, "bits_per_pixel": bpp,
        "pixels_per_scanline": pps}}


def _lzf(cd: Sequence[int], dtype: np.dtype) -> CodecJSON:
    return {"name": "refgrid.lzf", "configuration": {}}


def _blosc(cd: Sequence[int], dtype: np.dtype) -> CodecJSON:
    clevel = int(cd[4]) if len(cd) > 4 else 5
    shuffle = int(cd[5]) if len(cd) > 5 else 1
    cname = _BLOSC_COMPRESSORS.get(int(cd[6]) if len(cd) > 6 else 0, "blosclz")
    return {"name": "numcodecs.blosc", "configuration": {
        "cname": cname, "clevel": clevel, "shuffle": shuffle, "blocksize": 0}}


def _lz4(cd: Sequence[int], dtype: np.dtype) -> CodecJSON:
    return {"name": "refgrid.lz4h5", "configuration": {}}


def _bitshuffle(cd: Sequence[int], dtype: np.dtype) -> CodecJSON:
    code = int(cd[4]) if len(cd) > 4 else 0
    if code not in _BITSHUFFLE_COMPRESSION:
        raise UnsupportedFilter(32008, f"bitshuffle with compression {code}")
    return {"name": "refgrid.bitshuffle", "configuration": {
        "itemsize": int(cd[2]) if len(cd) > 2 else dtype.itemsize,
        "blocksize": int(cd[3]) if len(cd) > 3 else 0,
        "compression": _BITSHUFFLE_COMPRESSION[code]}}


def _zstd(cd: Sequence[int], dtype: np.dtype) -> CodecJSON:
    return {"name": "numcodecs.zstd", "configuration": {"level": int(cd[0]) if cd else 0}}


def _bzip2(cd: Sequence[int], dtype: np.dtype) -> CodecJSON:
    return {"name": "numcodecs.bz2", "configuration": {"level": int(cd[0]) if cd else 9}}


HDF5_FILTERS: Mapping[int, tuple[str, Callable[[Sequence[int], np.dtype], CodecJSON]]] = {
    1: ("deflate", _deflate),
    2: ("shuffle", _shuffle),
    3: ("fletcher32", _fletcher32),
    4: ("szip", _szip),
    307: ("bzip2", _bzip2),
    32000: ("lzf", _lzf),
    32001: ("blosc", _blosc),
    32004: ("lz4", _lz4),
    32008: ("bitshuffle", _bitshuffle),
    32015: ("zstd", _zstd),
}
HDF5_FILTER_NAMES = {5: "nbit", 6: "scaleoffset", 32017: "sz", 32026: "blosc2"}


def hdf5_filter_codec(filter_id: int, cd_values: Sequence[int], dtype: np.dtype) -> CodecJSON:
    """The Zarr v3 codec for one HDF5 filter, or :class:`UnsupportedFilter`."""
    if filter_id not in HDF5_FILTERS:
        raise UnsupportedFilter(filter_id, HDF5_FILTER_NAMES.get(filter_id, "unknown"))
    return HDF5_FILTERS[filter_id][1](cd_values, dtype)


def hdf5_pipeline(filters: Sequence[tuple[int, Sequence[int]]], dtype: np.dtype) -> list[CodecJSON]:
    """The Zarr v3 codecs of an HDF5 filter pipeline ``[(filter id, cd_values), ...]``.

    A shuffle that follows another filter works on bytes whose length need not be a multiple
    of the element size; HDF5 then leaves the remainder as it is, which numcodecs refuses, so
    such a shuffle becomes ``refgrid.shuffle`` (HDF5's semantics).
    """
    codecs = [bytes_codec(dtype)]
    for position, (filter_id, cd_values) in enumerate(filters):
        codec = hdf5_filter_codec(filter_id, cd_values, dtype)
        if codec["name"] == "numcodecs.shuffle" and position > 0:
            codec = {**codec, "name": "refgrid.shuffle"}
        codecs.append(codec)
    return codecs


def bytes_codec(dtype: np.dtype) -> CodecJSON:
    """The array→bytes codec for ``dtype`` as stored (its byte order)."""
    order = dtype.byteorder if dtype.fields is None else _struct_byteorder(dtype)
    if dtype.itemsize == 1 or order == "|":
        return {"name": "bytes"}
    big = order == ">" or (order == "=" and np.little_endian is False)
    return {"name": "bytes", "configuration": {"endian": "big" if big else "little"}}


def _struct_byteorder(dtype: np.dtype) -> str:
    orders = {_leaf_byteorder(f[0]) for f in dtype.fields.values()} - {"|"}
    if len(orders) > 1:
        raise ValueError(f"compound type {dtype} mixes byte orders")
    return orders.pop() if orders else "|"


def _leaf_byteorder(dtype: np.dtype) -> str:
    if dtype.fields is not None:
        return _struct_byteorder(dtype)
    if dtype.subdtype is not None:
        return _leaf_byteorder(dtype.subdtype[0])
    order = dtype.byteorder
    return ("<" if np.little_endian else ">") if order == "=" else order


# -- byte-level codecs for the filters zarr lacks --------------------------------------------

def lzf_decode(data: bytes, nbytes: int) -> bytes:
    return bytes(imagecodecs.lzf_decode(data, out=nbytes))


def lzf_encode(data: bytes) -> bytes:
    return bytes(imagecodecs.lzf_encode(data))


def szip_decode(data: bytes, config: Mapping[str, int], nbytes: int) -> bytes:
    return bytes(imagecodecs.szip_decode(
        data, config["options_mask"], config["pixels_per_block"], config["bits_per_pixel"],
        config["pixels_per_scanline"], header=True, out=nbytes))


def szip_encode(data: bytes, config: Mapping[str, int]) -> bytes:
    return bytes(imagecodecs.szip_encode(
        data, config["options_mask"], config["pixels_per_block"], config["bits_per_pixel"],
        config["pixels_per_scanline"], header=True))


def lz4h5_decode(data: bytes, nbytes: int) -> bytes:
    return bytes(imagecodecs.lz4h5_decode(data, out=nbytes))


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


def bitshuffle_decode(data: bytes, config: Mapping[str, Any], nbytes: int) -> bytes:
    """Undo the HDF5 bitshuffle filter (32008), its block framing included."""
    itemsize, compression = int(config["itemsize"]), config["compression"]
    if compression is None:
        block = _bitshuffle_block_elems(itemsize, int(config["blocksize"]))
        return bytes(imagecodecs.bitshuffle_decode(data, itemsize=itemsize, blocksize=block))
    total, block_bytes = struct.unpack(">QI", data[:12])
    sizes, tail = _bitshuffle_blocks(total // itemsize, block_bytes // itemsize)
    decompress = imagecodecs.lz4_decode if compression == "lz4" else imagecodecs.zstd_decode
    pos, out = 12, bytearray()
    for n in sizes:
        (size,) = struct.unpack(">I", data[pos:pos + 4])
        raw = decompress(data[pos + 4:pos + 4 + size], out=n * itemsize)
        out += imagecodecs.bitshuffle_decode(raw, itemsize=itemsize, blocksize=n)
        pos += 4 + size
    out += data[pos:pos + tail * itemsize]
    return bytes(out)


def bitshuffle_encode(data: bytes, config: Mapping[str, Any]) -> bytes:
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


def hdf5_shuffle_decode(data: bytes, elementsize: int) -> bytes:
    """Unshuffle one chunk like HDF5 (see :func:`unshuffle`)."""
    return unshuffle(np.frombuffer(data, np.uint8).reshape(1, -1), elementsize).tobytes()


def hdf5_shuffle_encode(data: bytes, elementsize: int) -> bytes:
    n = len(data) // elementsize
    body = np.frombuffer(data, np.uint8, n * elementsize).reshape(n, elementsize)
    return body.T.tobytes() + data[n * elementsize:]


@dataclass(frozen=True)
class ByteCodec:
    """A bytes→bytes codec usable without zarr (refgrid's reader and scan-time re-encoding)."""

    decode: Callable[[bytes, int], bytes]
    """``decode(data, decoded_nbytes)``."""
    encode: Callable[[bytes], bytes]


ZARR_V3_COMPRESSORS: dict[str, Callable[[Mapping[str, Any]], numcodecs.abc.Codec]] = {
    "zstd": lambda c: numcodecs.Zstd(level=c.get("level", 0)),
    "gzip": lambda c: numcodecs.GZip(level=c.get("level", 5)),
    "blosc": lambda c: numcodecs.Blosc(cname=c.get("cname", "zstd"),
                                       clevel=c.get("clevel", 5)),  # (decoding reads its header)
    "crc32c": lambda c: numcodecs.CRC32C(),
}
"""Zarr v3 core bytes→bytes codecs → numcodecs equivalents (decoding needs no more config)."""


def byte_codec(codec: Mapping[str, Any]) -> ByteCodec:
    """The byte-level decoder/encoder of a bytes→bytes codec JSON entry."""
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
    if name == "refgrid.bitshuffle":
        return ByteCodec(lambda d, n: bitshuffle_decode(d, config, n),
                         lambda d: bitshuffle_encode(d, config))
    if name in ZARR_V3_COMPRESSORS:  # Zarr v3's own codecs, as native stores use them
        codec_obj = ZARR_V3_COMPRESSORS[name](config)
    elif name.startswith("numcodecs."):
        codec_obj = numcodecs.get_codec({"id": name.removeprefix("numcodecs."), **config})
    else:
        raise KeyError(f"no byte-level codec for {name!r}")
    return ByteCodec(lambda d, n: bytes(codec_obj.decode(d)), lambda d: bytes(codec_obj.encode(d)))


ARRAY_TO_ARRAY = frozenset({"numcodecs.delta", "numcodecs.bitround", "numcodecs.fixedscaleoffset",
                            "numcodecs.quantize", "numcodecs.packbits", "numcodecs.astype"})
"""numcodecs filters that transform arrays (Zarr v2 ``filters``), as zarr 3 names them."""
NATIVE_HEADS = frozenset({"bytes", "vlen-utf8", "vlen-bytes"})


@dataclass(frozen=True)
class Pipeline:
    """A codec list split the Zarr v3 way: array→array filters, the array→bytes codec (the
    head), bytes→bytes compressors. A head other than ``bytes``/``vlen-*`` is a numcodecs codec
    that decodes bytes to an array itself (kerchunk's GRIB or image codecs, say)."""

    filters: tuple[Mapping[str, Any], ...]
    head: Mapping[str, Any]
    compressors: tuple[Mapping[str, Any], ...]

    @classmethod
    def of(cls, codecs: Sequence[Mapping[str, Any]]) -> Pipeline:
        k = next((k for k, c in enumerate(codecs) if c["name"] not in ARRAY_TO_ARRAY),
                 len(codecs))
        if k == len(codecs):
            raise ValueError(f"no array→bytes codec in {[c['name'] for c in codecs]}")
        return cls(tuple(codecs[:k]), codecs[k], tuple(codecs[k + 1:]))

    @property
    def endian(self) -> str | None:
        """The stored byte order the ``bytes`` codec names (None: native or not applicable)."""
        return self.head.get("configuration", {}).get("endian") if not self.filters else None

    @property
    def numcodecs_decoded(self) -> bool:
        """Decoded the Zarr v2 way: numcodecs filters and head produce the array."""
        return bool(self.filters) or self.head["name"] not in NATIVE_HEADS


def numcodec(codec: Mapping[str, Any]) -> numcodecs.abc.Codec:
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


def stored_dtype(dtype: np.dtype, codecs: Sequence[Mapping[str, Any]]) -> np.dtype:
    """``dtype`` in the byte order its chunks are stored in."""
    endian = Pipeline.of(codecs).endian
    if not endian or dtype.itemsize == 1 or dtype.kind in "OTV":
        return dtype
    return dtype.newbyteorder(">" if endian == "big" else "<")


def encode_chunk(array: np.ndarray, codecs: Sequence[Mapping[str, Any]]) -> bytes:
    """Encode one chunk (already in its stored dtype and byte order) through ``codecs``."""
    pipeline = Pipeline.of(codecs)
    data: Any = np.ascontiguousarray(array)
    for codec in pipeline.filters:
        data = numcodec(codec).encode(data)
    if pipeline.head["name"] in NATIVE_HEADS:
        data = np.ascontiguousarray(data).tobytes()
    else:
        data = bytes(numcodec(pipeline.head).encode(data))
    for codec in pipeline.compressors:
        data = byte_codec(codec).encode(data)
    return data


_SIZE_KEEPING = frozenset({"numcodecs.shuffle", "refgrid.shuffle"})


class ChunkDecodeError(ValueError):
    """Chunk ``index`` of a batch does not decode."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index = index


class ChunkDecoder:
    """Decodes the chunks of one array: built once per codec list and dtype, applied to many.

    Decoding a batch (:meth:`decompress_many`) runs each bytes→bytes codec over the whole
    list of chunks in a C-level loop, and a trailing byte shuffle (HDF5's usual first filter)
    as one numpy step over all of them; :meth:`to_array` then makes one chunk's values. Where
    the bytes are the values already (:attr:`plain`) a reader skips that step for the batch.
    """

    def __init__(self, codecs: Sequence[Mapping[str, Any]], dtype: np.dtype,
                 chunk_nbytes: int) -> None:
        pipeline = Pipeline.of(codecs)
        self.dtype = dtype
        self.stored = stored_dtype(dtype, codecs)
        self.plain = not pipeline.numcodecs_decoded and pipeline.head["name"] == "bytes"
        """Decompressed bytes are the chunk's values in :attr:`stored` dtype."""
        compressors = list(pipeline.compressors)
        self.shuffle = None
        """Element size of a byte shuffle decoded last, batch-wise (None: no such step)."""
        if compressors and compressors[0]["name"] in _SIZE_KEEPING:  # (the byte shuffles)
            self.shuffle = int(compressors.pop(0)["configuration"]["elementsize"])
        # libdeflate needs the exact decoded size: known for a plain pipeline when only byte
        # shuffles (which keep the size) are decoded after it
        self.stages = [_zlib_decoder(self.plain and all(
            later["name"] in _SIZE_KEEPING for later in compressors[:k]), chunk_nbytes)
            if c["name"] == "numcodecs.zlib" else byte_codec(c).decode
            for k, c in reversed(list(enumerate(compressors)))]
        self._head = None if pipeline.head["name"] in NATIVE_HEADS else numcodec(pipeline.head)
        self._head_name = pipeline.head["name"]
        self._filters = [numcodec(c) for c in reversed(pipeline.filters)]
        self._numcodecs = pipeline.numcodecs_decoded

    def decompress_many(self, chunks: Sequence[Any], nbytes: int) -> np.ndarray:
        """Chunks that all decompress to ``nbytes``, as a ``(len(chunks), nbytes)`` uint8
        array; a chunk that fails raises :class:`ChunkDecodeError` with its index."""
        data: Sequence[Any] = chunks
        for stage in self.stages:
            try:
                data = list(map(stage, data, itertools.repeat(nbytes)))
            except Exception:  # find the chunk, for the message
                for k, chunk in enumerate(data):
                    try:
                        stage(chunk, nbytes)
                    except Exception as e:
                        raise ChunkDecodeError(k, f"{type(e).__name__}: {e}") from None
                raise
        sizes = np.fromiter(map(len, data), np.int64, len(data))
        wrong = np.flatnonzero(sizes != nbytes)
        if len(wrong):
            k = int(wrong[0])
            raise ChunkDecodeError(k, f"decoded to {sizes[k]} bytes, expected {nbytes}")
        raw = np.frombuffer(b"".join(data), np.uint8).reshape(len(data), nbytes)
        return raw if self.shuffle is None else unshuffle(raw, self.shuffle)

    def to_array(self, data: Any, shape: Sequence[int]) -> np.ndarray:
        """The values of one decompressed chunk, shaped like its encoded ``shape``."""
        count = math.prod(shape)
        if self._numcodecs:
            decoded: Any = data if self._head is None else self._head.decode(data)
            for codec in self._filters:
                decoded = codec.decode(decoded)
            values = np.asarray(decoded) if isinstance(decoded, np.ndarray) else np.frombuffer(
                decoded, self.dtype)
            if values.dtype != self.dtype:  # as Zarr v2 does: the filters' output as dtype
                values = np.ascontiguousarray(values).reshape(-1).view(self.dtype)
            return values.reshape(shape)
        if self._head_name in ("vlen-utf8", "vlen-bytes"):
            vlen = numcodecs.VLenUTF8() if self._head_name == "vlen-utf8" else \
                numcodecs.VLenBytes()
            return np.asarray(vlen.decode(data), dtype=object).reshape(shape)
        if len(data) != count * self.stored.itemsize:
            raise ValueError(f"decoded to {len(data)} bytes, expected "
                             f"{count * self.stored.itemsize} for shape {tuple(shape)}")
        return np.frombuffer(data, dtype=self.stored, count=count).reshape(shape)

    def decode(self, data: Any, shape: Sequence[int]) -> np.ndarray:
        """Decode one stored chunk (fletcher32 checksums are verified by its decoder)."""
        nbytes = math.prod(shape) * self.dtype.itemsize
        for stage in self.stages:
            data = stage(data, nbytes)
        if self.shuffle is not None:
            data = hdf5_shuffle_decode(data, self.shuffle)
        return self.to_array(data, shape)


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


LIBDEFLATE_FROM = 2048
"""Decoded chunk size from which libdeflate beats zlib (its call costs ~1 µs more, its
inflating ~30% less)."""


def _zlib_decoder(exact: bool, nbytes: int) -> Callable[[Any, int], Any]:
    """zlib (HDF5's deflate): libdeflate for chunks that are not tiny when the decoded size is
    exact, else the standard library (which grows its buffer as needed)."""
    if exact and nbytes >= LIBDEFLATE_FROM:
        return lambda data, size: imagecodecs.deflate_decode(data, out=size)
    return lambda data, size: zlib.decompress(data, zlib.MAX_WBITS, size)


@functools.lru_cache(maxsize=256)
def _decoder(codecs_json: str, dtype: np.dtype, chunk_nbytes: int) -> ChunkDecoder:
    return ChunkDecoder(json.loads(codecs_json), dtype, chunk_nbytes)


def chunk_decoder(codecs: Sequence[Mapping[str, Any]], dtype: np.dtype,
                  chunk_shape: Sequence[int]) -> ChunkDecoder:
    """The (cached) decoder of an array's codec list, for chunks of about ``chunk_shape``."""
    nbytes = math.prod(chunk_shape) * dtype.itemsize
    return _decoder(json.dumps(list(codecs), sort_keys=True), dtype, nbytes)


def decode_chunk(data: bytes, codecs: Sequence[Mapping[str, Any]], dtype: np.dtype,
                 shape: Sequence[int]) -> np.ndarray:
    """Decode one stored chunk to an array of its encoded ``shape``."""
    return chunk_decoder(codecs, dtype, shape).decode(data, shape)
