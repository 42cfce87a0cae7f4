"""Existing kerchunk reference sets as input: kerchunk's own output for every fixture goes
through scan → write → read and is compared with ground truth and with what kerchunk's
references themselves read as (stock zarr, Zarr v2); JSON v0/v1, templates, generators and
parquet inputs; combining kerchunk references along an irregular time dimension."""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import numpy as np
import pytest
import xarray as xr
import zarr

import refgrid
from acceptance import refgrid_reader
from ground_truth import ground_truth, restore, same
from helpers import FIXTURES, closed, data_files
from kerchunk_peer import Translations, translate
from refgrid.errors import FormatError, RefgridError
from refgrid.model.virtual import VirtualArray
from refgrid.writers.references import to_kerchunk


@pytest.fixture(scope="module")
def kerchunk_refs(tmp_path_factory) -> Translations:
    return translate(data_files(FIXTURES), tmp_path_factory.mktemp("kerchunk"))


def _kerchunk_read(refs_path: Path):
    """How kerchunk's references read with stock zarr (Zarr v2 metadata)."""
    fs = fsspec.filesystem("reference", fo=str(refs_path))
    group = zarr.open_group(fs.get_mapper(), mode="r", zarr_format=2)

    def read(name):
        try:
            return group[name][...]
        except Exception as e:
            return e
    return read


def test_kerchunk_output_for_every_fixture_round_trips(kerchunk_refs):
    """Where kerchunk's references are right, ours equal ground truth; where kerchunk itself
    is wrong (it drops or misreads some variables), we reproduce its references faithfully
    (same values, or a clear refgrid error for a chunk that cannot decode) — never
    something else."""
    counts = {"equal to ground truth": 0, "kerchunk wrong, reproduced": 0,
              "kerchunk wrong, clear error": 0, "absent from kerchunk's refs": 0}
    problems = []
    for source, refs_path in kerchunk_refs.refs.items():
        group = refgrid.scan(refs_path, on_error="report")
        arrays = {p: n for p, n in group.walk() if isinstance(n, VirtualArray)}
        ours_read = refgrid_reader(to_kerchunk(group))
        theirs_read = _kerchunk_read(refs_path)
        for name, truth in ground_truth(source).items():
            if isinstance(truth, Exception):
                continue
            if name not in arrays:
                counts["absent from kerchunk's refs"] += 1
                continue
            theirs = theirs_read(name)
            try:
                ours = restore(ours_read(name), dict(arrays[name].attrs))
            except RefgridError as e:
                ours = e
            if not isinstance(ours, Exception) and same(ours, truth):
                counts["equal to ground truth"] += 1
            elif not isinstance(theirs, Exception) and same(theirs, truth):
                problems.append(f"{source.name}:{name}: kerchunk reads it right, we do not")
            elif isinstance(ours, Exception):
                counts["kerchunk wrong, clear error"] += 1
            elif not isinstance(theirs, Exception) and same(ours, theirs):
                counts["kerchunk wrong, reproduced"] += 1
            else:
                problems.append(f"{source.name}:{name}: differs from truth and from kerchunk")
    print(f"\n{len(kerchunk_refs.refs)} files translated by kerchunk; {counts}")
    print("kerchunk produced nothing for:",
          {p.name: reason for p, reason in kerchunk_refs.failed.items()})
    assert not problems, problems
    assert len(kerchunk_refs.refs) >= 60 and counts["equal to ground truth"] >= 250


def _monthly_refs(kerchunk_refs: Translations, archive: str = "monthly/chunk10"):
    return {s: r for s, r in kerchunk_refs.refs.items()
            if s.parent == FIXTURES / archive}


@pytest.mark.parametrize("archive", ["monthly/chunk10", "netcdf3/classic"])
def test_kerchunk_references_combine_along_an_irregular_dimension(kerchunk_refs, archive,
                                                                  tmp_path):
    refs = _monthly_refs(kerchunk_refs, archive)
    assert len(refs) == len(list((FIXTURES / archive).glob("*.nc")))
    combined = refgrid.combine([refgrid.scan(r) for r in refs.values()], "time")
    out = refgrid.write(combined, tmp_path / "combined.json")
    document = json.loads(json.loads(out.read_text())["refs"]["tas/zarr.json"])
    if archive == "monthly/chunk10":
        assert document["chunk_grid"]["name"] == "rectilinear"
    ours = xr.open_dataset(out, engine="refgrid", mask_and_scale=False, decode_times=False)
    expected = closed(xr.open_mfdataset(sorted(refs), combine="nested", concat_dim="time",
                                 data_vars="minimal", compat="equals", mask_and_scale=False,
                                 decode_times=False))
    for key in expected.variables:
        np.testing.assert_array_equal(ours[key].values, expected[key].values, err_msg=key)


def _one(kerchunk_refs: Translations, name: str, folder: str = "") -> tuple[Path, dict]:
    source = next(s for s in kerchunk_refs.refs if s.name == name
                  and s.parent.match(f"*{folder}"))
    return source, json.loads(kerchunk_refs.refs[source].read_text())


def _assert_reads_like(group, source: Path) -> None:
    """Every array equals ground truth (kerchunk leaves out some, e.g. null dataspaces)."""
    read = refgrid_reader(to_kerchunk(group))
    truth = ground_truth(source)
    arrays = [p for p, n in group.walk() if isinstance(n, VirtualArray)]
    assert arrays
    for name in arrays:
        assert same(read(name), truth[name]), name


def test_version_0_json_and_templates(kerchunk_refs, tmp_path):
    source, refs = _one(kerchunk_refs, "tas_200102.nc", "netcdf3/classic")
    v0 = tmp_path / "v0.json"
    v0.write_text(json.dumps(refs["refs"]))  # version 0: the bare mapping
    _assert_reads_like(refgrid.scan(v0), source)
    templated = {"version": 1, "templates": {"u": str(source)},
                 "refs": {k: ["{{u}}", *v[1:]] if isinstance(v, list) else v
                          for k, v in refs["refs"].items()}}
    v1 = tmp_path / "templated.json"
    v1.write_text(json.dumps(templated))
    group = refgrid.scan(v1)
    assert group["tas"].manifest.paths == (str(source),)
    _assert_reads_like(group, source)


def test_generators(kerchunk_refs, tmp_path):
    """A v1 ``gen`` entry expands to many chunk keys (jinja2 templates over ranges)."""
    source, refs = _one(kerchunk_refs, "tas_200102.nc", "netcdf3/classic")
    entries = dict(refs["refs"])
    chunk_keys = sorted((k for k in entries if k.startswith("tas/") and "/." not in k),
                        key=lambda k: int(k[4:].split(".")[0]))
    offsets = [entries[k][1] for k in chunk_keys]
    sizes = {entries[k][2] for k in chunk_keys}
    assert len(sizes) == 1, "NetCDF3 records: uncompressed, one size, a fixed stride"
    stride = offsets[1] - offsets[0]
    assert set(np.diff(offsets)) == {stride}
    for k in chunk_keys:
        del entries[k]
    spec = {"version": 1, "templates": {"u": str(source)}, "refs": entries,
            "gen": [{"key": "tas/{{i}}.0.0", "url": "{{u}}",
                     "offset": f"{{{{{offsets[0]} + i * {stride}}}}}",
                     "length": str(sizes.pop()),
                     "dimensions": {"i": {"stop": len(chunk_keys)}}}]}
    path = tmp_path / "gen.json"
    path.write_text(json.dumps(spec))
    _assert_reads_like(refgrid.scan(path), source)


def test_parquet_references(kerchunk_refs, tmp_path):
    from kerchunk.df import refs_to_dataframe

    for name, folder in (("tas_200102.nc", "monthly/chunk10"),
                         ("tas_200102.nc", "netcdf3/classic"),  # small chunks inlined: "raw"
                         ("hdf5_layouts_latest.h5", "features")):
        source, refs = _one(kerchunk_refs, name, folder)
        target = tmp_path / f"{folder.replace('/', '_')}_{name}.parq"
        refs_to_dataframe(refs, str(target), record_size=7)  # several record files
        group = refgrid.scan(target)
        direct = refgrid.scan(kerchunk_refs.refs[source])
        assert sorted(p for p, _ in group.walk()) == sorted(p for p, _ in direct.walk())
        for path, node in group.walk():
            if isinstance(node, VirtualArray):
                assert node.manifest == direct[path].manifest, path
        inlined = sum(len(n.manifest.inline) for _, n in group.walk()
                      if isinstance(n, VirtualArray))
        assert inlined or folder != "netcdf3/classic"
        _assert_reads_like(group, source)


def test_v2_metadata_is_translated_to_v3(kerchunk_refs):
    tas = refgrid.scan(kerchunk_refs.refs[_one(kerchunk_refs, "tas_200102.nc")[0]])["tas"]
    assert tas.dims == ("time", "lat", "lon")
    assert "_ARRAY_DIMENSIONS" not in tas.attrs
    assert tas.grid.chunk_shape[1:] == (6, 8)
    filters = refgrid.scan(kerchunk_refs.refs[_one(kerchunk_refs, "hdf5_filters.h5")[0]])
    names = [c["name"] for c in filters["gzip"].codecs]
    assert names[0] == "bytes" and "numcodecs.zlib" in names


def _write_refs(tmp_path: Path, zarray: dict, attrs: dict | None = None) -> Path:
    refs = {".zgroup": json.dumps({"zarr_format": 2}),
            "v/.zarray": json.dumps({"zarr_format": 2, "shape": [4], "chunks": [2],
                                     "dtype": "<i4", "fill_value": 0, "order": "C",
                                     "compressor": None, "filters": None, **zarray}),
            "v/.zattrs": json.dumps(attrs or {"_ARRAY_DIMENSIONS": ["x"]})}
    path = tmp_path / "refs.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path


def test_a_codec_after_the_array_to_bytes_codec_is_refused(tmp_path):
    path = _write_refs(tmp_path, {"filters": [{"id": "zlib"}, {"id": "delta", "dtype": "<i4"}]})
    with pytest.raises(FormatError, match=r"refs\.json.*\bv\b.*'delta' follows the array→bytes"):
        refgrid.scan(path)


def test_inline_chunks_and_fill_values(tmp_path):
    path = _write_refs(tmp_path, {"fill_value": -1})
    refs = json.loads(path.read_text())
    refs["refs"]["v/0"] = "base64:" + __import__("base64").b64encode(
        np.array([5, 6], "<i4").tobytes()).decode()
    path.write_text(json.dumps(refs))
    v = refgrid.scan(path)["v"]
    np.testing.assert_array_equal(refgrid_reader(to_kerchunk(refgrid.scan(path)))("v"),
                                  [5, 6, -1, -1])
    assert v.fill_value == -1


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "not a kerchunk reference set"),
    (json.dumps({"version": 1, "refs": {"a/b": ["x", 0, 1]}}), "not Zarr references"),
])
def test_bad_reference_sets_name_the_file(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(FormatError, match=rf"bad\.json.*{message}"):
        refgrid.scan(path)


def test_reference_sets_on_s3(kerchunk_refs, s3_server, tmp_path):
    """JSON and parquet reference sets read from S3 give the same model as locally."""
    from kerchunk.df import refs_to_dataframe

    source, refs = _one(kerchunk_refs, "tas_200102.nc", "monthly/chunk10")
    local = refgrid.scan(kerchunk_refs.refs[source])
    parquet = tmp_path / "refs.parq"
    refs_to_dataframe(refs, str(parquet), record_size=2)
    uploads = {"refs/tas.json": kerchunk_refs.refs[source],
               **{f"refs/tas.parq/{p.relative_to(parquet)}": p
                  for p in parquet.rglob("*") if p.is_file()}}
    for key, path in uploads.items():
        s3_server.upload(path, key)
    for key in ("refs/tas.json", "refs/tas.parq"):
        url = f"s3://{s3_server.bucket}/{key}"
        with pytest.raises(refgrid.AccessError, match="outside the allowed sources"):
            refgrid.scan(url, **s3_server.storage_options)  # remote refs, local sources
        remote = refgrid.scan(url, allowed_sources=[str(FIXTURES)],
                              **s3_server.storage_options)
        for (path, a), (_, b) in zip(remote.walk(), local.walk(), strict=True):
            if isinstance(a, VirtualArray):
                assert a.manifest == b.manifest and a.grid == b.grid, (key, path)


def test_a_directory_that_is_not_parquet_references(tmp_path):
    with pytest.raises(FormatError, match=r"no \.zmetadata: not kerchunk parquet references"):
        refgrid.scan(tmp_path)


@pytest.fixture
def zarr_v2_store(tmp_path):
    """A Zarr v2 store with array→array filters, written by zarr-python itself."""
    import numcodecs

    group = zarr.open_group(tmp_path / "store", mode="w", zarr_format=2)
    delta = group.create_array("delta", shape=(10, 6), chunks=(4, 4), dtype="<i4",
                               filters=[numcodecs.Delta(dtype="<i4")],
                               compressors=[numcodecs.Zlib(level=3)], fill_value=-1)
    delta[:] = np.arange(60, dtype="<i4").reshape(10, 6) * 7
    delta[8:, 4:] = -1  # the last chunk reads as fill: zarr does not write it
    scaled = group.create_array("scaled", shape=(9,), chunks=(4,), dtype="<f8",
                                filters=[numcodecs.FixedScaleOffset(
                                    offset=10, scale=100, dtype="<f8", astype="<i2")],
                                compressors=None, fill_value=0.0)
    scaled[:] = np.linspace(10, 12, 9)
    return group


@pytest.mark.parametrize("form", ["json", "parquet"])
def test_zarr_v2_filters_and_whole_file_references(zarr_v2_store, tmp_path, form):
    """kerchunk's references to a Zarr v2 store: ``[url]`` whole-file chunks, Delta and
    FixedScaleOffset filters (array→array) — read by refgrid and served through the mapper
    to stock zarr as the store itself reads."""
    from kerchunk.df import refs_to_dataframe
    from kerchunk.zarr import single_zarr

    refs = single_zarr(str(tmp_path / "store"), inline_threshold=0)
    assert refs["refs"]["delta/0.0"] == [f"file://{tmp_path}/store/delta/0.0"]
    target = tmp_path / ("refs.json" if form == "json" else "refs.parq")
    if form == "json":
        target.write_text(json.dumps(refs))
    else:
        refs_to_dataframe(refs, str(target), record_size=4)
    group = refgrid.scan(target)
    assert [c["name"] for c in group["delta"].codecs] == ["numcodecs.delta", "bytes",
                                                          "numcodecs.zlib"]
    assert group["delta"].manifest.missing.sum() == 1
    view = zarr.open_group(refgrid.get_mapper(to_kerchunk(group)), mode="r", zarr_format=3)
    read = refgrid_reader(to_kerchunk(group))
    for name in ("delta", "scaled"):
        expected = zarr_v2_store[name][...]
        np.testing.assert_array_equal(read(name), expected, err_msg=name)
        np.testing.assert_array_equal(view[name][...], expected, err_msg=name)


def test_a_codec_that_decodes_to_an_array_itself(tmp_path):
    """Codecs such as kerchunk's ``grib`` or imagecodecs' image codecs turn bytes into an
    array: they become the array→bytes codec. Stock zarr does not know them, so the mapper
    serves their chunks decoded."""
    import base64

    import imagecodecs

    image = (np.arange(4 * 6 * 5) % 251).astype("u1").reshape(4 * 6, 5)
    refs = {".zgroup": json.dumps({"zarr_format": 2}),
            "img/.zarray": json.dumps({"zarr_format": 2, "shape": [24, 5], "chunks": [6, 5],
                                       "dtype": "|u1", "fill_value": 0, "order": "C",
                                       "compressor": {"id": "imagecodecs_png"},
                                       "filters": None}),
            "img/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["y", "x"]})}
    for k in range(4):
        png = imagecodecs.png_encode(image[6 * k:6 * (k + 1)])
        refs[f"img/{k}.0"] = "base64:" + base64.b64encode(png).decode()
    path = tmp_path / "png.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    group = refgrid.scan(path)
    assert [c["name"] for c in group["img"].codecs] == ["numcodecs.imagecodecs_png"]
    np.testing.assert_array_equal(refgrid_reader(to_kerchunk(group))("img"), image)
    view = zarr.open_group(refgrid.get_mapper(to_kerchunk(group)), mode="r", zarr_format=3)
    np.testing.assert_array_equal(view["img"][...], image)


def test_an_unknown_codec_is_named(tmp_path):
    path = _write_refs(tmp_path, {"compressor": {"id": "no_such_codec"}})
    with pytest.raises(FormatError, match=r"refs\.json.*\bv\b.*'no_such_codec' is not available"):
        refgrid.scan(path)


NAMES = ["Zürich", "Malmö", "Besançon", "Açores", "Москва", "東京", "Praha"]


@pytest.fixture(scope="module")
def stations(tmp_path_factory) -> Path:
    """Station names as a netCDF file keeps them: UTF-8 text (any script), and the same
    names as Latin-1 bytes in a char array."""
    import netCDF4

    path = tmp_path_factory.mktemp("stations") / "stations.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("station", len(NAMES))
        nc.createDimension("nchar", 24)
        nc.createVariable("name", str, ("station",))[:] = np.array(NAMES, dtype=object)
        utf8 = nc.createVariable("name_utf8", "S1", ("station", "nchar"))
        latin1 = nc.createVariable("name_latin1", "S1", ("station", "nchar"))
        for i, name in enumerate(NAMES):
            for var, encoding in ((utf8, "utf-8"), (latin1, "latin-1")):
                data = name.encode(encoding, errors="replace").ljust(24, b"\0")
                var[i] = np.frombuffer(data, "S1")
        nc.createVariable("height", "f4", ("station",))[:] = np.arange(len(NAMES)) * 10.5
    return path


def test_kerchunk_inline_text_chunks_read_as_fsspec_reads_them(stations, tmp_path):
    """kerchunk inlines small chunks as plain JSON text whenever their bytes decode as
    UTF-8 (names with accents or in other scripts), as base64 otherwise; fsspec reads text
    back as UTF-8. refgrid reads the same JSON exactly as fsspec + zarr do and as netCDF4
    reads the file."""
    from kerchunk.hdf import SingleHdf5ToZarr

    with open(stations, "rb") as f:
        refs = SingleHdf5ToZarr(f, str(stations), inline_threshold=1000).translate()
    texts = [v for k, v in refs["refs"].items() if not k.endswith((".zarray", ".zattrs",
             ".zgroup")) and isinstance(v, str) and not v.startswith("base64:")]
    assert any(not t.isascii() for t in texts), "kerchunk inlined no non-ASCII text"
    assert any(isinstance(v, str) and v.startswith("base64:") for v in refs["refs"].values())
    path = tmp_path / "stations.json"
    path.write_text(json.dumps(refs, ensure_ascii=False), encoding="utf-8")
    theirs = _kerchunk_read(path)
    ours = xr.open_dataset(path, engine="refgrid", mask_and_scale=False)
    import h5py

    with xr.open_dataset(stations, engine="netcdf4", mask_and_scale=False) as truth, \
            h5py.File(stations) as raw:
        for name in ("name_utf8", "name_latin1", "height"):
            np.testing.assert_array_equal(ours[name].values, truth[name].values, err_msg=name)
            np.testing.assert_array_equal(theirs(name), raw[name][...], err_msg=name)
        assert [n.decode() for n in ours["name_utf8"].values] == NAMES
    group = refgrid.scan(refs)  # the same references as a loaded dict
    assert {p for p, _ in group.walk()} >= {"name_utf8", "name_latin1", "height"}
