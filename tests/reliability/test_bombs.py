"""Reliability, decompression bombs: every codec refgrid decodes stops at what the chunk can
hold. A reference set is untrusted input; a stream that claims (or inflates to) far more than
its chunk is a named ReadError, with memory bounded by the chunk, not by the stream."""

from __future__ import annotations

import base64
import bz2
import json
import lzma
import struct
import subprocess
import sys
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import imagecodecs
import numcodecs
import pytest
import xarray as xr

import refgrid

BYTES = {"name": "bytes", "configuration": {"endian": "little"}}
GROUP = json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}})


def _refs(codecs: list[dict[str, Any]], chunk: bytes, shape: int = 10) -> dict[str, Any]:
    """One float32 array of ``shape`` values in one chunk (40 bytes): ``chunk`` its bytes."""
    array = json.dumps({
        "zarr_format": 3, "node_type": "array", "shape": [shape], "data_type": "float32",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [shape]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0.0, "codecs": [BYTES, *codecs], "attributes": {},
        "dimension_names": ["x"]})
    return {"version": 1, "refs": {"zarr.json": GROUP, "a/zarr.json": array,
                                   "a/c/0": "base64:" + base64.b64encode(chunk).decode()}}


def _gzip(size: int) -> bytes:
    """A gzip stream of ``size`` zero bytes, made a MiB at a time."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(2**20)
    return b"".join([*(packer.compress(block) for _ in range(size // 2**20)), packer.flush()])


def _zlib(size: int) -> bytes:
    packer = zlib.compressobj(9)
    block = bytes(2**20)
    return b"".join([*(packer.compress(block) for _ in range(size // 2**20)), packer.flush()])


MIB = 2**20
BOMBS: dict[str, tuple[list[dict[str, Any]], Any]] = {
    "gzip": ([{"name": "gzip", "configuration": {"level": 1}}], lambda n: _gzip(n)),
    "numcodecs.gzip": ([{"name": "numcodecs.gzip", "configuration": {"level": 1}}],
                       lambda n: _gzip(n)),
    "numcodecs.zlib": ([{"name": "numcodecs.zlib", "configuration": {"level": 1}}],
                       lambda n: _zlib(n)),
    "zstd": ([{"name": "zstd", "configuration": {"level": 1, "checksum": False}}],
             lambda n: bytes(imagecodecs.zstd_encode(bytes(n)))),
    "numcodecs.zstd": ([{"name": "numcodecs.zstd", "configuration": {"level": 1}}],
                       lambda n: bytes(numcodecs.Zstd(1).encode(bytes(n)))),
    "blosc": ([{"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5,
                                                   "shuffle": "noshuffle", "typesize": 1,
                                                   "blocksize": 0}}],
              lambda n: bytes(numcodecs.Blosc("lz4", 5, 0).encode(bytes(n)))),
    "numcodecs.lz4": ([{"name": "numcodecs.lz4", "configuration": {"acceleration": 1}}],
                      lambda n: bytes(numcodecs.LZ4().encode(bytes(n)))),
    "numcodecs.bz2": ([{"name": "numcodecs.bz2", "configuration": {"level": 1}}],
                      lambda n: bz2.compress(bytes(n), 1)),
    "numcodecs.lzma": ([{"name": "numcodecs.lzma", "configuration": {}}],
                       lambda n: lzma.compress(bytes(n))),
    "refgrid.lzf": ([{"name": "refgrid.lzf", "configuration": {}}],
                    lambda n: bytes(imagecodecs.lzf_encode(bytes(n)))),
    "refgrid.lz4h5": ([{"name": "refgrid.lz4h5", "configuration": {}}],
                      lambda n: bytes(imagecodecs.lz4h5_encode(bytes(n)))),
    "refgrid.bitshuffle": ([{"name": "refgrid.bitshuffle", "configuration": {
        "itemsize": 4, "blocksize": 0, "compression": "lz4"}}],
        lambda n: struct.pack(">QI", n, 8192) + bytes(64)),
}


@pytest.mark.parametrize("name", BOMBS)
def test_a_bomb_is_refused_naming_array_chunk_and_source(name):
    """Each codec, 64 MiB of zeros for a 40-byte chunk: refused within a few MB traced
    (lzma's decoder holds its 8 MiB dictionary whatever the stream)."""
    codecs, make = BOMBS[name]
    refs = _refs(codecs, make(64 * MIB))
    tracemalloc.start()
    try:
        with pytest.raises(refgrid.ReadError, match=r"array 'a'.*a/c/0"):
            xr.open_dataset(refs, engine="refgrid")["a"].values  # noqa: B018
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 16 * MIB, f"{name}: {peak / MIB:.0f} MB traced"


@pytest.mark.parametrize("name", BOMBS)
def test_an_honest_chunk_of_every_codec_still_reads(name):
    """The bounds refuse bombs only: the chunk's own 40 bytes, through the same codec."""
    codecs, _ = BOMBS[name]
    values = bytes(range(40))
    ds = xr.open_dataset(_refs(codecs, _encode(name, values, codecs[0])), engine="refgrid",
                         mask_and_scale=False)
    assert ds["a"].values.tobytes() == values


def _gzip_of(data: bytes) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def _encode(name: str, data: bytes, codec: dict[str, Any]) -> bytes:
    from refgrid.codecs.pipeline import bitshuffle_encode

    return {
        "gzip": lambda: _gzip_of(data),
        "numcodecs.gzip": lambda: _gzip_of(data),
        "refgrid.bitshuffle": lambda: bitshuffle_encode(data, codec["configuration"]),
        "numcodecs.zlib": lambda: zlib.compress(data),
        "zstd": lambda: bytes(imagecodecs.zstd_encode(data)),
        "numcodecs.zstd": lambda: bytes(numcodecs.Zstd(1).encode(data)),
        "blosc": lambda: bytes(numcodecs.Blosc("lz4", 5, 0).encode(data)),
        "numcodecs.lz4": lambda: bytes(numcodecs.LZ4().encode(data)),
        "numcodecs.bz2": lambda: bz2.compress(data),
        "numcodecs.lzma": lambda: lzma.compress(data),
        "refgrid.lzf": lambda: bytes(imagecodecs.lzf_encode(data)),
        "refgrid.lz4h5": lambda: bytes(imagecodecs.lz4h5_encode(data)),
    }[name]()


PEAK = """
import json, resource, sys
import xarray as xr, zarr
import refgrid
refs = json.load(open(sys.argv[1]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    exec(sys.argv[2])
    print("read")
except refgrid.ReadError as e:
    print("refused:", e)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("grew", (after - before) * 1024)
"""
ENGINE = "xr.open_dataset(refs, engine='refgrid')['a'].values"


def _peak(refs: dict[str, Any], tmp_path: Path, read: str = ENGINE) -> tuple[str, int]:
    """Read ``refs`` with ``read`` in a fresh process: what it printed first (``refused:
    ...``), and by how much its peak memory grew."""
    path = tmp_path / "refs.json"
    path.write_text(json.dumps(refs))
    done = subprocess.run([sys.executable, "-c", PEAK, str(path), read], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    return lines[0], int(lines[-1].split()[-1])


@pytest.mark.parametrize("name", ["gzip", "zstd", "blosc"])
def test_a_half_gigabyte_bomb_peaks_far_below_its_size(name, tmp_path: Path):
    """The acceptance figure: a 512 MiB gzip/zstd/blosc stream for a 40-byte chunk, read in
    a fresh process, raises its peak memory by less than 200 MB."""
    codecs, make = BOMBS[name]
    first, grew = _peak(_refs(codecs, make(512 * MIB)), tmp_path)
    assert first.startswith("refused: ") and "a/c/0" in first, first
    print(f"{name}: 512 MiB stream, peak grew {grew / MIB:.1f} MB")
    assert grew < 200 * MIB, f"{name}: peak grew {grew / MIB:.0f} MB"


def _vlen_refs(chunk: bytes, shape: int = 10) -> dict[str, Any]:
    """One array of ``shape`` strings in one chunk, behind Zarr v3's core ``gzip``."""
    array = json.dumps({
        "zarr_format": 3, "node_type": "array", "shape": [shape], "data_type": "string",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [shape]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": "", "codecs": [{"name": "vlen-utf8"},
                                     {"name": "gzip", "configuration": {"level": 1}}],
        "attributes": {}, "dimension_names": ["x"]})
    return {"version": 1, "refs": {"zarr.json": GROUP, "a/zarr.json": array,
                                   "a/c/0": "base64:" + base64.b64encode(chunk).decode()}}


READERS = {
    "engine": ENGINE,
    "mapper": "xr.open_dataset(refgrid.get_mapper(refs), engine='zarr')['a'].values",
    "store": "zarr.open_group(refgrid.open_store(refs), mode='r')['a'][...]",
    "store+zarr_config": "zarr.config.set(refgrid.zarr_config()); "
                         "zarr.open_group(refgrid.open_store(refs), mode='r')['a'][...]",
}


@pytest.mark.slow
@pytest.mark.parametrize("reader", READERS)
def test_a_gigabyte_gzip_bomb_of_a_text_chunk_stays_within_a_few_mb(reader, tmp_path: Path):
    """The bomb users met: 1 GiB of zeros behind Zarr v3's core ``gzip`` in a chunk of ten
    strings, whose decoded size no header states — refused at the variable-length limit
    (8 MiB) by every refgrid reader, the store included whichever pipeline zarr uses."""
    first, grew = _peak(_vlen_refs(_gzip(2**30)), tmp_path, READERS[reader])
    assert first.startswith("refused: ") and "a/c/0" in first, first
    print(f"{reader}: 1 GiB gzip stream in a text chunk, peak grew {grew / MIB:.1f} MB")
    assert grew < 40 * MIB, f"{reader}: peak grew {grew / MIB:.0f} MB"


def test_a_text_chunk_longer_than_the_limit_reads_once_the_limit_is_raised():
    """The variable-length limit refuses only what passes it: raised, the chunk reads."""
    text = ["x" * 2**20] * 10  # 10 MiB of text in one chunk
    chunk = _gzip_of(bytes(numcodecs.VLenUTF8().encode(__import__("numpy").array(
        text, dtype=object))))
    refs = _vlen_refs(chunk)
    with pytest.raises(refgrid.ReadError, match=r"a/c/0.*8,388,608"):
        xr.open_dataset(refs, engine="refgrid")["a"].values  # noqa: B018
    with refgrid.limits(max_variable_chunk_bytes=2**25):
        assert list(xr.open_dataset(refs, engine="refgrid")["a"].values) == text
