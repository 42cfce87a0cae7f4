"""Zarr v3 stores (zarr.json documents and chunk files) opened by the engine and the mapper:
regular stores equal what zarr reads; a rectilinear store, which zarr 3.1 cannot open, equals
the source files."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
import xarray as xr
import zarr

import refgrid
from helpers import FIXTURES, RECTILINEAR, closed
from refgrid.core.keys import chunk_key
from refgrid.model.zarr_json import documents

MONTHS = [FIXTURES / "monthly" / "chunk10" / f"tas_2001{m:02d}.nc" for m in (1, 2, 3)]


def test_regular_store_reads_as_zarr_reads_it(tmp_path):
    store = tmp_path / "store.zarr"
    root = zarr.open_group(store, mode="w", zarr_format=3)
    root.attrs["title"] = "a store"
    values = np.arange(7 * 5, dtype="f8").reshape(7, 5)
    a = root.create_array("a", shape=(7, 5), chunks=(3, 2), dtype="f8", fill_value=-1.0,
                          dimension_names=["y", "x"])
    a[:3] = values[:3]  # the chunks of rows 3..6 are never written: fill values
    sub = root.create_group("sub")
    s = sub.create_array("s", shape=(), dtype="i4", fill_value=0, dimension_names=[])
    s[()] = 42
    t = sub.create_array("t", shape=(4,), chunks=(4,), dtype="u2", fill_value=0,
                         compressors=[zarr.codecs.ZstdCodec(level=3), zarr.codecs.Crc32cCodec()],
                         dimension_names=["t"])
    t[:] = [1, 2, 3, 4]

    ours = xr.open_dataset(store, engine="refgrid")
    theirs = xr.open_dataset(store, engine="zarr", consolidated=False)
    xr.testing.assert_identical(ours.load(), theirs.load())
    sub_ours = xr.open_dataset(store, engine="refgrid", group="sub")
    assert int(sub_ours.s) == 42 and sub_ours.t.values.tolist() == [1, 2, 3, 4]
    view = zarr.open_group(refgrid.get_mapper(store), mode="r")
    np.testing.assert_array_equal(view["a"][...], root["a"][...])


@pytest.mark.parametrize("order", [(1, 0), (0, 2, 1), (2, 0, 1)])
def test_transposed_chunks_read_as_zarr_reads_them_on_every_path(tmp_path, order):
    """The ``transpose`` codec (chunks stored with axes permuted): the engine, the store on
    both views, refgrid's codec pipeline and kerchunk-v2 output (v2's ``order: "F"`` where the
    axes are reversed) read what zarr reads; two such stores combined along a padded interior
    chunk too (its cropped chunk re-encoded transposed)."""
    shape, chunks = [(7, 5), (6, 3, 4), (6, 3, 4)][len(order) - 2 + (order[0] == 2)], None
    chunks = tuple(max(1, n // 2) for n in shape)
    values = np.arange(np.prod(shape), dtype="f4").reshape(shape)
    dims = ["t", "y", "x"][:len(shape)]
    for k in (0, 1):
        root = zarr.open_group(tmp_path / f"s{k}.zarr", mode="w", zarr_format=3)
        root.create_array("v", shape=shape, chunks=chunks, dtype="f4", dimension_names=dims,
                          filters=[zarr.codecs.TransposeCodec(order=order)],
                          compressors=[zarr.codecs.ZstdCodec()])[...] = values + 100 * k
    store = tmp_path / "s0.zarr"
    expected = zarr.open_array(store / "v", mode="r")[...]
    with xr.open_dataset(store, engine="refgrid") as ours:
        np.testing.assert_array_equal(ours["v"].values, expected)
    for view in ("native", "auto"):
        got = zarr.open_group(refgrid.open_store(store, chunks=view), mode="r")["v"][...]
        np.testing.assert_array_equal(got, expected)
    with zarr.config.set(refgrid.zarr_config()):
        got = zarr.open_group(refgrid.open_store(store), mode="r")["v"][...]
        np.testing.assert_array_equal(got, expected)
    combined = refgrid.combine([tmp_path / "s0.zarr", tmp_path / "s1.zarr"], "t")
    both = np.concatenate([values, values + 100])
    with xr.open_dataset(refgrid.write(combined, tmp_path / "both.json"),
                         engine="refgrid") as ours:
        np.testing.assert_array_equal(ours["v"].values, both)
    with zarr.config.set({"array.rectilinear_chunks": True}) if RECTILINEAR else \
            contextlib.nullcontext():
        native = refgrid.open_store(combined, chunks="native" if RECTILINEAR else "auto")
        np.testing.assert_array_equal(zarr.open_group(native, mode="r")["v"][...], both)
    if order != tuple(reversed(range(len(order)))):
        with pytest.raises(refgrid.WriteError, match=r"array 'v': a transpose to \[.*\] has "
                                                     r"no Zarr v2 form"):
            refgrid.write(refgrid.scan(store), tmp_path / "v2.json", format="kerchunk-v2")
        return
    v2 = refgrid.write(refgrid.scan(store), tmp_path / "v2.json", format="kerchunk-v2")
    assert json.loads(json.loads(v2.read_text())["refs"]["v/.zarray"])["order"] == "F"
    with xr.open_dataset(str(v2), engine="kerchunk") as theirs:
        np.testing.assert_array_equal(theirs["v"].values, expected)


def test_a_codec_no_reader_knows_is_named(tmp_path):
    store = tmp_path / "t.zarr"
    root = zarr.open_group(store, mode="w", zarr_format=3)
    root.create_array("m", shape=(2, 3), dtype="i2", dimension_names=["y", "x"])[:] = 1
    doc = json.loads((store / "m" / "zarr.json").read_text())
    doc["codecs"].append({"name": "numcodecs.nonesuch", "configuration": {}})
    (store / "m" / "zarr.json").write_text(json.dumps(doc))
    with pytest.raises(refgrid.RefgridError, match=r"array 'm': cannot decode codecs "
                                                   r"\['bytes', 'zstd', 'numcodecs.nonesuch'\]"):
        xr.open_dataset(store, engine="refgrid").m.values  # noqa: B018


def test_rectilinear_store_reads_like_the_sources(tmp_path):
    group = refgrid.combine([refgrid.scan(p) for p in MONTHS], "time")
    store = tmp_path / "tas.zarr"
    for key, doc in documents(group).items():  # a true store: documents and chunk files
        (store / key).parent.mkdir(parents=True, exist_ok=True)
        (store / key).write_text(json.dumps(doc))
    for path, node in group.walk():
        if isinstance(node, refgrid.VirtualArray):
            m = node.manifest
            for coords in np.ndindex(m.shape):
                if m.path_id[coords] >= 0:
                    with open(m.paths[m.path_id[coords]], "rb") as f:
                        f.seek(int(m.offset[coords]))
                        data = f.read(int(m.length[coords]))
                else:
                    data = m.inline[coords]
                (store / chunk_key(path, coords)).parent.mkdir(parents=True, exist_ok=True)
                (store / chunk_key(path, coords)).write_bytes(data)
    assert json.loads((store / "tas" / "zarr.json").read_text())["chunk_grid"]["name"] == \
        "rectilinear"
    expected = closed(xr.open_mfdataset(MONTHS, combine="nested", concat_dim="time",
                                 data_vars="minimal", compat="equals"))
    ours = xr.open_dataset(store, engine="refgrid", chunks={})
    assert ours.tas.chunks[0] == (10, 10, 10, 1, 10, 10, 8, 10, 10, 10, 1)
    xr.testing.assert_identical(ours.load(), expected.load())


def _unnamed_v2_store(path, value, start=0):
    root = zarr.open_group(path, mode="w", zarr_format=3)
    root.create_array("t", shape=(3,), chunks=(2,), dtype="i4", dimension_names=["t"])[:] = [
        start, start + 1, start + 2]
    root.create_array("k", shape=(2, 3), chunks=(1, 3), dtype="f4",
                      chunk_key_encoding={"name": "v2", "separator": "."})[...] = value
    return path


def test_a_stores_layout_stays_out_of_what_readers_show(tmp_path):
    """The layout refgrid keeps to serve a store as it was (its key encoding, the dimension
    names it left out, an array at its root) is bookkeeping: xarray never sees it, and what
    the engine opens writes to NetCDF."""
    store = _unnamed_v2_store(tmp_path / "s.zarr", np.ones((2, 3)))
    zarr.create_array(tmp_path / "root.zarr", shape=(4,), chunks=(2,), dtype="i2",
                      dimension_names=["x"])[:] = [1, 2, 3, 4]
    for source in (store, tmp_path / "root.zarr"):
        with xr.open_dataset(source, engine="refgrid") as ds:
            shown = [*ds.attrs, *(a for v in ds.variables.values() for a in v.attrs)]
            assert not [a for a in shown if a.startswith("_refgrid_")], shown
            ds.to_netcdf(tmp_path / f"{source.stem}.nc")
    with xr.open_dataset(tmp_path / "s.nc") as copy:
        assert copy["k"].values.tolist() == [[1.0] * 3] * 2


def test_stacking_stores_without_dimension_names_gives_valid_documents(tmp_path):
    parts = [_unnamed_v2_store(tmp_path / f"s{k}.zarr", np.full((2, 3), k), 3 * k)
             for k in (0, 1)]
    group = refgrid.combine(parts, "t", others="stack")
    doc = json.loads(refgrid.open_store(group).get_sync("k/zarr.json").to_bytes())
    assert doc["dimension_names"] == ["file", None, None]
    assert doc["chunk_key_encoding"] == {"name": "v2", "configuration": {"separator": "."}}
    k = zarr.open_group(refgrid.open_store(group), mode="r")["k"]
    np.testing.assert_array_equal(k[...], [np.full((2, 3), 0), np.full((2, 3), 1)])


@pytest.mark.parametrize("record", [
    {"k": {"_refgrid_chunk_key_encoding": {"name": "v9"}}},
    {"k": {"_refgrid_dimension_names": ["a", "b", "c"]}},
    {"k": {"_refgrid_dimension_names": "ab"}},
    {"": {"_refgrid_root_array": "t"}},
    {"": {"_refgrid_root_array": "nope"}},
])
def test_layout_records_that_do_not_fit_are_dropped(tmp_path, record):
    """References are untrusted: a layout record in their refgrid section that does not fit
    its node is ignored, and the node is served as refgrid serves it without one."""
    store = _unnamed_v2_store(tmp_path / "s.zarr", np.ones((2, 3)))
    refs = refgrid.write(refgrid.scan(store), tmp_path / "refs.json")
    doc = json.loads(refs.read_text())
    for node, attrs in record.items():
        doc["refgrid"].setdefault("attributes", {}).setdefault(node, {}).update(attrs)
    refs.write_text(json.dumps(doc))
    group = zarr.open_group(refgrid.open_store(refs), mode="r")
    assert sorted(group.array_keys()) == ["k", "t"]
    np.testing.assert_array_equal(group["k"][...], np.ones((2, 3)))
    with xr.open_dataset(refs, engine="refgrid") as ds:
        assert ds["k"].shape == (2, 3)


@pytest.mark.parametrize(("encoding", "tail", "ndim", "coords"), [
    (("default", "/"), "c/0/3", 2, (0, 3)), (("default", "."), "c.0.3", 2, (0, 3)),
    (("v2", "."), "0.3", 2, (0, 3)), (("v2", "/"), "0/3", 2, (0, 3)),
    (("default", "/"), "c", 0, ()), (("v2", "."), "0", 0, ()),
    (("v2", "."), "0/3", 2, None), (("default", "."), "c.0/3", 2, None),
    (("default", "/"), "c/01/3", 2, None), (("default", "/"), "c/0", 2, None),
    (("default", "/"), "c/-1/3", 2, None), (("default", "/"), "c/٣/3", 2, None),
])
def test_the_key_codec_names_each_chunk_by_one_key(encoding, tail, ndim, coords):
    """Keys decode to coordinates as zarr names them, and only those: another separator, a
    leading zero or a non-ASCII digit names no chunk (a second name would let a leftover
    key stand for a chunk)."""
    from refgrid.core.keys import KeyEncoding, flat_indices

    codec = KeyEncoding(*encoding)
    assert codec.decode(tail, ndim) == coords
    if coords is not None:
        assert codec.encode(coords) == tail
    assert flat_indices(["0/3", "01/3", "0/03", "1/0"], (2, 4)).tolist() == [3, -1, -1, 4]
