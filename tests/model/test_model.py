"""ChunkManifest, VirtualArray and VirtualGroup: validation, equality, slicing, concatenation."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from refgrid import ChunkManifest, ModelError, RectilinearGrid, VirtualArray, VirtualGroup
from refgrid.model.manifest import INLINE, MISSING
from refgrid.model.virtual import same_value


def _file_array(url: str, ntime: int, chunk: int = 10, fill=np.nan) -> VirtualArray:
    grid = RectilinearGrid.regular([ntime, 4], [chunk, 4])
    n = grid.chunk_counts
    offset = (np.arange(np.prod(n)) * 1000 + 4096).reshape(n)
    return VirtualArray(
        name="tas", dims=("time", "lon"), dtype=np.dtype("float32"), grid=grid,
        manifest=ChunkManifest((url,), np.zeros(n, np.int32), offset, np.full(n, 160)),
        fill_value=fill, codecs=({"name": "bytes", "configuration": {"endian": "little"}},),
        attrs={"units": "K", "_FillValue": np.float32(np.nan)},
    )


def test_manifest_of_a_million_chunks_fits_in_40_mb():
    shape = (1_000_000,)
    tracemalloc.start()
    m = ChunkManifest(("s3://bucket/a.nc",), np.zeros(shape, np.int32),
                      np.arange(shape[0], dtype=np.uint64), np.full(shape, 4096, np.uint64))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert m.nbytes == 20 * 1_000_000
    assert peak <= 40 * 2**20


def test_manifest_validation():
    with pytest.raises(ModelError, match="different shapes"):
        ChunkManifest((), np.zeros(3), np.zeros(3), np.zeros(4))
    with pytest.raises(ModelError, match=r"path ids must lie in \[-2, 1\)"):
        ChunkManifest(("a",), np.array([0, 1]), np.zeros(2), np.zeros(2))
    with pytest.raises(ModelError, match="inline chunks disagree"):
        ChunkManifest((), np.array([INLINE, MISSING]), np.zeros(2), np.zeros(2))
    with pytest.raises(ModelError, match=r"disagree.*\(1,\)"):  # the wrong chunk
        ChunkManifest((), np.array([INLINE, MISSING]), np.zeros(2), np.zeros(2),
                      {(1,): b"\x00"})
    with pytest.raises(ModelError, match=r"disagree.*\(5,\)"):  # beyond the grid
        ChunkManifest((), np.array([INLINE, MISSING]), np.zeros(2), np.zeros(2),
                      {(0,): b"\x00", (5,): b"\x00"})
    for keys in ({(0.0,): b"\x00"}, {(0,): b"\x00", (0, 1): b"\x00"}, {("0",): b"\x00"},
                 {(True,): b"\x00"}):  # not chunk coordinates
        with pytest.raises(ModelError, match="disagree"):
            ChunkManifest((), np.array([INLINE, MISSING]), np.zeros(2), np.zeros(2), keys)
    with pytest.raises(ModelError, match="disagree"):  # a 0-d manifest's key is ()
        ChunkManifest((), np.array(INLINE), np.zeros(()), np.zeros(()), {(0,): b"\x00"})
    assert ChunkManifest((), np.array(INLINE), np.zeros(()), np.zeros(()),
                         {(): b"\x00"}).inline == {(): b"\x00"}
    m = ChunkManifest((), np.array([INLINE, MISSING]), np.zeros(2), np.zeros(2),
                      {(0,): b"\x00\x01"})
    assert m.missing.tolist() == [False, True]
    assert m.urls().tolist() == [None, None]


def test_manifest_concat_merges_url_tables_and_shifts_inline_chunks():
    a = ChunkManifest(("x", "y"), np.array([[1], [INLINE]]), np.array([[5], [0]]),
                      np.array([[7], [0]]), {(1, 0): b"A"})
    b = ChunkManifest(("y", "z"), np.array([[MISSING], [1], [INLINE]]), np.zeros((3, 1)),
                      np.array([[0], [9], [0]]), {(2, 0): b"B"})
    m = ChunkManifest.concat([a, b], 0)
    assert m.paths == ("x", "y", "z")
    assert m.urls()[:, 0].tolist() == ["y", None, None, "z", None]
    assert m.path_id[:, 0].tolist() == [1, INLINE, MISSING, 2, INLINE]
    assert dict(m.inline) == {(1, 0): b"A", (4, 0): b"B"}
    assert m.slice(0, slice(3, 5)) == ChunkManifest(
        ("z",), np.array([[0], [INLINE]]), np.zeros((2, 1)), np.array([[9], [0]]),
        {(1, 0): b"B"})
    with pytest.raises(ModelError, match="cannot join manifests"):
        ChunkManifest.concat([a, ChunkManifest.empty((1, 2))], 0)


def test_manifest_equality_compares_urls_not_table_order():
    a = ChunkManifest(("p", "q"), np.array([0, 1]), np.zeros(2), np.ones(2))
    b = ChunkManifest(("q", "p"), np.array([1, 0]), np.zeros(2), np.ones(2))
    c = ChunkManifest(("q", "p"), np.array([0, 1]), np.zeros(2), np.ones(2))
    assert a == b
    assert a != c


def test_array_concat_builds_the_irregular_grid_and_manifest():
    parts = [_file_array(f"m{k}.nc", n) for k, n in enumerate((31, 28, 31))]
    joined = VirtualArray.concat(parts, "time")
    assert joined.shape == (90, 4)
    assert joined.grid.lengths(0).tolist() == [10, 10, 10, 1, 10, 10, 8, 10, 10, 10, 1]
    assert joined.manifest.urls()[:, 0].tolist() == ["m0.nc"] * 4 + ["m1.nc"] * 3 + ["m2.nc"] * 4
    assert joined.attrs["units"] == "K"
    # slicing undoes concatenation (equality treats NaN fill values and attributes as equal)
    assert joined.slice("time", 31, 59) == parts[1]
    assert joined.slice("time", 0, 31) == parts[0]


def test_array_concat_reports_every_conflict():
    a = _file_array("a.nc", 31)
    b = VirtualArray("tas", ("time", "lon"), np.dtype("int16"), a.grid, a.manifest,
                     fill_value=-1, codecs=a.codecs)
    with pytest.raises(ModelError, match=r"#1 has dtype dtype\('int16'\), #0 has "
                                         r"dtype\('float32'\); #1 has fill value -1"):
        VirtualArray.concat([a, b], "time")
    with pytest.raises(ModelError, match="has no dimension 'lat'"):
        VirtualArray.concat([a, a], "lat")
    with pytest.raises(ModelError, match="chunked differently"):
        VirtualArray.concat([a, _rechunked_lon(a)], "time")
    with pytest.raises(ModelError, match="start 5 falls inside chunk 0"):
        a.slice("time", 5, 10)


def _rechunked_lon(a: VirtualArray) -> VirtualArray:
    grid = RectilinearGrid.regular(a.shape, [10, 2])
    return VirtualArray(a.name, a.dims, a.dtype, grid, ChunkManifest.empty(grid.chunk_counts),
                        a.fill_value, a.codecs, a.attrs)


def test_array_validation():
    grid = RectilinearGrid.regular([10], [5])
    with pytest.raises(ModelError, match="2 dimension names"):
        VirtualArray("v", ("a", "b"), np.dtype("i4"), grid, ChunkManifest.empty((2,)))
    with pytest.raises(ModelError, match=r"manifest of \(3,\) chunks for a grid of \(2,\)"):
        VirtualArray("v", ("a",), np.dtype("i4"), grid, ChunkManifest.empty((3,)))


def test_group_navigation_and_equality():
    tas = _file_array("a.nc", 10)
    inner = VirtualGroup(attrs={"title": "inner"}, arrays={"tas": tas})
    root = VirtualGroup(attrs={"Conventions": "CF-1.8"}, groups={"model": inner})
    assert root["model/tas"] is tas
    assert root["/model"] is inner
    assert [p for p, _ in root.walk()] == ["model", "model/tas"]
    with pytest.raises(KeyError, match="no array or group 'model/pr'"):
        root["model/pr"]
    assert root == VirtualGroup({"Conventions": "CF-1.8"}, groups={
        "model": VirtualGroup({"title": "inner"}, {"tas": _file_array("a.nc", 10)})})
    assert root != VirtualGroup({"Conventions": "CF-1.9"}, groups={"model": inner})
    with pytest.raises(ModelError, match="both an array and a group"):
        VirtualGroup(arrays={"x": tas}, groups={"x": inner})


@pytest.mark.parametrize(("a", "b", "equal"), [
    (np.nan, np.float32(np.nan), True),
    ([1, np.nan], np.array([1.0, np.nan]), True),
    ({"a": [1, 2]}, {"a": [1, 2]}, True),
    ({"a": [1, 2]}, {"a": [1, 3]}, False),
    (np.array([1, 2]), np.array([1, 2, 3]), False),
    ("K", "K", True),
    (1.0, 2.0, False),
])
def test_same_value(a, b, equal):
    assert same_value(a, b) is equal


def test_chunks_inlined_in_bulk_are_those_inlined_one_by_one():
    """A parquet record file's 10^5 inline chunks are made in one call: the same manifest
    as a chunk at a time, earlier inline bytes of a chunk replaced."""
    from refgrid.model.manifest import ManifestBuilder, chunk_coords

    shape, flat = (4, 3, 2), np.array([0, 5, 7, 23])
    data = [bytes([k]) * (k + 1) for k in range(len(flat))]
    one, bulk = ManifestBuilder(shape), ManifestBuilder(shape)
    for b in (one, bulk):
        b.inlined((0, 2, 1), b"old")  # flat 5
        b.range((1, 0, 0), "f.nc", 10, 20)  # flat 6
    for k, d in zip(flat.tolist(), data, strict=True):
        one.inlined(chunk_coords(k, shape), d)
    bulk.inlined_many(flat, data)
    assert one.build() == bulk.build()
    assert dict(bulk.build().inline)[(0, 2, 1)] == data[1]
    scalar = ManifestBuilder(())
    scalar.inlined_many(np.array([0]), [b"x"])
    assert dict(scalar.build().inline) == {(): b"x"}


@pytest.mark.parametrize(("shape", "chunks", "pieces"), [
    ((9000, 2), (4096, 2), True),    # refgrid's pieces: the last one padded
    ((30, 2), (30, 2), True),        # shorter than a piece: one chunk of its length
    ((60, 2), (30, 2), False),       # a file's chunks (time bounds of files of 30 steps)
    ((9000, 3), (4096, 4), False),   # chunks not whole along the others: not slices of it
])
def test_an_array_in_pieces_is_what_in_pieces_stores(shape, chunks, pieces):
    from refgrid.codecs.filters import bytes_codec
    from refgrid.model.virtual import in_pieces

    like = VirtualArray("t", ("time", "nv"), np.dtype("<f8"),
                        RectilinearGrid.regular(shape, shape),
                        ChunkManifest.empty((1, 1)), codecs=(bytes_codec(np.dtype("<f8")),))
    data = np.arange(np.prod(shape), dtype="<f8").tobytes()
    array = in_pieces(like, data, shape, chunks[0])
    if chunks[1] != shape[1]:  # (the same chunks, declared wider than the array)
        array = VirtualArray("t", array.dims, array.dtype,
                             RectilinearGrid.regular(shape, chunks), array.manifest,
                             codecs=array.codecs)
    assert array.inline_pieces is pieces
    assert array.inline_bytes is (chunks[1:] == shape[1:])
