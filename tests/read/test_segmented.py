"""Reading arrays in segments: every draw of types, packing and fill markers reads, bit for
bit, as xarray decodes each part and ``xr.concat`` joins them — through the numpy steps a
kind of segment shares (:class:`refgrid.read.segmented.Plan`) as through xarray itself."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from refgrid.codecs.filters import bytes_codec
from refgrid.core.cf import mask_and_scale
from refgrid.core.dtypes import ATTRIBUTE_TYPES_ATTR, attribute_types, reader_attrs
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import ManifestBuilder
from refgrid.model.presented import joined
from refgrid.model.virtual import VirtualArray
from refgrid.read.array import read, reader_of
from refgrid.read.segmented import SegmentedReader

RAW = ["<i2", ">i2", "<i4", "<u1", "<u2", "<i1", "<f4", ">f4", "<f8"]
ROWS = 5


def _stored(attrs: dict[str, object]) -> dict[str, object]:
    """Attributes as refgrid's scanners keep them: plain values, numpy types recorded."""
    plain = {k: v.item() if isinstance(v, np.generic) else v for k, v in attrs.items()}
    types = attribute_types(attrs)
    return {**plain, **({ATTRIBUTE_TYPES_ATTR: types} if types else {})}


def _part(values: np.ndarray, attrs: dict[str, object]) -> VirtualArray:
    grid = RectilinearGrid.regular(list(values.shape), list(values.shape))
    built = ManifestBuilder(grid.chunk_counts)
    built.inlined((0, 0), values.tobytes())
    return VirtualArray("v", ("time", "x"), values.dtype, grid, built.build(), None,
                        (bytes_codec(values.dtype),), _stored(attrs))


def _number(kind: str):
    values = st.floats(0.0009765625, 100.0, allow_nan=False, width=32)
    return {"np32": values.map(np.float32), "np64": values.map(np.float64),
            "py": values}[kind]


@st.composite
def parts(draw):
    count = draw(st.integers(1, 4))
    raw = np.dtype(draw(st.sampled_from(RAW)))
    kinds = draw(st.tuples(*[st.sampled_from([None, "np32", "np64", "py"])] * 2))
    fill_kind = draw(st.sampled_from([None, "raw", "py"]))
    out = []
    for _ in range(count):
        info = np.iinfo(raw) if raw.kind in "iu" else None
        low, high = (info.min, info.max) if info else (-1e4, 1e4)
        values = draw(st.lists(st.integers(int(max(low, -1e4)), int(min(high, 1e4))),
                               min_size=ROWS * 3, max_size=ROWS * 3))
        data = np.asarray(values).astype(raw).reshape(ROWS, 3)
        attrs: dict[str, object] = {}
        for name, kind in zip(("scale_factor", "add_offset"), kinds, strict=True):
            if kind is not None:
                attrs[name] = draw(_number(kind))
        if fill_kind is not None:
            fill = data.reshape(-1)[draw(st.integers(0, data.size - 1))]
            attrs["_FillValue"] = fill if fill_kind == "raw" else fill.item()
        out.append((data, attrs))
    return out


def _xarray(data: np.ndarray, attrs: dict[str, object]) -> np.ndarray:
    native = data.astype(data.dtype.newbyteorder("="))
    return np.asarray(mask_and_scale("v", ("time", "x"), reader_attrs(_stored(attrs)),
                                     native).values)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts())
def test_segments_read_as_xarray_decodes_each_part_and_concat_joins_them(drawn):
    array = joined([_part(d, a) for d, a in drawn], "time", _stored(drawn[0][1]))
    got = read(array)
    segments = array.segments
    event("decoded" if segments is not None and segments.decoded else "as stored")
    if segments is None or not segments.decoded:  # one encoding, or stored alike
        expected = np.concatenate([d.astype(d.dtype.newbyteorder("=")) for d, _ in drawn])
    else:
        expected = np.concatenate([_xarray(d, a) for d, a in drawn])
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
    if segments is not None and segments.decoded:  # and through xarray, a segment at a time
        reader = reader_of(array, "v", None, None)
        assert isinstance(reader, SegmentedReader)
        reader._kinds = np.full(len(segments), -1), []
        np.testing.assert_array_equal(reader.read(), expected)


@pytest.mark.parametrize("selection", [
    (slice(None), 1), (slice(3, 17, 2), slice(None)), (np.array([19, 0, 7, 7]), 2),
    (4, slice(None)), (slice(None, None, -3), np.array([2, 0]))])
def test_any_selection_reads_its_part_of_every_segment(selection):
    rng = np.random.default_rng(0)
    drawn = [(rng.integers(-100, 100, (ROWS, 3)).astype("<i2"),
              {"scale_factor": np.float32(0.5), "add_offset": np.float32(k)})
             for k in range(4)]
    array = joined([_part(d, a) for d, a in drawn], "time", _stored(drawn[0][1]))
    whole = np.concatenate([_xarray(d, a) for d, a in drawn])
    np.testing.assert_array_equal(read(array, selection), whole[selection])
    assert isinstance(xr.Variable(("time", "x"), whole)[selection].values, np.ndarray)
