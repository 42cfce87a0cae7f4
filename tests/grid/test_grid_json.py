"""Chunk grid JSON: regular, rectilinear (RLE, encoded extents) and ZEP0003 rectangular."""

from __future__ import annotations

import jsonschema
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from grid_strategies import grids
from refgrid import GridError, RectilinearGrid
from refgrid.grid.json_forms import emit_chunk_grid, grown_chunk_grid, parse_chunk_grid, rle


def _validate(doc: dict, schema: dict) -> None:
    """Validate ``chunk_shapes`` with the spec's schema, and ``encoded_chunk_shapes`` with the
    same edge-length definition (the field is proposed with the same syntax)."""
    jsonschema.validate(doc, schema)
    encoded = doc["configuration"].get("encoded_chunk_shapes")
    if encoded is not None:
        edges = {"type": "array", "items": {"$ref": "#/$defs/ChunkEdgeLength"},
                 "$defs": schema["$defs"]}
        jsonschema.validate(encoded, edges)


def test_design_example_two_files_of_550_rows_in_chunks_of_200(rectilinear_schema):
    g = RectilinearGrid.concat([RectilinearGrid.regular([550], [200])] * 2, 0)
    doc = emit_chunk_grid(g)
    assert doc == {"name": "rectilinear", "configuration": {
        "kind": "inline",
        "chunk_shapes": [[[200, 2], [150, 1], [200, 2], [150, 1]]],
        "encoded_chunk_shapes": [200]}}
    _validate(doc, rectilinear_schema)
    assert parse_chunk_grid(doc, [1100]) == g


def test_regular_when_only_the_array_end_is_padded():
    g = RectilinearGrid.concat([RectilinearGrid.regular([n], [10]) for n in (30, 30, 31)], 0)
    assert emit_chunk_grid(g) == {"name": "regular", "configuration": {"chunk_shape": [10]}}


def test_ragged_without_interior_padding_has_no_encoded_field(rectilinear_schema):
    # 31/28/31 days, one chunk per file: irregular, but no chunk decodes to more than it holds
    g = RectilinearGrid.concat([RectilinearGrid.regular([n, 4], [n, 4]) for n in (31, 28, 31)], 0)
    doc = emit_chunk_grid(g)
    assert doc == {"name": "rectilinear",
                   "configuration": {"kind": "inline",
                                     "chunk_shapes": [[[31, 1], [28, 1], [31, 1]], [[4, 1]]]}}
    _validate(doc, rectilinear_schema)


def test_padding_inside_needs_encoded_field_padding_at_end_does_not(rectilinear_schema):
    # 365/366/365 with chunk 100: every file's last chunk is padded, so padding sits inside
    g = RectilinearGrid.concat([RectilinearGrid.regular([n], [100]) for n in (365, 366, 365)], 0)
    doc = emit_chunk_grid(g)
    assert doc["configuration"]["chunk_shapes"] == [[[100, 3], [65, 1], [100, 3], [66, 1],
                                                    [100, 3], [65, 1]]]
    assert doc["configuration"]["encoded_chunk_shapes"] == [100]
    _validate(doc, rectilinear_schema)
    # irregular lengths, padded only at the array's end: the last edge overflows the shape
    g = RectilinearGrid.from_lengths([[5, 7, 3]], [[5, 7, 10]])
    doc = emit_chunk_grid(g)
    assert doc["configuration"] == {"kind": "inline", "chunk_shapes": [[[5, 1], [7, 1], [10, 1]]]}
    assert parse_chunk_grid(doc, [15]) == g
    _validate(doc, rectilinear_schema)


@given(grids())
def test_round_trip_every_form(grid):
    shape = grid.shape
    assert parse_chunk_grid(emit_chunk_grid(grid), shape) == grid
    assert parse_chunk_grid(emit_chunk_grid(grid, "rectilinear"), shape) == grid
    padded = any((a.encoded != a.logical).any() for a in grid.axes if a.regular_size is None)
    if padded:
        with pytest.raises(GridError, match="'rectangular' grid cannot express"):
            emit_chunk_grid(grid, "rectangular")
    else:
        assert parse_chunk_grid(emit_chunk_grid(grid, "rectangular"), shape) == grid


@given(grids())
def test_every_emitted_rectilinear_document_validates(grid):
    import json

    from helpers import RECTILINEAR_SCHEMA
    if not RECTILINEAR_SCHEMA.exists():
        pytest.skip("rectilinear schema absent")
    _validate(emit_chunk_grid(grid, "rectilinear"), json.loads(RECTILINEAR_SCHEMA.read_text()))


def test_zep0003_rectangular_is_read():
    doc = {"name": "rectangular", "configuration": {"chunk_shape": [[5, 5, 15], 10]}}
    g = parse_chunk_grid(doc, [25, 30])
    assert g.lengths(0).tolist() == [5, 5, 15]
    assert g.lengths(1).tolist() == [10, 10, 10]
    assert emit_chunk_grid(g, "rectangular") == doc


def test_rle_prefers_runs_only_where_not_longer():
    assert rle(np.array([10, 10, 10, 1])) == [[10, 3], 1]
    assert rle(np.array([10, 10])) == [10, 10]
    assert rle(np.array([200, 200])) == [[200, 2]]
    assert rle(np.array([1, 1, 1, 1, 1])) == [[1, 5]]
    assert rle(np.array([], dtype=int)) == []


def test_spec_examples_are_read():
    doc = {"name": "rectilinear", "configuration": {"kind": "inline", "chunk_shapes": [
        4, [1, 2, 3], [[4, 2]], [[1, 3], 3], [4, 4, 4]]}}
    g = parse_chunk_grid(doc, [6] * 5)
    assert [g.lengths(d).tolist() for d in range(5)] == [
        [4, 2], [1, 2, 3], [4, 2], [1, 1, 1, 3], [4, 2]]
    assert g.encoded_lengths(4).tolist() == [4, 4]  # the overflow chunk beyond 6 holds nothing


def _rect(shapes, encoded=None):
    config = {"kind": "inline", "chunk_shapes": shapes}
    if encoded is not None:
        config["encoded_chunk_shapes"] = encoded
    return {"name": "rectilinear", "configuration": config}


@pytest.mark.parametrize(
    ("doc", "shape", "message"),
    [
        (_rect([[5, 5]]), [10, 4], "has 1 dimensions in 'chunk_shapes' but the array shape"),
        (_rect([[5, 4]]), [10], "sum to 9, shorter than the array's length 10"),
        (_rect([[5, 0, 5]]), [10], "chunk lengths must be >= 1"),
        (_rect([0]), [10], "chunk length 0 must be >= 1"),
        (_rect([[[5]]]), [10], r"malformed entry \[5\]"),
        (_rect([[[5, 2, 1]]]), [10], r"malformed entry \[5, 2, 1\]"),
        (_rect([[["5", 2]]]), [10], "malformed entry"),
        (_rect([[[5, 0]]]), [10], "repeat count below 1"),
        (_rect([[5.0, 5]]), [10], "malformed entry 5.0"),
        (_rect(["5"]), [10], "must be an integer or a list"),
        (_rect([[5, 5]], [[5, 4]]), [10], "chunk 1 is encoded with 4 elements, shorter than"),
        (_rect([[5, 5]], [[5, 5, 5]]), [10], "encoded_chunk_shapes has 3 edges but chunk_shapes "
                                            "has 2"),
        (_rect([[5, 5]], [5, 5]), [10], "one entry per dimension"),
        ({"name": "rectilinear", "configuration": {"kind": "file", "chunk_shapes": [5]}}, [10],
         "kind 'file' is not supported"),
        ({"name": "rectangular", "configuration": {"chunk_shape": [[[5, 2]]]}}, [10],
         "each entry must be an integer"),
        ({"name": "regular", "configuration": {"chunk_shape": [[5]]}}, [10],
         "must be a list of integers"),
        ({"name": "hexagonal", "configuration": {}}, [10], "unknown chunk grid 'hexagonal'"),
        ({"name": "regular"}, [10], "needs 'name' and a 'configuration'"),
    ],
)
def test_malformed_documents_name_the_problem(doc, shape, message):
    with pytest.raises(GridError, match=message):
        parse_chunk_grid(doc, shape)


def test_json_string_is_accepted():
    g = parse_chunk_grid('{"name": "regular", "configuration": {"chunk_shape": [3]}}',
                                  [7])
    assert g.lengths(0).tolist() == [3, 3, 1]


def test_chunk_shapes_are_runs_only_the_form_every_rectilinear_reader_parses():
    """Icechunk 2 refuses a bare integer for a dimension and integers mixed among runs
    (``cannot parse chunk_shapes``); zarr-python parses all three. refgrid emits runs only,
    and still reads every form."""
    g = RectilinearGrid.concat([RectilinearGrid.regular([n, 6], [10, 6]) for n in (31, 28)], 0)
    shapes = emit_chunk_grid(g)["configuration"]["chunk_shapes"]
    assert shapes == [[[10, 3], [1, 1], [10, 2], [8, 1]], [[6, 1]]]
    assert all(isinstance(run, list) and len(run) == 2 for dim in shapes for run in dim)
    logical = RectilinearGrid.from_lengths([[10, 10, 10, 1, 10, 10, 8], [6]])
    for form in (shapes, [[[10, 3], 1, [10, 2], 8], 6], [[10, 10, 10, 1, 10, 10, 8], [6]]):
        doc = {"name": "rectilinear", "configuration": {"kind": "inline", "chunk_shapes": form}}
        assert parse_chunk_grid(doc, [59, 6]) == logical


@given(st.lists(st.one_of(st.integers(1, 40), st.lists(st.integers(1, 40), min_size=2,
                                                        max_size=2)), max_size=30),
       st.integers(1, 400), st.booleans())
def test_edge_lists_read_in_bulk_as_item_by_item(spec, bound, by_count):
    """The bulk reading of a grid's edge list (10^6 entries along time) gives what reading
    it entry by entry gives, cut at the same place."""
    from refgrid.grid.json_forms import _checked_entries, _expand, _taken

    reach, count = (None, bound) if by_count else (bound, None)
    edges, declared = _expand(0, spec, "chunk lengths", True, reach=reach, count=count)
    slow, slow_declared = _taken(*_checked_entries(0, spec, "chunk lengths", True), reach,
                                 count)
    np.testing.assert_array_equal(edges, slow)
    assert declared == slow_declared


@given(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 12)), min_size=2, max_size=8),
       st.integers(1, 7), st.integers(1, 3))
def test_a_grown_grid_edited_at_its_end_is_the_grid_emitted_whole(files, split, other):
    """Appending files to an archive edits the end of its first dimension's runs: the same
    document as emitting the whole grown grid, and the same count of chunks kept — or None
    (then the grid is parsed whole)."""
    split = min(split, len(files) - 1)  # the archive: files[:split]; its last is re-added

    def grid(part):
        return RectilinearGrid.concat([RectilinearGrid.regular([n, 5], [c, other])
                                       for n, c in part], 0)

    archive, kept, tail = grid(files[:split]), files[:split - 1], grid(files[split - 1:])
    doc = emit_chunk_grid(archive)
    got = grown_chunk_grid(doc, archive.shape, files[split - 1][0], tail)
    whole = RectilinearGrid.concat([grid(kept), tail], 0) if kept else tail
    if got is not None:
        assert got == (emit_chunk_grid(whole), grid(kept).chunk_counts[0] if kept else 0)
        assert parse_chunk_grid(got[0], whole.shape) == whole
    else:  # the whole grid is parsed only where editing the runs does not apply
        assert doc["name"] != "rectilinear" or "encoded_chunk_shapes" in doc["configuration"] \
            or any(a.padded_inside for a in tail.axes) or \
            emit_chunk_grid(whole)["name"] == "regular"


def test_a_grown_grid_refuses_an_end_inside_a_chunk():
    archive = RectilinearGrid.concat([RectilinearGrid.regular([30], [10]),
                                      RectilinearGrid.regular([7], [7])], 0)
    tail = RectilinearGrid.concat([RectilinearGrid.regular([7], [7]),
                                   RectilinearGrid.regular([8], [4])], 0)
    assert grown_chunk_grid(emit_chunk_grid(archive), [37], 5, tail) is None  # inside 7
    short = {"name": "rectilinear", "configuration": {"kind": "inline",
                                                        "chunk_shapes": [[[10, 3], [5, 1]]]}}
    assert grown_chunk_grid(short, [37], 7, tail) is None  # runs shorter than the array
    past = {"name": "rectilinear", "configuration": {"kind": "inline",
                                                       "chunk_shapes": [[[10, 3], [7, 2]]]}}
    assert grown_chunk_grid(past, [37], 7, tail) is None  # a chunk past the end
    doc, kept = grown_chunk_grid(emit_chunk_grid(archive), [37], 7, tail)
    assert kept == 3 and doc["configuration"]["chunk_shapes"] == [[[10, 3], [7, 1], [4, 2]]]
