"""Parquet references: written atomically, read back column by column to the same model, opened
by the engine and the mapper, locally and from S3."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import xarray as xr
import zarr

import refgrid
from helpers import FIXTURES, closed, hdf5_files, netcdf3_files
from refgrid.errors import WriteError
from refgrid.read.array import read

MONTHS = [FIXTURES / "monthly" / "chunk10" / f"tas_2001{m:02d}.nc" for m in (1, 2, 3)]


def test_every_fixture_round_trips_to_the_model_json_gives(tmp_path):
    files = hdf5_files(FIXTURES) + netcdf3_files(FIXTURES)
    for path in files:
        group = refgrid.scan(path, on_error="report")
        refs = refgrid.write(group, tmp_path / f"{path.stem}.parq", padded="encoded")
        assert refgrid.scan(refs) == refgrid.scan(refgrid.to_kerchunk(group)), path.name
    assert len(files) > 50


def test_records_split_rows_in_chunk_order(tmp_path):
    group = refgrid.combine([refgrid.scan(p) for p in MONTHS], "time")
    refs = refgrid.write(group, tmp_path / "refs", format="parquet", record_size=4,
                         padded="encoded")  # the model as it is: no chunk rewritten
    nchunks = group["tas"].grid.nchunks  # 11 chunks along time: 3 record files
    assert sorted(p.name for p in (refs / "tas").iterdir()) == [
        f"refs.{n}.parq" for n in range(-(-nchunks // 4))]
    meta = json.loads((refs / ".zmetadata").read_text())
    assert meta["record_size"] == 4
    assert meta["metadata"]["tas/zarr.json"]["chunk_grid"]["name"] == "rectilinear"
    assert refgrid.scan(refs) == group


def test_engine_and_mapper_read_parquet_references(tmp_path):
    group = refgrid.combine([refgrid.scan(p) for p in MONTHS], "time")
    refs = refgrid.write(group, tmp_path / "refs.parq")
    expected = closed(xr.open_mfdataset(MONTHS, combine="nested", concat_dim="time",
                                 data_vars="minimal", compat="equals"))
    ours = xr.open_dataset(refs, engine="refgrid", chunks={})
    assert ours.tas.chunks[0] == (10, 10, 10, 1, 10, 10, 8, 10, 10, 10, 1)
    xr.testing.assert_identical(ours.load(), expected.load())
    via_zarr = xr.open_dataset(refgrid.get_mapper(refs), engine="zarr")
    np.testing.assert_array_equal(via_zarr.tas.values, expected.tas.values)


def test_inline_missing_and_scalar_chunks_survive(tmp_path):
    group = refgrid.scan(FIXTURES / "features" / "hdf5_layouts_latest.h5", on_error="report")
    manifests = [n.manifest for _, n in group.walk() if isinstance(n, refgrid.VirtualArray)]
    assert any(m.inline for m in manifests) and any(m.missing.any() for m in manifests)
    refs = refgrid.write(group, tmp_path / "layouts.parq")
    root = zarr.open_group(refgrid.get_mapper(refs), mode="r")
    for path, node in group.walk():
        if isinstance(node, refgrid.VirtualArray):
            np.testing.assert_array_equal(root[path][...], read(node), err_msg=path)


def test_write_is_atomic_and_replaces_an_existing_directory(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    target = tmp_path / "refs.parq"
    first = refgrid.scan(MONTHS[0])
    refgrid.write(first, target)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", broken)
    with pytest.raises(WriteError, match=r"cannot write parquet references to .*refs\.parq: "
                                         "disk full"):
        refgrid.write(refgrid.scan(MONTHS[1]), target)
    monkeypatch.undo()
    assert refgrid.scan(target) == first  # the old references are intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["refs.parq"]  # nothing left over
    second = refgrid.scan(MONTHS[1])
    refgrid.write(second, target)
    assert refgrid.scan(target) == second


def test_bad_options_and_damaged_records_are_clear_errors(tmp_path):
    group = refgrid.scan(MONTHS[0])
    with pytest.raises(WriteError, match="unknown reference format 'csv'"):
        refgrid.write(group, tmp_path / "x", format="csv")
    with pytest.raises(WriteError, match="record_size must be >= 1"):
        refgrid.write(group, tmp_path / "x.parq", record_size=0)
    refs = refgrid.write(group, tmp_path / "refs.parq")
    record = refs / "tas" / "refs.0.parq"
    good = record.read_bytes()
    footer = int.from_bytes(good[-8:-4], "little")
    damaged = {
        "not parquet": b"PAR1 not really",
        "truncated": good[: len(good) // 2],
        "footer length beyond the file": good[:-8] + (10**9).to_bytes(4, "little") + b"PAR1",
        "footer overwritten": good[: -8 - footer] + b"\xff" * footer + good[-8:],
        "footer bytes shuffled": good[: -8 - footer] + bytes(reversed(good[-8 - footer: -8]))
                                 + good[-8:],
    }
    for data in damaged.values():
        record.write_bytes(data)
        with pytest.raises(refgrid.RefgridError, match=r"record file tas/refs\.0\.parq does "
                                                       "not match its digest"):
            refgrid.scan(refs)
    _drop_digests(refs)  # as kerchunk's parquet: pyarrow's bounds-checked parse refuses them
    for data in damaged.values():
        record.write_bytes(data)
        with pytest.raises(refgrid.RefgridError, match=r"refs\.parq/tas/refs\.0\.parq: not a "
                                                       "parquet reference file"):
            refgrid.scan(refs)


def _drop_digests(refs):
    meta = json.loads((refs / ".zmetadata").read_text())
    del meta["refgrid"]["records"]
    del meta["refgrid"]["source_table"]  # (kerchunk's parquet has neither)
    (refs / ".zmetadata").write_text(json.dumps(meta))


def test_damaged_record_bytes_never_crash_the_reader(tmp_path):
    """Damaged bytes in a record file are an error naming it, or the same references (bytes
    nothing reads) — never a crash (the fastparquet reader this replaced trusted the footer's
    lengths and could segfault) and never other references (each record file's digest is in
    .zmetadata: page checksums alone leave page headers and the footer uncovered)."""
    group = refgrid.scan(MONTHS[0])
    refs = refgrid.write(group, tmp_path / "refs.parq")
    record = refs / "tas" / "refs.0.parq"
    good = record.read_bytes()
    rng = np.random.default_rng(7)
    mutated = []
    for _ in range(300):
        data = bytearray(good)
        for i in rng.integers(0, len(data), rng.integers(1, 8)):
            data[i] = int(rng.integers(0, 256))
        mutated.append(bytes(data))
    for data in mutated:
        record.write_bytes(data)
        try:
            assert refgrid.scan(refs) == group
        except refgrid.RefgridError as e:
            assert "refs.0.parq" in str(e)
    _drop_digests(refs)  # third-party parquet has no digests: the parse must not crash
    for data in mutated:
        record.write_bytes(data)
        try:
            refgrid.scan(refs)
        except refgrid.RefgridError as e:
            assert "refs.0.parq" in str(e)


def test_a_valid_record_file_from_elsewhere_is_refused(tmp_path):
    """A record file swapped for another well-formed one (its page checksums all right) would
    name other byte ranges: the digest in .zmetadata refuses it."""
    first = refgrid.write(refgrid.scan(MONTHS[0]), tmp_path / "a.parq")
    second = refgrid.write(refgrid.scan(MONTHS[1]), tmp_path / "b.parq")
    shutil.copy(second / "tas" / "refs.0.parq", first / "tas" / "refs.0.parq")
    with pytest.raises(refgrid.FormatError, match=r"tas/refs\.0\.parq does not match its "
                                                   "digest"):
        refgrid.scan(first)


def test_parquet_references_on_s3(s3_server, tmp_path):
    options = s3_server.storage_options
    urls = [s3_server.upload(p, f"parquet/{p.name}") for p in MONTHS]
    group = refgrid.combine([refgrid.scan(u, **options) for u in urls], "time",
                            storage_options=options)
    local = refgrid.write(group, tmp_path / "s3.parq", padded="encoded")  # uploaded whole
    for f in local.rglob("*"):
        if f.is_file():
            s3_server.upload(f, f"refs/s3.parq/{f.relative_to(local)}")
    remote = f"s3://{s3_server.bucket}/refs/s3.parq"
    s3_server.counter.reset()
    ours = xr.open_dataset(remote, engine="refgrid", storage_options=options)
    values = ours.tas.values
    expected = closed(xr.open_mfdataset(MONTHS, combine="nested", concat_dim="time",
                                 data_vars="minimal", compat="equals"))
    np.testing.assert_array_equal(values, expected.tas.values)
    assert refgrid.scan(remote, **options) == group


def test_third_party_dictionary_paths_with_narrow_indices_and_nulls():
    """Other writers may store paths as a dictionary with int8 indices: a null path (a missing
    chunk) must not overflow them."""
    import pyarrow as pa

    from refgrid.model.manifest import ManifestBuilder
    from refgrid.refs.records import into_manifest as _fill

    names = pa.array([f"s3://b/f{i}.nc" for i in range(128)])
    table = pa.table({"path": pa.DictionaryArray.from_arrays(
                          pa.array([0, 127, None, 5], pa.int8()), names),
                      "offset": [10, 20, 30, 40], "size": [1, 2, 3, 4]})
    built = ManifestBuilder((4,))
    _fill(table, 0, built)
    manifest = built.build()
    assert manifest.urls().tolist() == ["s3://b/f0.nc", "s3://b/f127.nc", None, "s3://b/f5.nc"]
    assert manifest.offset.tolist() == [10, 20, 0, 40]
    assert manifest.length.tolist() == [1, 2, 0, 4]


def test_attributes_that_are_not_finite_survive_the_fast_json_of_appends(tmp_path):
    """``.zmetadata`` is parsed by orjson where it can be, which refuses the NaN and
    Infinity attribute values may be: those stay as netCDF4 reads them through a batch and
    an append."""
    import math

    import netCDF4

    from refgrid.core import jsonio

    def written(k: int) -> None:
        with netCDF4.Dataset(tmp_path / f"f{k}.nc", "w") as ds:
            ds.note = np.nan
            ds.createDimension("time", None)
            t = ds.createVariable("time", "f8", ("time",))
            t.units = "days since 2000-01-01"
            t[:] = np.arange(3 * k, 3 * k + 3)
            v = ds.createVariable("v", "f4", ("time",), fill_value=np.float32(np.nan))
            v.valid_max = np.inf
            v.valid_min = -np.inf
            v[:] = [1.0, np.nan, 3.0]

    out = tmp_path / "out.parq"
    for k in range(3):
        written(k)
        refgrid.batch(str(tmp_path / "f*.nc"), out, scheduler="synchronous", progress=False)
    assert json.loads((tmp_path / "out.parq.report.json").read_text())["update"].startswith(
        "append")
    with closed(xr.open_dataset(out, engine="refgrid", mask_and_scale=False)) as ds, \
            netCDF4.Dataset(tmp_path / "f0.nc") as truth:
        assert math.isnan(ds.attrs["note"]) and math.isnan(truth.note)
        assert ds["v"].attrs["valid_max"] == truth["v"].valid_max == np.inf
        assert ds["v"].attrs["valid_min"] == -np.inf
        assert ds.sizes["time"] == 9 and np.isnan(ds["v"].values[1::3]).all()
    meta = jsonio.loads((out / ".zmetadata").read_bytes())  # json's fallback: NaN inside
    assert meta["refgrid"]["source_table"] == {
        "rows": 3, "page_rows": 10_000, "pages": [str(tmp_path / "f0.nc")],
        "first": str(tmp_path / "f0.nc"),
        "last": str(tmp_path / "f2.nc")}
    for text in (b'{"big": 123456789012345678901234567890}', b'[-12345678901234567890]',
                 b'[-9999999999999999999, 9223372036854775807]',
                 b'[18446744073709551615, 1.2345678901234567e-300, "01234567890123456789"]',
                 b'{"a": [NaN, Infinity, -Infinity]}'):
        got, want = jsonio.loads(text), json.loads(text)
        assert repr(got) == repr(want) and type(got) is type(want), text


def test_an_append_keeps_one_identity_a_url(tmp_path):
    """Sources added that the archive holds already (the last file's rewritten chunks, say)
    are not a second row: the sources' record files still read, the newer identity kept."""
    from refgrid.writers.parquet import append_parquet

    files = sorted((FIXTURES / "monthly" / "chunk10").glob("tas_2001*.nc"))[:5]
    refs = refgrid.write(refgrid.combine([refgrid.scan(f) for f in files], "time"),
                         tmp_path / "refs.parq", record_size=2)
    meta = json.loads((refs / ".zmetadata").read_text())
    again = {str(files[1]): {"size": 7, "mtime": 1.5}, str(tmp_path / "new.nc"): {"size": 3}}
    append_parquet(refs, meta, {}, meta["metadata"], again)
    sources = refgrid.scan(refs).sources
    assert len(sources) == len(dict(sources.items())) == 6
    assert sources[str(files[1])] == {"size": 7, "mtime": 1.5}
    assert sources[str(tmp_path / "new.nc")] == {"size": 3}
    assert json.loads((refs / ".zmetadata").read_text())["refgrid"]["source_table"]["rows"] == 6
