"""Reliability, hostile references: bounded work, named errors, no reads outside the sources.

Each input is small; what it asks for is not. Every case must end in a RefgridError within a
fraction of a second and a few MB, before anything the size of the request is allocated.
"""

from __future__ import annotations

import base64
import json
import shutil
import time
import tracemalloc
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import xarray as xr

import refgrid
from helpers import FIXTURES, closed

GROUP = json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}})


def _array(shape: list[int], chunks: list[int], codecs: list[dict] | None = None,
           dtype: str = "float64", fill: Any = 0.0, grid: dict | None = None) -> str:
    return json.dumps({
        "zarr_format": 3, "node_type": "array", "shape": shape, "data_type": dtype,
        "chunk_grid": grid or {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill, "codecs": codecs or [{"name": "bytes",
                                                  "configuration": {"endian": "little"}}],
        "attributes": {}, "dimension_names": [f"d{k}" for k in range(len(shape))]})


def _refs(array: str, chunks: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"version": 1, "refs": {"zarr.json": GROUP, "a/zarr.json": array, **(chunks or {})},
            **extra}


def _bounded(action: Callable[[], Any], seconds: float = 2.0, megabytes: int = 50) -> None:
    """``action`` raises a RefgridError, within the CPU time (a loaded machine does not trip
    it) and memory given."""
    tracemalloc.start()
    start = time.process_time()
    try:
        with pytest.raises(refgrid.RefgridError):
            action()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert time.process_time() - start < seconds
    assert peak < megabytes * 2**20, f"{peak / 2**20:.0f} MB"


def _read(refs: Any) -> Callable[[], Any]:
    return lambda: xr.open_dataset(refs, engine="refgrid")["a"][:5].values


# -- bounded work ----------------------------------------------------------------------------

def test_a_grid_of_too_many_chunks_is_refused_at_open():
    """5x10^7 chunks declared in 500 bytes cost 6 s and 1.9 GB."""
    _bounded(_read(_refs(_array([10**9, 10**9], [1, 1]))))
    runs = {"name": "rectilinear", "configuration": {"kind": "inline",
                                                     "chunk_shapes": [[[1, 10**12]]]}}
    _bounded(_read(_refs(_array([10**12], [1], grid=runs))))  # runs never expanded that far
    with refgrid.limits(max_chunks=10):
        _bounded(_read(_refs(_array([100], [1]))))


def test_a_generator_of_10_to_the_10_keys_is_refused():
    """A gen of 10^5 x 10^5 hung."""
    gen = [{"key": "a/c/{{i}}", "url": "x.nc", "offset": 0, "length": 1,
            "dimensions": {"i": {"stop": 10**5}, "j": {"stop": 10**5}}}]
    _bounded(_read(_refs(_array([10], [1]), gen=gen)))


def test_a_template_of_a_megabyte_is_refused():
    """A 1 MB template used by 20k keys expanded to 20 GB."""
    refs = _refs(_array([20_000], [1]), {f"a/c/{k}": ["{{u}}", 0, 1] for k in range(20_000)},
                 templates={"u": "x" * 2**20})
    _bounded(_read(refs))


def test_a_zlib_bomb_is_not_inflated():
    """A 9 MB zlib chunk inflated to 2 GiB before the size check."""
    bomb = zlib.compress(bytes(2**27))  # 128 MiB of zeros in 130 KB
    refs = _refs(_array([10], [10], [{"name": "bytes", "configuration": {"endian": "little"}},
                                     {"name": "zlib", "configuration": {"level": 1}}]),
                 {"a/c/0": "base64:" + base64.b64encode(bomb).decode()})
    _bounded(_read(refs), megabytes=20)


def test_a_chunk_of_10_to_the_15_elements_is_not_allocated(tmp_path):
    """A 5-element read of a shape-10^15 array tried to allocate 909 TiB."""
    data = tmp_path / "data.bin"
    data.write_bytes(zlib.compress(bytes(64)))
    refs = _refs(_array([10**15], [10**15], [{"name": "bytes",
                                              "configuration": {"endian": "little"}},
                                             {"name": "zlib", "configuration": {"level": 1}}]),
                 {"a/c/0": [str(data), 0, data.stat().st_size]})
    _bounded(_read(refs))


# -- named errors ----------------------------------------------------------------------------

@pytest.mark.parametrize("refs, key", [
    (_refs(_array([4], [2]), {"a/c/0": ["f.nc", -1, 8]}), "a/c/0"),
    (_refs(_array([4], [2]), {"a/c/0": ["f.nc", 0, 2**64]}), "a/c/0"),
    (_refs(_array([4], [2]), {"a/c/0": ["f.nc", "zero", 8]}), "a/c/0"),
    (_refs(_array([4], [2]), {"a/c/0": [7, 0, 8]}), "a/c/0"),
    (_refs(_array([4], [2]), {"a/c/0": "base64:%%%not base64%%%"}), "a/c/0"),
    (_refs(_array([4], [2], dtype="float128")), "a"),
    (_refs(_array([4], [2], dtype="int8", fill=10**6)), "a"),
    (_refs("[1, 2, 3]"), "a/zarr.json"),
    (_refs("base64:@@@@"), "a/zarr.json"),
], ids=["negative offset", "huge length", "text offset", "numeric URL", "bad base64",
        "unknown dtype", "fill overflows", "metadata a list", "metadata bad base64"])
def test_damaged_references_name_the_key(refs, key):
    with pytest.raises(refgrid.FormatError, match=key.split("/")[0]):
        refgrid.scan(refs)


@pytest.mark.parametrize("content", [b"[1, 2]", b"null", b"42", b'"text"', b"{", b""])
def test_reference_files_that_are_not_objects(tmp_path, content):
    path = tmp_path / "refs.json"
    path.write_bytes(content)
    with pytest.raises(refgrid.FormatError, match=r"refs\.json"):
        xr.open_dataset(path, engine="refgrid")


# -- reading only what the references may read -----------------------------------------------

@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory):
    from servers import start_http

    root = tmp_path_factory.mktemp("hostile")
    shutil.copytree(FIXTURES / "monthly" / "chunk10", root / "data")
    yield from start_http(root)


def _pointing_at(target: str) -> dict[str, Any]:
    return _refs(_array([8], [8], dtype="uint8"), {"a/c/0": [target, 0, 8]})


@pytest.mark.parametrize("target", ["/proc/self/environ", "file:///etc/hostname",
                                    "../../etc/hostname",
                                    "http://example.invalid/x.nc"])
def test_remote_references_read_only_their_own_host(hostile_server, tmp_path, target):
    """References fetched over HTTP could make refgrid read any local file."""
    refs = _pointing_at(target.format(server=hostile_server.url))
    (hostile_server.root / "refs.json").write_text(json.dumps(refs))
    url = f"{hostile_server.url}/refs.json"
    with pytest.raises(refgrid.AccessError, match="outside the allowed sources"):
        xr.open_dataset(url, engine="refgrid")
    with pytest.raises(refgrid.AccessError):
        refgrid.get_mapper(url)


def test_allowed_sources_limit_local_references_too(tmp_path):
    refs = _pointing_at("/etc/hostname")
    with pytest.raises(refgrid.AccessError, match="'/etc/hostname'"):
        refgrid.scan(refs, allowed_sources=[str(tmp_path)])
    sibling = tmp_path.parent / (tmp_path.name + "-secret")
    with pytest.raises(refgrid.AccessError):  # a prefix is a directory, not a string prefix
        refgrid.scan(_pointing_at(str(sibling / "x")), allowed_sources=[str(tmp_path)])
    with pytest.raises(refgrid.AccessError):  # ".." is resolved before the check
        refgrid.scan(_pointing_at(f"{tmp_path}/../{tmp_path.name}-secret/x"),
                     allowed_sources=[str(tmp_path)])


def test_remote_references_to_their_own_host_read(hostile_server):
    source = f"{hostile_server.url}/data/tas_200101.nc"
    (hostile_server.root / "own.json").write_text(json.dumps(refgrid.to_kerchunk(
        refgrid.scan(source))))
    ds = xr.open_dataset(f"{hostile_server.url}/own.json", engine="refgrid").load()
    np.testing.assert_array_equal(
        ds["tas"].values, closed(xr.open_dataset(FIXTURES / "monthly" / "chunk10" /
                                          "tas_200101.nc"))["tas"].values)
