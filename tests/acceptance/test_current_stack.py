"""refgrid's default outputs read by the readers users have now: zarr >= 3.2 with its
rectilinear grids (flag on), through fsspec's reference filesystem and from the served native
view; Icechunk 2 repositories of irregular archives; VirtualiZarr's kerchunk parser. Every
value is compared with what xarray reads from the source files.

These readers need Python >= 3.12 (zarr >= 3.2, Icechunk 2): on the oldest supported stack
(Python 3.11, zarr 3.1) the module is skipped with that reason, and ``make test`` runs it on
the newest one.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr
from packaging.version import Version
from zarr.storage import FsspecStore

import refgrid
from helpers import FIXTURES, closed
from servers import start_refgrid_serve
from tests.combining.test_combine import ARCHIVES, _files

if Version(zarr.__version__) < Version("3.2"):
    pytest.skip(f"zarr {zarr.__version__} has no rectilinear grids (zarr >= 3.2 needs Python "
                ">= 3.12); make test runs this module on the newest stack",
                allow_module_level=True)

RAW = {"mask_and_scale": False, "decode_times": False}
PADDED = ("monthly/chunk10", "yearly/chunk73", "yearly/chunk100", "yearly/mixed_units")


@pytest.fixture(autouse=True)
def rectilinear_flag():
    """zarr reads rectilinear grids only with the flag on (what the README tells users)."""
    with zarr.config.set({"array.rectilinear_chunks": True}):
        yield


def _group(archive: str) -> refgrid.VirtualGroup:
    return refgrid.combine([refgrid.scan(f) for f in _files(archive)], "time")


def _expected(archive: str, files: list[Path] | None = None, **kwargs) -> xr.Dataset:
    return closed(xr.open_mfdataset(files or _files(archive), combine="nested", concat_dim="time",
                             data_vars="minimal", compat="equals", **kwargs))


def _assert_equal(ours: xr.Dataset, expected: xr.Dataset) -> None:
    """Raw values and dtypes exactly."""
    assert set(ours.variables) == set(expected.variables)
    for key, want in expected.variables.items():
        assert ours[key].dtype == want.dtype, key
        np.testing.assert_array_equal(ours[key].values, want.values, err_msg=key)


def _assert_decoded(ours: xr.Dataset, expected: xr.Dataset) -> None:
    """CF-decoded values: stock xarray unpacks a Zarr array's packed integers in float64
    (its JSON ``scale_factor`` has no float32 type), netCDF4 in float32 — equal to float32
    precision; everything else exactly."""
    assert set(ours.variables) == set(expected.variables)
    for key, want in expected.variables.items():
        if want.dtype.kind == "f":
            np.testing.assert_allclose(ours[key].values, want.values, rtol=1e-6, err_msg=key)
        else:
            np.testing.assert_array_equal(ours[key].values, want.values, err_msg=key)


# -- the default JSON references through fsspec's reference filesystem ---------------------

@pytest.mark.parametrize("archive", ARCHIVES)
def test_zarr_reads_the_default_references_of_every_archive(archive, tmp_path):
    out = refgrid.write(_group(archive), tmp_path / "refs.json")  # every default
    refs = json.loads(out.read_text())
    documents = [json.loads(v) for k, v in refs["refs"].items() if k.endswith("zarr.json")]
    assert not any("encoded_chunk_shapes" in json.dumps(d) for d in documents)
    store = FsspecStore.from_url("reference://", storage_options={"fo": str(out)},
                                 read_only=True)
    group = zarr.open_group(store, mode="r")
    expected = _expected(archive, **RAW)
    np.testing.assert_array_equal(group["tas"][...], expected["tas"].values)
    if ARCHIVES[archive][2]:  # the same encoding in every file: raw values compare
        _assert_equal(xr.open_zarr(store, consolidated=False, **RAW), expected)
    _assert_decoded(xr.open_zarr(store, consolidated=False), _expected(archive))


@pytest.mark.parametrize("archive", PADDED)
def test_dask_chunks_are_the_irregular_native_chunks(archive, tmp_path):
    group = _group(archive)
    out = refgrid.write(group, tmp_path / "refs.json")
    store = FsspecStore.from_url("reference://", storage_options={"fo": str(out)},
                                 read_only=True)
    ds = xr.open_zarr(store, consolidated=False, chunks={}, **RAW)
    assert ds["tas"].chunks[0] == tuple(group["tas"].grid.lengths(0).tolist())
    assert len(set(ds["tas"].chunks[0])) > 1  # irregular along time
    np.testing.assert_array_equal(ds["tas"].values, _expected(archive, **RAW)["tas"].values)


def test_the_encoded_form_is_what_zarr_cannot_read(tmp_path):
    """The test above can fail: ``padded="encoded"`` is read by refgrid, not by zarr."""
    out = refgrid.write(_group("monthly/chunk10"), tmp_path / "refs.json", padded="encoded")
    store = FsspecStore.from_url("reference://", storage_options={"fo": str(out)},
                                 read_only=True)
    with pytest.raises(Exception, match=r"reshape|size"):
        zarr.open_group(store, mode="r")["tas"][...]
    ours = xr.open_dataset(out, engine="refgrid", **RAW)
    np.testing.assert_array_equal(ours["tas"].values,
                                  _expected("monthly/chunk10", **RAW)["tas"].values)


# -- the served native view -----------------------------------------------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    for archive in ARCHIVES:  # written copy-free: the service crops the padded chunks
        refgrid.write(_group(archive), root / f"{archive.replace('/', '_')}.json",
                      padded="encoded")
    refgrid.write(_group("monthly/chunk10"), root / "defaults.json")
    yield from start_refgrid_serve(root, allow_sources=(str(FIXTURES),), recheck=0.0)


@pytest.mark.parametrize("name", [*(a.replace("/", "_") for a in ARCHIVES), "defaults"])
def test_zarr_reads_the_served_native_view(served, name):
    archive = "monthly/chunk10" if name == "defaults" else name.replace("_", "/", 1)
    url = f"{served.url}/{name}/native"
    store = FsspecStore.from_url(url, read_only=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # consolidated metadata is served: no fallback
        ours = xr.open_zarr(store, **RAW)
    tas = zarr.open_group(store, mode="r")["tas"]
    assert "encoded_chunk_shapes" not in json.dumps(tas.metadata.to_dict())
    if ARCHIVES[archive][2]:
        _assert_equal(ours, _expected(archive, **RAW))
    else:
        np.testing.assert_array_equal(ours["tas"].values, _expected(archive, **RAW)["tas"].values)
    _assert_decoded(xr.open_zarr(store), _expected(archive))


# -- Icechunk 2 -----------------------------------------------------------------------------

def _repository(path: Path, sources: Path):
    icechunk = pytest.importorskip("icechunk")
    from refgrid.writers.icechunk import local_access

    prefix = f"file://{sources}/"
    config = icechunk.RepositoryConfig.default()
    config.set_virtual_chunk_container(icechunk.VirtualChunkContainer(
        prefix, icechunk.local_filesystem_store(str(sources))))
    return icechunk.Repository.create(icechunk.local_filesystem_storage(str(path)), config,
                                      {prefix: local_access(icechunk)})


@pytest.mark.parametrize("archive", PADDED)
def test_an_irregular_archive_round_trips_through_icechunk(archive, tmp_path):
    sources = tmp_path / "sources"
    shutil.copytree(FIXTURES / archive, sources)
    files = sorted(sources.glob("*.nc"))
    repo = _repository(tmp_path / "repo", sources)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        first = refgrid.write(refgrid.combine([refgrid.scan(f) for f in files[:-1]], "time"),
                              repo, message="all but the last file")
        second = refgrid.write(refgrid.combine([refgrid.scan(f) for f in files], "time"), repo,
                               message="all files")
    assert [c.message for c in repo.ancestry(branch="main")][:2] == [
        "all files", "all but the last file"]
    latest = xr.open_zarr(repo.readonly_session("main").store, consolidated=False, **RAW)
    expected = _expected(archive, files, **RAW)
    if ARCHIVES[archive][2]:
        _assert_equal(latest, expected)
    np.testing.assert_array_equal(latest["tas"].values, expected["tas"].values)
    old = xr.open_zarr(repo.readonly_session(snapshot_id=first).store, consolidated=False,
                       **RAW)
    earlier = _expected(archive, files[:-1], **RAW)
    assert old.sizes["time"] == earlier.sizes["time"] < latest.sizes["time"]
    np.testing.assert_array_equal(old["tas"].values, earlier["tas"].values)
    assert second != first
    tas = zarr.open_group(repo.readonly_session("main").store, mode="r")["tas"]
    grid = tas.metadata.to_dict()["chunk_grid"]
    assert grid["name"] == "rectilinear" and "encoded_chunk_shapes" not in json.dumps(grid)


def test_icechunk_stores_only_the_padded_chunks(tmp_path):
    """Every chunk that can stay virtual does: only padded interior chunks are copied."""
    group = _group("monthly/chunk10")
    repo = _repository(tmp_path / "repo", FIXTURES / "monthly" / "chunk10")
    refgrid.write(group, repo)
    session = repo.readonly_session("main")
    from refgrid.read.cropped import padded_mask

    mask = padded_mask(group["tas"].grid)
    kinds = {coords: str(session.chunk_type("/tas", list(coords))).lower()
             for coords in np.ndindex(*mask.shape)}
    copied = {c for c, kind in kinds.items() if "virtual" not in kind}  # native or inline
    assert copied == {tuple(map(int, c)) for c in zip(*np.nonzero(mask), strict=True)}
    assert copied and len(copied) < len(kinds)


def test_batch_appends_an_irregular_archive_to_icechunk(tmp_path):
    import subprocess
    import sys

    sources = tmp_path / "sources"
    shutil.copytree(FIXTURES / "monthly" / "chunk10", sources)
    files = sorted(sources.glob("*.nc"))
    out = tmp_path / "tas.icechunk"
    cli = [sys.executable, "-W", "error::DeprecationWarning", "-m", "refgrid.cli", "batch",
           "-q", "--workers", "1", "--icechunk", "-o", str(out)]
    for chosen, message in ((files[:2], "two"), (files, "all")):
        done = subprocess.run([*cli, "-m", message, *map(str, chosen)], capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stderr
    import icechunk

    from refgrid.writers.icechunk import local_repository

    repo = local_repository(out)  # reopened: its own containers authorized
    snapshots = [c.id for c in repo.ancestry(branch="main")]
    latest = xr.open_zarr(repo.readonly_session(snapshot_id=snapshots[0]).store,
                          consolidated=False, **RAW)
    np.testing.assert_array_equal(latest["tas"].values,
                                  _expected("", files, **RAW)["tas"].values)
    old = xr.open_zarr(repo.readonly_session(snapshot_id=snapshots[1]).store,
                       consolidated=False, **RAW)
    np.testing.assert_array_equal(old["tas"].values,
                                  _expected("", files[:2], **RAW)["tas"].values)
    assert isinstance(repo, icechunk.Repository)


# -- VirtualiZarr ---------------------------------------------------------------------------

@pytest.mark.parametrize("relative", ["monthly/chunk10/tas_200101.nc",
                                      "yearly/chunk73/tas_2001.nc",
                                      "netcdf3/classic/tas_200101.nc"])
def test_virtualizarr_opens_the_references_of_a_single_file(relative, tmp_path):
    pytest.importorskip("virtualizarr")
    from obspec_utils.registry import ObjectStoreRegistry
    from obstore.store import LocalStore
    from virtualizarr.parsers import KerchunkJSONParser

    source = FIXTURES / relative
    if not source.exists():
        source = next((FIXTURES / relative).parent.glob("*.nc"))
    out = refgrid.write(refgrid.scan(source), tmp_path / "refs.json")
    assert "templates" not in json.loads(out.read_text())  # plain URLs: one file
    registry = ObjectStoreRegistry({"file://": LocalStore()})
    store = KerchunkJSONParser()(url=f"file://{out}", registry=registry)
    ours = xr.open_zarr(store, consolidated=False, zarr_format=3, **RAW)
    truth = closed(xr.open_dataset(source, engine="netcdf4", **RAW))
    for key in ours.variables:
        np.testing.assert_array_equal(ours[key].values, truth[key].values, err_msg=key)
