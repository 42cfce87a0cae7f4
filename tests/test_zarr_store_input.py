"""Zarr v3 stores (zarr.json documents and chunk files) opened by the engine and the mapper:
regular stores equal what zarr reads; a rectilinear store, which zarr 3.1 cannot open, equals
the source files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr
import zarr

import refgrid
from helpers import FIXTURES
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
    theirs = xr.open_dataset(store, engine="zarr")
    xr.testing.assert_identical(ours.load(), theirs.load())
    sub_ours = xr.open_dataset(store, engine="refgrid", group="sub")
    assert int(sub_ours.s) == 42 and sub_ours.t.values.tolist() == [1, 2, 3, 4]
    view = zarr.open_group(refgrid.get_mapper(store), mode="r")
    np.testing.assert_array_equal(view["a"][...], root["a"][...])


def test_a_codec_refgrid_cannot_decode_is_named(tmp_path):
    store = tmp_path / "t.zarr"
    root = zarr.open_group(store, mode="w", zarr_format=3)
    root.create_array("m", shape=(2, 3), dtype="i2", filters=[zarr.codecs.TransposeCodec(
        order=(1, 0))], dimension_names=["y", "x"])[:] = [[1, 2, 3], [4, 5, 6]]
    with pytest.raises(refgrid.RefgridError, match=r"array 'm': cannot decode codecs "
                                                   r"\['transpose', 'bytes'"):
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
    expected = xr.open_mfdataset(MONTHS, combine="nested", concat_dim="time",
                                 data_vars="minimal", compat="equals")
    ours = xr.open_dataset(store, engine="refgrid", chunks={})
    assert ours.tas.chunks[0] == (10, 10, 10, 1, 10, 10, 8, 10, 10, 10, 1)
    xr.testing.assert_identical(ours.load(), expected.load())
