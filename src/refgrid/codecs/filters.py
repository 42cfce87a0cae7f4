"""Codec JSON: the HDF5 filter table (filter → Zarr v3 codec) and how a codec list splits.

An HDF5 pipeline (data → shuffle → deflate → fletcher32) becomes the Zarr v3 codec list
``[bytes, numcodecs.shuffle, numcodecs.zlib, numcodecs.fletcher32]``. zarr ships ``numcodecs.*``
codecs for the common filters; the ones it lacks (lzf, szip, HDF5-framed lz4, bitshuffle with
HDF5 framing, HDF5's shuffle of odd lengths, and fixed-length strings read as HDF5 reads them:
:func:`string_codecs`) are ``refgrid.*`` codecs, implemented in
:mod:`refgrid.codecs.pipeline` and registered with zarr by :mod:`refgrid.codecs.zarr_v3`.
This module only describes codecs; nothing here encodes or decodes bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

import numpy as np


class CodecJSON(TypedDict):
    """One entry of a Zarr v3 ``codecs`` list."""

    name: str
    configuration: NotRequired[dict[str, Any]]


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


StringPad = Literal["nullterm", "nullpad", "spacepad", "unknown"]
"""How fixed-length strings are padded (HDF5's ``H5T_STR_*``; unknown: the source does not
say, as old DMR++ documents do not)."""
STRING_CODECS: Mapping[StringPad, str] = {"nullterm": "refgrid.nullterm",
                                          "spacepad": "refgrid.spacepad",
                                          "unknown": "refgrid.anypad"}
"""The codec that reads strings of each padding as HDF5 reads them (null-padded strings are
read as they are stored)."""


def string_codecs(itemsize: int, strings: Mapping[StringPad, Sequence[tuple[int, int]]]
                  ) -> tuple[CodecJSON, ...]:
    """The bytes→bytes codecs, decoded right after the array→bytes codec, that make an
    element of ``itemsize`` bytes read as HDF5 reads it, where ``strings`` lie in it
    (``(offset, length)`` by padding): numpy would show the bytes after a C string's NUL and
    a space-padded string's spaces, which HDF5 does not. Strings that fill the element one
    after another (a string, an array of strings) are described by their length alone; C
    strings of one byte (netCDF's ``char``) read as stored, and need none."""
    codecs: list[CodecJSON] = []
    for pad, found in strings.items():
        places = [p for p in found if p[1] > 1 or pad != "nullterm"]  # (one byte: as stored)
        if pad not in STRING_CODECS or not places:
            continue
        size = int(places[0][1])
        tiled = size and itemsize % size == 0 and [(int(o), int(n)) for o, n in places] == [
            (k * size, size) for k in range(itemsize // size)]  # (an array of strings)
        config: dict[str, Any] = {"length": size if tiled else itemsize}
        if not tiled:
            config["strings"] = [[int(o), int(n)] for o, n in places]
        codecs.append({"name": STRING_CODECS[pad], "configuration": config})
    return tuple(codecs)


def bytes_codec(dtype: np.dtype) -> CodecJSON:
    """The array→bytes codec for ``dtype`` as stored (its byte order)."""
    order = dtype.byteorder if dtype.fields is None else _struct_byteorder(dtype)
    if dtype.itemsize == 1 or order == "|":
        return {"name": "bytes"}
    big = order == ">" or (order == "=" and np.little_endian is False)
    return {"name": "bytes", "configuration": {"endian": "big" if big else "little"}}


def plain_codec(dtype: np.dtype) -> CodecJSON:
    """The codec of values served uncompressed: little-endian bytes, or vlen text/bytes."""
    if dtype.kind in "OT":
        return {"name": "vlen-utf8" if dtype.kind == "T" else "vlen-bytes"}
    return bytes_codec(dtype.newbyteorder("<") if dtype.itemsize > 1 and dtype.kind != "V"
                       else dtype)


def _struct_byteorder(dtype: np.dtype) -> str:
    assert dtype.fields is not None
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


ARRAY_TO_ARRAY = frozenset({"numcodecs.delta", "numcodecs.bitround", "numcodecs.fixedscaleoffset",
                            "numcodecs.quantize", "numcodecs.packbits", "numcodecs.astype"})
"""numcodecs filters that transform arrays (Zarr v2 ``filters``), as zarr 3 names them."""
NATIVE_HEADS = frozenset({"bytes", "vlen-utf8", "vlen-bytes"})
TRANSPOSE = "transpose"
"""Zarr v3's array→array codec: a chunk stored with its axes permuted (``order``)."""


@dataclass(frozen=True)
class Pipeline:
    """A codec list split the Zarr v3 way: array→array codecs (``transpose`` first, then
    numcodecs filters), the array→bytes codec (the head), bytes→bytes compressors. A head
    other than ``bytes``/``vlen-*`` is a numcodecs codec that decodes bytes to an array itself
    (kerchunk's GRIB or image codecs, say)."""

    filters: tuple[CodecJSON, ...]
    head: CodecJSON
    compressors: tuple[CodecJSON, ...]
    order: tuple[int, ...] | None = None
    """The axes' order in stored chunks (``transpose`` codecs composed; None: as is)."""

    @classmethod
    def of(cls, codecs: Sequence[CodecJSON]) -> Pipeline:
        names = [c["name"] for c in codecs]
        t = next((t for t, name in enumerate(names) if name != TRANSPOSE), len(codecs))
        if TRANSPOSE in names[t:]:
            raise ValueError(f"a transpose after other codecs ({names}) is not supported")
        order: tuple[int, ...] | None = None
        for codec in codecs[:t]:
            step = tuple(int(i) for i in codec.get("configuration", {})["order"])
            order = step if order is None else tuple(order[i] for i in step)
        k = next((k for k in range(t, len(codecs)) if names[k] not in ARRAY_TO_ARRAY),
                 len(codecs))
        if k == len(codecs):
            raise ValueError(f"no array→bytes codec in {names}")
        return cls(tuple(codecs[t:k]), codecs[k], tuple(codecs[k + 1:]), order)

    @property
    def endian(self) -> str | None:
        """The stored byte order the ``bytes`` codec names (None: native or not applicable)."""
        return self.head.get("configuration", {}).get("endian") if not self.filters else None

    @property
    def numcodecs_decoded(self) -> bool:
        """Decoded the Zarr v2 way: numcodecs filters and head produce the array."""
        return bool(self.filters) or self.head["name"] not in NATIVE_HEADS


def stored_dtype(dtype: np.dtype, codecs: Sequence[CodecJSON]) -> np.dtype:
    """``dtype`` in the byte order its chunks are stored in (a record's fields too: Zarr's
    ``struct`` stores every field in the ``bytes`` codec's order; raw bytes have none)."""
    endian = Pipeline.of(codecs).endian
    if not endian or dtype.itemsize == 1 or dtype.kind in "OT" or \
            (dtype.kind == "V" and dtype.fields is None):
        return dtype
    return dtype.newbyteorder(">" if endian == "big" else "<")
