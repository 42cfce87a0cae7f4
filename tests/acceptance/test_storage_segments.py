"""Archives written by many tools read as one exact array, without copying (issue #53).

Each archive of :mod:`storage` stores ``tas`` in other ways from file to file. Combined, it
is one array in segments (:mod:`refgrid.model.segments`), and every way a user reads it —
the engine on JSON and parquet references, ``open_store`` (native and regular chunks),
``get_mapper``, ``materialize``, the service's Zarr views and DAP2/DAP4 through netCDF-C,
a batch and its append — gives what ``xr.open_mfdataset`` gives: values bit for bit, types
(xarray's promotion), attributes. Stock readers of the written references fail loudly.
"""

from __future__ import annotations

import fsspec
import numpy as np
import pytest
import xarray as xr
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import refgrid
from helpers import RECTILINEAR, closed
from refgrid.errors import BatchError, CombineError, WriteError
from servers import start_refgrid_serve
from storage import KINDS, VARIANTS, archive, variant

READ = [k for k in KINDS if k != "chunking"]


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    root = tmp_path_factory.mktemp("storage")
    return root, {kind: archive(root / "files", kind) for kind in KINDS}


@pytest.fixture(scope="module")
def written(archives):
    root, files = archives
    out = {}
    for kind in READ:
        group = refgrid.combine([str(f) for f in files[kind]], "time")
        out[kind] = (group, refgrid.write(group, root / "refs" / f"{kind}.json"),
                     refgrid.write(group, root / "parquet" / f"{kind}.parq"))
    return out


@pytest.fixture(scope="module")
def server(archives, written):
    root, _ = archives
    yield from start_refgrid_serve(root / "refs", allow_sources=(str(root / "files"),),
                                   recheck=0.0)


def _expected(files) -> xr.Dataset:
    return closed(xr.open_mfdataset(files, combine="nested", concat_dim="time",
                                    data_vars="minimal", compat="equals"))


def _same(ours: xr.Dataset, files, what: str) -> None:
    """Values (NaN where xarray has NaN), types and attributes of every variable."""
    expected = _expected(files)
    ours = closed(ours)
    assert set(ours.variables) == set(expected.variables), what
    for key, want in expected.variables.items():
        got = ours[key]
        assert got.dtype == want.dtype, (what, key, got.dtype, want.dtype)
        np.testing.assert_array_equal(got.values, want.values, err_msg=f"{what}: {key}")
        assert got.attrs == want.attrs, (what, key, got.attrs, want.attrs)


@pytest.mark.parametrize("kind", READ)
def test_each_archive_combines_in_segments_and_reads_as_open_mfdataset(archives, written,
                                                                       kind):
    _, files = archives
    group, json_refs, parquet = written[kind]
    entries = [e for e in group.report if e.variable == "tas"]
    if kind in ("nccopy", "xarray"):  # equal decoding: no segment at all
        assert group["tas"].segments is None and not entries
    else:
        assert group["tas"].segments is not None
        assert [e.action for e in entries] == ["segmented"]
    for refs in (json_refs, parquet):
        _same(xr.open_dataset(refs, engine="refgrid"), files[kind], f"engine {refs.name}")
        _same(xr.open_dataset(refs, engine="refgrid", chunks={}), files[kind], "dask")
        _same(xr.open_dataset(refgrid.get_mapper(refs), engine="zarr", consolidated=True),
              files[kind], "mapper")
        _same(xr.open_dataset(refgrid.open_store(refs, chunks="auto"), engine="zarr",
                              consolidated=True), files[kind], "store, regular chunks")
        if RECTILINEAR:
            with zarr.config.set(refgrid.zarr_config()):
                _same(xr.open_dataset(refgrid.open_store(refs), engine="zarr",
                                      consolidated=True), files[kind], "store, native")
    unpacked = xr.open_dataset(refgrid.open_store(json_refs, chunks="auto", unpack=True),
                               engine="zarr", consolidated=True)
    np.testing.assert_array_equal(closed(unpacked).tas.values,
                                  _expected(files[kind]).tas.values)


@pytest.mark.parametrize("kind", ["packing", "everything"])
def test_materialize_copies_the_values_xarray_reads(archives, written, kind, tmp_path):
    _, files = archives
    out = tmp_path / "copy.zarr"
    refgrid.materialize(written[kind][1], out, progress=False)
    _same(xr.open_dataset(out, engine="zarr"), files[kind], "materialized")


@pytest.mark.parametrize("view", ["native", "regular"])
@pytest.mark.parametrize("kind", ["packing", "everything"])
def test_the_service_s_zarr_views_read_as_open_mfdataset(archives, server, kind, view):
    _, files = archives
    url = f"{server.url}/{kind}/{view}"
    with zarr.config.set(refgrid.zarr_config()):
        if view == "native" and not RECTILINEAR:
            pytest.skip("zarr < 3.2 reads no rectilinear grid (the regular view serves it)")
        _same(xr.open_dataset(fsspec.get_mapper(url), engine="zarr", consolidated=True),
              files[kind], f"served {view}")


@pytest.mark.parametrize("mode", ["dap2", "dap4"])
@pytest.mark.parametrize("kind", ["packing", "everything"])
def test_dap_clients_read_as_open_mfdataset(archives, server, kind, mode):
    _, files = archives
    _same(xr.open_dataset(f"{server.url}/dap/{kind}#mode={mode}", engine="netcdf4"),
          files[kind], mode)


def test_lat_lon_chunked_another_way_is_refused_by_name(archives):
    _, files = archives
    with pytest.raises(CombineError, match=r"tas: chunking on other dimensions differs in "
                                           r".*tas_1\.nc from .*tas_0\.nc"):
        refgrid.combine([str(f) for f in files["chunking"]], "time")


@pytest.mark.parametrize("kind", ["packing", "everything"])
def test_stock_readers_of_the_references_fail_loudly(archives, written, kind, tmp_path):
    """fsspec's ``reference://`` with zarr: an unknown codec, never one segment's bytes read
    by another's encoding; kerchunk-v2 and Icechunk outputs are refused by name."""
    group, json_refs, _ = written[kind]
    mapper = fsspec.get_mapper("reference://", fo=str(json_refs))
    loud = r"refgrid\.segments" if RECTILINEAR else r"refgrid\.segments|Unknown chunk grid"
    with zarr.config.set(refgrid.zarr_config()), pytest.raises(Exception, match=loud):
        zarr.open_group(mapper, mode="r", zarr_format=3)["tas"][...]
    with pytest.raises(WriteError, match=r"'tas': \d+ segments along 'time'.*format='json'"):
        refgrid.write(group, tmp_path / "v2.json", format="kerchunk-v2")
    icechunk = pytest.importorskip("icechunk")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "ic")))
    with pytest.raises(WriteError, match=r"Icechunk output cannot record"):
        refgrid.write(group, repo)


def _kerchunk_engine(refs):
    pytest.importorskip("kerchunk")
    return xr.open_dataset(str(refs), engine="kerchunk")


def _virtualizarr(refs):
    virtualizarr = pytest.importorskip("virtualizarr")
    from obspec_utils.registry import ObjectStoreRegistry
    from obstore.store import LocalStore
    from virtualizarr.parsers import KerchunkJSONParser, KerchunkParquetParser

    parser = KerchunkJSONParser() if refs.suffix == ".json" else KerchunkParquetParser()
    return virtualizarr.open_virtual_dataset(
        f"file://{refs}", registry=ObjectStoreRegistry({"file://": LocalStore()}),
        parser=parser)


def _fsspec_zarr(refs):
    mapper = fsspec.get_mapper("reference://", fo=str(refs))
    with zarr.config.set(refgrid.zarr_config()):
        return xr.open_zarr(mapper, consolidated=False, zarr_format=3)


@pytest.mark.parametrize("reader", [_kerchunk_engine, _virtualizarr, _fsspec_zarr])
@pytest.mark.parametrize("form", [1, 2], ids=["json", "parquet"])
def test_each_stock_reader_of_either_form_fails_or_reads_exactly(archives, written, reader,
                                                                 form):
    """kerchunk's xarray engine, VirtualiZarr's kerchunk parsers and zarr over fsspec's
    ``reference://``, on refgrid's JSON and parquet references of an archive in segments:
    each refuses it (today every one does) — were one to read it, its values must be
    xarray's, never one segment's bytes decoded by another's packing."""
    _, files = archives
    refs = written["everything"][form]
    try:
        ours = reader(refs)
        if reader is _virtualizarr:  # (a virtual dataset: its values are read elsewhere)
            pytest.fail(f"VirtualiZarr took an archive in segments: {ours}")
        ours = ours.load()
    except Exception as e:  # loud: the reader's own error, raised before any value
        assert not isinstance(e, AssertionError), e
        return
    _same(ours, files["everything"], reader.__name__)


def test_recode_writes_a_uniform_copy_of_netcdf3_among_netcdf4(archives, tmp_path):
    """Big-endian NETCDF3 chunks re-encoded in the first file's codecs and byte order."""
    _, files = archives
    group = refgrid.combine([str(f) for f in files["netcdf3"]], "time", codecs="recode")
    assert group["tas"].segments is None and group["tas"].dtype == np.dtype("<f4")
    assert [e.action for e in group.report if e.variable == "tas"] == ["inlined"]
    _same(xr.open_dataset(refgrid.write(group, tmp_path / "copy.json"), engine="refgrid"),
          files["netcdf3"], "recoded")


def test_strict_and_recode_choices_say_what_differs(archives):
    _, files = archives
    paths = [str(f) for f in files["everything"]]
    with pytest.raises(CombineError, match=r"tas: dtype differs in .*tas_2\.nc"):
        refgrid.combine(paths, "time", codecs="error")
    packed = [str(f) for f in files["packing"]]
    with pytest.raises(CombineError, match=r"tas: add_offset differs in .*tas_1\.nc"):
        refgrid.combine(packed, "time", codecs="recode")


@pytest.mark.parametrize("kind, first, then", [("packing", 3, 6), ("everything", 3, 4)])
def test_a_batch_and_its_append_bring_new_segments(archives, tmp_path, kind, first, then):
    """Appended files bring their own segments; the archive reads as a rebuild would."""
    _, files = archives
    out = tmp_path / "tas.parq"
    every = files[kind]
    refgrid.batch([str(f) for f in every[:first]], out, scheduler="synchronous",
                  progress=False)
    _same(xr.open_dataset(out, engine="refgrid"), every[:first], "batch")
    appended = refgrid.batch([str(f) for f in every[:then]], out, scheduler="synchronous",
                             progress=False, append=True)
    assert appended.scanned == then - first
    _same(xr.open_dataset(out, engine="refgrid"), every[:then], "appended")


def test_an_append_that_changes_how_the_archive_reads_is_a_rebuild(archives, tmp_path):
    """float64 among float32 makes every value float64: not an append, said so; a run
    without ``append`` rebuilds it."""
    _, files = archives
    out = tmp_path / "tas.parq"
    every = [str(f) for f in files["everything"]]
    refgrid.batch(every[:4], out, scheduler="synchronous", progress=False)
    with pytest.raises(BatchError, match=r"cannot append .*tas/zarr\.json of the new files "
                                         r"differs .*rebuild"):
        refgrid.batch(every, out, scheduler="synchronous", progress=False, append=True)
    _same(xr.open_dataset(out, engine="refgrid"), files["everything"][:4], "kept")
    refgrid.batch(every, out, scheduler="synchronous", progress=False)
    _same(xr.open_dataset(out, engine="refgrid"), files["everything"], "rebuilt")


@settings(max_examples=8, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.sampled_from(VARIANTS), min_size=2, max_size=4))
def test_any_mix_of_writers_reads_as_open_mfdataset_through_every_reader(tmp_path, kinds):
    """Archives drawn file by file from every way of writing them: the engine, the store
    (regular chunks) and the mapper read each as ``open_mfdataset`` does (the last two
    unpacking, as a stock reader of a packed archive must: Zarr's JSON attributes lose the
    float32 type of its factors)."""
    root = tmp_path / "-".join(kinds) / str(len(list(tmp_path.iterdir())))
    files = [variant(root / f"tas_{k}.nc", k, kind) for k, kind in enumerate(kinds)]
    group = refgrid.combine([str(f) for f in files], "time")
    refs = refgrid.write(group, root / "refs.json")
    _same(xr.open_dataset(refs, engine="refgrid"), files, f"engine {kinds}")
    _same(xr.open_dataset(refgrid.open_store(refs, chunks="auto", unpack=True), engine="zarr",
                          consolidated=True), files, f"store {kinds}")
    _same(xr.open_dataset(refgrid.get_mapper(refs, unpack=True), engine="zarr",
                          consolidated=True), files, f"mapper {kinds}")


def test_members_whose_files_each_pack_otherwise_are_refused_by_name(tmp_path):
    """Segments run along one dimension: members in segments along time are not stacked
    (their time would be folded into the members), they are refused naming the variable."""
    files = [variant(tmp_path / member / f"tas_{k}.nc", k, "repacked")
             for member in ("r1", "r2") for k in (1, 2)]
    with pytest.raises(CombineError, match=r"tas.*in segments along 'time'.*'member'"):
        refgrid.combine([str(f) for f in files], "time", stack_dim="member",
                        stack_by="{member}/*.nc")


def test_a_decoded_array_keeps_no_stored_type_for_writers(tmp_path):
    """Packed int16 beside float32: the decoded values carry no int16 ``dtype`` encoding,
    which ``to_netcdf`` and ``materialize`` would write them back in."""
    files = [variant(tmp_path / "tas_0.nc", 0, "packed"),
             variant(tmp_path / "tas_1.nc", 1, "netcdf4")]
    refs = refgrid.write(refgrid.combine([str(f) for f in files], "time"),
                         tmp_path / "refs.json")
    ours = closed(xr.open_dataset(refs, engine="refgrid"))
    assert ours.tas.encoding.get("dtype") in (None, np.dtype("float32"))
    ours.to_netcdf(tmp_path / "again.nc")
    _same(xr.open_dataset(tmp_path / "again.nc"), files, "written again")


def test_a_batch_record_keeps_its_segments(archives):
    from refgrid.archive.record import dumps, loads

    _, files = archives
    group = refgrid.combine([str(f) for f in files["everything"]], "time")
    back, _ = loads(dumps(group, {}), "record")
    assert back["tas"].segments == group["tas"].segments


def test_chunks_a_file_never_wrote_read_as_that_file_s_fill_in_every_view(tmp_path):
    """A packed file whose later chunks were never written (netCDF's default fill there,
    unpacked as xarray unpacks it) beside a float one: the regular view serves those chunks
    decoded by their own segment, as the engine reads them — not the array's fill."""
    import netCDF4

    first = variant(tmp_path / "tas_0.nc", 0, "packed")
    with netCDF4.Dataset(first, "a") as ds:  # (a second variable, written in part only)
        v = ds.createVariable("part", "i2", ("time", "lat", "lon"), chunksizes=(10, 4, 5))
        v.scale_factor, v.add_offset = np.float32(0.5), np.float32(100)
        v[:10] = np.ones((10, 4, 5), "i2")
    second = variant(tmp_path / "tas_1.nc", 1, "float64")
    with netCDF4.Dataset(second, "a") as ds:
        ds.createVariable("part", "f8", ("time", "lat", "lon"))[:] = np.zeros((30, 4, 5))
    files = [first, second]
    refs = refgrid.write(refgrid.combine([str(f) for f in files], "time"),
                         tmp_path / "refs.json")
    _same(xr.open_dataset(refs, engine="refgrid"), files, "engine")
    _same(xr.open_dataset(refgrid.open_store(refs, chunks="time:10"), engine="zarr",
                          consolidated=True), files, "regular view")
