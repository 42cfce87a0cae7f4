"""A growing archive's served views: what a reader learnt from one version stays true in the
next.

A reader opens version N (its metadata), then reads chunks while N+1 is published. Here the
store such a reader sees is built for real — every document of N's view, every chunk key of
N answered by N+1's view — and read by zarr and xarray: the values must be N's, as
``xr.open_mfdataset`` reads N's files. Appends are made by ``refgrid.batch`` (the path a
followed archive takes), and the concat coordinate's pieces are made small so appends fill
one and start the next.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

import refgrid
from archive_files import write_archive
from helpers import RECTILINEAR, closed
from refgrid.model import virtual
from refgrid.read import native, view_chunks
from refgrid.read.native import NativeView
from refgrid.read.regular import RegularView, ViewSpec
from refgrid.read.view import Chunk, Document

PIECE = 40
"""The concat coordinate's pieces in these tests (4096 in the service): served in pieces of
its one stored chunk, or stored in pieces (an archive written with them)."""

VIEWS = {
    "native": lambda g: NativeView(g, growing="time"),
    "regular auto": lambda g: RegularView(g, growing="time"),
    "regular native": lambda g: RegularView(g, ViewSpec.parse("native", None), growing="time"),
    "regular time:15": lambda g: RegularView(g, ViewSpec.parse("time:15", None),
                                             growing="time"),
}


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch):
    for module in (native, view_chunks, virtual):
        monkeypatch.setattr(module, "INLINE_PIECE", PIECE)


@pytest.fixture(scope="module", params=["one chunk", "in pieces"])
def versions(tmp_path_factory, request) -> list[tuple[list[Path], refgrid.VirtualGroup]]:
    """Versions of one archive of 2, 3, 4 and 6 files, each appended to the one before; its
    time coordinate one inline chunk (58 to 174 steps in pieces of 4,096) or stored in
    pieces of :data:`PIECE` (the first version: two)."""
    root = tmp_path_factory.mktemp("growing")
    files = write_archive(root / "landing", range(6))
    out, found = root / "tas.parq", []
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "in pieces":
            patch.setattr(virtual, "INLINE_PIECE", PIECE)
        for n in (2, 3, 4, 6):
            result = refgrid.batch([str(f) for f in files[:n]], out, progress=False,
                                   scheduler="synchronous")
            assert n == 2 or result.update.startswith("append"), result.update
            found.append((files[:n], refgrid.scan(out)))
    pieces = {found[-1][1]["time"].grid.chunk_counts[0]}
    assert pieces == ({1} if request.param == "one chunk" else {5}), pieces
    return found


def hybrid(before, after, where: Path) -> Path:
    """The store a reader holding ``before``'s metadata sees once ``after`` is published."""
    for key in before.all_keys():
        parsed = before.parse(key)
        if isinstance(parsed, Document):
            content = parsed.text
        else:
            assert isinstance(parsed, Chunk)
            later = after.parse(key)
            assert isinstance(later, Chunk), f"{key} of the earlier version is gone"
            content = after.read([later])[0]
        (where / key).parent.mkdir(parents=True, exist_ok=True)
        (where / key).write_bytes(content)
    return where


@pytest.mark.parametrize("view", VIEWS)
def test_a_reader_of_one_version_reads_its_values_from_the_next(versions, view, tmp_path):
    if view == "native" and not RECTILINEAR:
        pytest.skip("zarr >= 3.2 reads the native view's rectilinear grids")
    make = VIEWS[view]
    for k, ((files, before), (_, after)) in enumerate(itertools.pairwise(versions)):
        store = hybrid(make(before), make(after), tmp_path / f"v{k}")
        want = closed(xr.open_mfdataset(files, combine="nested", concat_dim="time",
                                        data_vars="minimal", coords="minimal",
                                        compat="override"))
        with zarr.config.set({"array.rectilinear_chunks": True}) if RECTILINEAR else \
                zarr.config.set({}):
            got = closed(xr.open_zarr(store, zarr_format=3, consolidated=False))
        xr.testing.assert_equal(got[["tas"]], want[["tas"]])
        np.testing.assert_array_equal(got["time"].values, want["time"].values)


def test_untouched_chunks_keep_their_bytes_and_the_final_one_is_served_at_its_extent(
        versions):
    (_, before), (_, after) = versions[2], versions[3]  # 4 files end in a padded chunk
    old, new = NativeView(before, growing="time"), NativeView(after, growing="time")
    keys = [k for k in old.all_keys() if k.startswith("tas/c/")]
    assert keys and all(old.read([old.parse(k)]) == new.read([new.parse(k)]) for k in keys)
    shape = before["tas"].shape[0]
    assert sum(chunk_edges(old, "tas")) == shape  # the final chunk ends at the array's end
    assert sum(chunk_edges(NativeView(before), "tas")) > shape  # (stored padded: overflows)


def chunk_edges(view: NativeView, path: str) -> list[int]:
    import json

    doc = json.loads(view.parse(f"{path}/zarr.json").text)
    grid = doc["chunk_grid"]["configuration"]
    edges = grid.get("chunk_shapes", [None])[0] if "chunk_shapes" in grid else None
    if edges is None:
        return [grid["chunk_shape"][0]] * -(-doc["shape"][0] // grid["chunk_shape"][0])
    out: list[int] = []
    for e in edges:
        out.extend([e[0]] * e[1] if isinstance(e, list) else [e])
    return out
