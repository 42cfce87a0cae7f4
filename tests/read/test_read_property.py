"""refgrid's reader against numpy on random grids: padded and short chunks, missing and inline
chunks, any orthogonal selection, boxes small enough to split every read, threads or not."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import refgrid.read.array as reader
from grid_strategies import axis_index, grids
from refgrid.codecs.filters import bytes_codec
from refgrid.codecs.pipeline import encode_chunk
from refgrid.model.manifest import INLINE, MISSING, ChunkManifest
from refgrid.model.virtual import VirtualArray

FILL = -99
CODECS = {
    "plain": lambda dtype: (bytes_codec(dtype),),
    "shuffle+zlib": lambda dtype: (bytes_codec(dtype), {
        "name": "numcodecs.shuffle", "configuration": {"elementsize": dtype.itemsize}},
        {"name": "numcodecs.zlib", "configuration": {"level": 1}}),
}


@st.composite
def stored_arrays(draw):
    """A source array, and a virtual array whose chunks hold it (some missing or inline)."""
    grid = draw(grids())
    dtype = np.dtype(draw(st.sampled_from(["<f4", ">i2", "<i8"])))
    codecs = CODECS[draw(st.sampled_from(sorted(CODECS)))](dtype)
    kinds = draw(st.lists(st.sampled_from(["stored", "stored", "missing", "inline"]),
                          min_size=grid.nchunks, max_size=grid.nchunks))
    return grid, dtype, codecs, kinds


def build(tmp_path, grid, dtype, codecs, kinds):
    source = np.arange(int(np.prod(grid.shape)), dtype=dtype).reshape(grid.shape)
    expected = source.copy()
    counts = grid.chunk_counts
    path_id = np.full(counts, MISSING, np.int32)
    offset = np.zeros(counts, np.uint64)
    length = np.zeros(counts, np.uint64)
    inline = {}
    blob = bytearray(b"header")
    for kind, coords in zip(kinds, np.ndindex(counts), strict=True):
        region = grid.chunk_region(coords)
        if kind == "missing":
            expected[region] = FILL
            continue
        block = np.full(grid.encoded_chunk_shape(coords), -7, dtype=dtype)  # -7: padding
        block[tuple(slice(0, r.stop - r.start) for r in region)] = source[region]
        data = encode_chunk(block, codecs)
        if kind == "inline":
            inline[coords], path_id[coords] = data, INLINE
        else:
            path_id[coords], offset[coords], length[coords] = 0, len(blob), len(data)
            blob += data + b"gap"
    path = tmp_path / "source.bin"
    path.write_bytes(bytes(blob))
    manifest = ChunkManifest((str(path),), path_id, offset, length, inline)
    dims = tuple(f"d{k}" for k in range(grid.ndim))
    return VirtualArray("v", dims, dtype, grid, manifest, FILL, codecs), expected


@pytest.mark.parametrize("box_bytes,parallel_bytes", [(1, 1), (64, 10**9), (2**20, 1)],
                         ids=["one-chunk boxes, threads", "small boxes", "one box, threads"])
@settings(max_examples=150, deadline=None,  # (the patched limits hold for every example)
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=stored_arrays(), data=st.data())
def test_reads_equal_numpy(tmp_path_factory, monkeypatch, box_bytes, parallel_bytes, case,
                           data):
    monkeypatch.setattr(reader, "BOX_BYTES", box_bytes)
    monkeypatch.setattr(reader, "PARALLEL_BYTES", parallel_bytes)
    array, expected = build(tmp_path_factory.mktemp("read"), *case)
    selection = tuple(data.draw(axis_index(n)) for n in array.shape)
    want = expected
    for axis, index in reversed(list(enumerate(selection))):
        want = np.take(want, np.arange(array.shape[axis])[index], axis=axis)
    got = reader.read(array, selection)
    assert got.dtype == array.dtype.newbyteorder("=")
    np.testing.assert_array_equal(got, want)
