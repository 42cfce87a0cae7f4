"""Segments in the model and in ``zarr.json``: checked when made, sliced with their array,
written and read back exactly, and a hostile ``refgrid.segments`` codec refused by name."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refgrid.errors import FormatError, ModelError
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import ChunkManifest
from refgrid.model.presented import presentation, shown_as
from refgrid.model.segments import Encoding, Segments
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.model.zarr_json import SEGMENTS_CODEC, documents, group_from_documents

LITTLE = ({"name": "bytes", "configuration": {"endian": "little"}},)
BIG = ({"name": "bytes", "configuration": {"endian": "big"}},)
ZLIB = (*LITTLE, {"name": "numcodecs.zlib", "configuration": {"level": 4}})


def _encodings() -> list[Encoding]:
    return [
        Encoding.of(np.dtype("<f4"), LITTLE, np.float32(1e20), {"_FillValue": 1e20}),
        Encoding.of(np.dtype(">f4"), BIG, np.float32(1e20), {"_FillValue": 1e20}),
        Encoding.of(np.dtype("<i2"), ZLIB, np.int16(-32768), {
            "_FillValue": -32768, "scale_factor": 0.01, "add_offset": 250.5,
            "units": "K", "_refgrid_attribute_types": {"scale_factor": "<f4"}}),
    ]


def _array(starts: tuple[int, ...], chunks: int = 6, decoded: bool = True) -> VirtualArray:
    """An array of ``starts`` segments (``decoded``: shown as its segments give, else as
    the constructor is told, however they differ)."""
    grid = RectilinearGrid.regular([chunks * 10, 4], [10, 4])
    encodings = tuple(_encodings()[k % 3] for k in range(len(starts)))
    plain = VirtualArray("tas", ("time", "lat"), np.dtype("<f4"), grid,
                         ChunkManifest.empty(grid.chunk_counts), np.nan, LITTLE,
                         {"units": "K"})
    if not decoded or not starts:
        return replace(plain, segments=Segments("time", starts, encodings, decoded))
    shown, dtype, fill, attrs = presentation("tas", encodings, plain.dims, {
        "units": "K", **encodings[0].attrs})  # (the first file's, as a combine keeps them)
    return shown_as(plain, Segments("time", starts, encodings, shown), dtype, fill, attrs)


def test_an_encoding_keeps_only_what_decoding_needs():
    packed = _encodings()[2]
    assert set(packed.attrs) == {"_FillValue", "scale_factor", "add_offset",
                                 "_refgrid_attribute_types"}
    typed = Encoding.of(np.dtype("<f4"), LITTLE, None, {
        "valid_max": 1.0, "_refgrid_attribute_types": {"valid_max": "<f4"}})
    assert typed.attrs == {}  # (another attribute's type makes no segment)


def test_a_document_that_shows_its_segments_otherwise_is_refused():
    """Shown as stored over segments packed otherwise, every segment would be read by the
    top-level packing: the document is refused, not trusted."""
    doc = documents(VirtualGroup(arrays={"tas": _array((0, 2, 4), decoded=True)}))
    text = {k[:-len("zarr.json")].rstrip("/"): json.loads(json.dumps(v))
            for k, v in doc.items()}
    text["tas"]["codecs"][0]["configuration"]["shown"] = "stored"
    with pytest.raises(FormatError, match=r"refs\.json.*tas.*shown decoded"):
        group_from_documents(text, lambda path, grid: ChunkManifest.empty(grid.chunk_counts),
                             "refs.json")
    text["tas"]["codecs"] = [*text["tas"]["codecs"], {"name": "bytes"}]
    with pytest.raises(FormatError, match="the only codec"):
        group_from_documents(text, lambda path, grid: ChunkManifest.empty(grid.chunk_counts),
                             "refs.json")


@pytest.mark.parametrize("starts", [(), (1, 3), (0, 2, 2), (0, 6)])
def test_segments_that_do_not_fit_are_refused(starts):
    with pytest.raises(ModelError):
        _array(starts)


def test_segments_along_a_dimension_the_array_lacks_are_refused():
    grid = RectilinearGrid.regular([10], [10])
    with pytest.raises(ModelError, match="segments along 'time' do not fit"):
        VirtualArray("lat", ("lat",), np.dtype("<f4"), grid, ChunkManifest.empty((1,)),
                     segments=Segments("time", (0,), (_encodings()[0],)))


@pytest.mark.parametrize("start, stop, expected", [
    (0, 60, (0, 2, 4)), (20, 60, (0, 2)), (30, 40, (0,)), (0, 20, (0,)), (10, 50, (0, 1, 3))])
def test_a_slice_keeps_its_chunks_segments(start, stop, expected):
    array = _array((0, 2, 4))
    sliced = array.slice("time", start, stop)
    assert sliced.segments is not None and sliced.segments.starts == expected
    first = start // 10
    owner = [k for k, s in enumerate((0, 2, 4)) if s <= first][-1]
    assert sliced.segments.encodings[0] == array.segments.encodings[owner]


def test_arrays_in_segments_are_joined_by_the_combine_not_concatenated():
    array = _array((0, 2))
    with pytest.raises(ModelError, match="stored in segments"):
        VirtualArray.concat([array, array], "time")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=6, unique=True))
def test_segments_are_written_and_read_back_exactly(cuts):
    starts = tuple(sorted({0, *cuts}))
    array = _array(starts)
    docs = documents(VirtualGroup(arrays={"tas": array}))
    doc = docs["tas/zarr.json"]
    assert [c["name"] for c in doc["codecs"]] == [SEGMENTS_CODEC]
    text = {k[:-len("zarr.json")].rstrip("/"): json.loads(json.dumps(v))
            for k, v in docs.items()}
    back = group_from_documents(text, lambda path, grid: ChunkManifest.empty(
        grid.chunk_counts), "refs.json")["tas"]
    assert isinstance(back, VirtualArray)
    assert back.segments == array.segments
    assert back.dtype == array.dtype and back.codecs == array.codecs


F4 = {"data_type": "float32", "fill_value": 0.0, "codecs": list(LITTLE)}
HOSTILE = [
    {"dimension": "time", "shown": "maybe", "storage": [F4], "segments": []},
    {"dimension": 3, "shown": "stored", "storage": [F4], "segments": [{}]},
    {"dimension": "time", "shown": "stored", "storage": [F4], "segments": [{"start": 0}]},
    {"dimension": "time", "shown": "stored", "storage": [F4],
     "segments": [{"start": "0", "storage": 0}]},
    {"dimension": "time", "shown": "stored", "storage": [F4],
     "segments": [{"start": 0, "storage": 1}]},
    {"dimension": "time", "shown": "stored", "storage": [{**F4, "codecs": []}],
     "segments": [{"start": 0, "storage": 0}]},
    {"dimension": "time", "shown": "stored", "storage": [F4],
     "segments": [{"start": 0, "storage": 0}, {"start": 99, "storage": 0}]},
    {"dimension": "depth", "shown": "stored", "storage": [F4],
     "segments": [{"start": 0, "storage": 0}]},
    {"dimension": "time", "shown": "stored", "storage": [{**F4, "data_type": "no-such"}],
     "segments": [{"start": 0, "storage": 0}]},
    {"dimension": "time", "shown": "stored", "storage": [], "segments": []},
    {"dimension": "time", "shown": "stored", "storage": [F4], "attributes": "units: K",
     "segments": [{"start": 0, "storage": 0}]},
    "not a mapping",
]


@pytest.mark.parametrize("config", HOSTILE)
def test_a_segments_codec_that_does_not_fit_is_a_format_error_naming_the_array(config):
    doc = documents(VirtualGroup(arrays={"tas": _array((0, 2))}))
    text = {k[:-len("zarr.json")].rstrip("/"): json.loads(json.dumps(v))
            for k, v in doc.items()}
    text["tas"]["codecs"] = [{"name": SEGMENTS_CODEC, "configuration": config}]
    with pytest.raises(FormatError, match=r"refs\.json.*tas"):
        group_from_documents(text, lambda path, grid: ChunkManifest.empty(grid.chunk_counts),
                             "refs.json")
