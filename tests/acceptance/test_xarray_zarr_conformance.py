"""xarray's own Zarr backend tests, with ``refgrid.open_store`` as the read side (Zarr v3).

As ``test_xarray_conformance.py`` does for netCDF: the classes are xarray's
(``xarray.tests.test_backends`` in the installed wheel). Writing stays xarray's and zarr's,
into a Zarr v3 directory; every *read* of that directory goes through ``refgrid.open_store``:
``open`` (which ``roundtrip`` uses) explicitly, and the reads test bodies make themselves
(``xr.open_zarr(path)``, ``xr.open_dataset(path, engine="zarr")``) by handing xarray refgrid's
store for each read-only open of a local v3 directory — or of a path where there is nothing,
so that a missing store is refgrid's error (``test_non_existent_store``). Writes (``w``,
``a``, ``r+``) and the tests' own ``zarr.open_group`` inspections stay zarr's.

Tests that only write (append/region argument errors, ``test_write_store``, ...) run as they
are: they never read, so they cannot fail because of refgrid and need no skip. What refgrid
serves differently on purpose is listed in ``DIFFERENT`` as strict xfails, so that a change
making them pass is noticed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import xarray as xr
import zarr

import refgrid
from refgrid.read.store import RefgridStore

backends = pytest.importorskip("xarray.tests.test_backends")
xzarr = pytest.importorskip("xarray.backends.zarr")

from xarray.tests.conftest import *  # noqa: E402, F403  (use_dask, ...)

# xarray's classes write with zarr, which warns of what Zarr v3 does not specify (consolidated
# metadata, fixed-width bytes): the writes are xarray's and zarr's, as in xarray's own suite,
# which keeps those warnings from failing its tests. A warning refgrid raises still fails.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Consolidated metadata is currently not part in the Zarr format 3 specification",
    "ignore:The data type .* does not have a Zarr V3 specification",
)

SHARDS = ("a sharded array is served as its inner chunks (the references point at them: no "
          "sharding_indexed codec), so encoding['shards'] reads as None; README, 'Zarr stores "
          "as input'")
DIFFERENT: dict[str, str] = {
    "test_shard_encoding": SHARDS,
    "test_read_rectilinear_shards": SHARDS,
    "test_write_regular_shards_still_works": SHARDS,
    "test_read_non_consolidated_warning": (
        "refgrid always serves consolidated metadata (a store opens in one request), so "
        "consolidated=None never falls back with xarray's RuntimeWarning"),
}


@pytest.fixture(params=[3])
def default_zarr_format(request: pytest.FixtureRequest) -> Iterator[None]:
    """xarray's fixture cut to format 3: refgrid reads Zarr v3 stores only."""
    with zarr.config.set(default_zarr_format=request.param):
        yield


@pytest.fixture(autouse=True)
def _skip_if_param(request: pytest.FixtureRequest) -> None:
    """xarray's ``skip_if_param`` marks, which its repository's conftest (not in the wheel)
    acts on."""
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    for mark in request.node.iter_markers("skip_if_param"):
        kwargs = dict(mark.kwargs)
        reason, condition = kwargs.pop("reason", ""), kwargs.pop("condition", True)
        if condition and all(params.get(k, object()) == v for k, v in kwargs.items()):
            pytest.skip(reason)


@pytest.fixture
def tmp_store(tmp_path: Any) -> Any:
    """xarray's fixture (a directory, a zip or a dict store) cut to the directory."""
    return tmp_path


def _read_by_refgrid(store: object) -> bool:
    """A local v3 directory, or a path where there is nothing (refgrid says so, as zarr
    would: ``test_non_existent_store``)."""
    return isinstance(store, str | os.PathLike) and (
        os.path.isfile(os.path.join(os.fspath(store), "zarr.json"))
        or not os.path.lexists(store))


@pytest.fixture(autouse=True)
def _reads_through_refgrid(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every read-only open xarray makes of a local v3 directory gets refgrid's store
    (closed after the test: xarray does not close a store it was handed)."""
    original: Callable[..., Any] = xzarr._get_open_params
    opened: list[Any] = []

    def redirected(store: Any, mode: str, *args: Any, **kwargs: Any) -> Any:
        if mode == "r" and _read_by_refgrid(store):
            store = refgrid.open_store(os.fspath(store))
            opened.append(store)
        return original(store, mode, *args, **kwargs)

    monkeypatch.setattr(xzarr, "_get_open_params", redirected)
    yield opened
    for store in opened:
        store.close()


class RefgridReadSide:
    version_kwargs: dict[str, Any]

    @contextlib.contextmanager
    def open(self, path: Any, **kwargs: Any) -> Iterator[xr.Dataset]:
        store = refgrid.open_store(os.fspath(path))
        try:
            with xr.open_dataset(store, engine="zarr", mode="r", **kwargs,
                                 **self.version_kwargs) as ds:
                yield ds
        finally:
            store.close()

    def test_load_async(self) -> None:
        """Marked for pytest-asyncio in xarray; run here on an event loop of its own."""
        asyncio.run(backends.ZarrBase.test_load_async(self))


def _with_differences(cls: type) -> type:
    for name, reason in DIFFERENT.items():
        test = getattr(cls, name, None)
        if test is not None:
            setattr(cls, name, pytest.mark.xfail(reason=reason, strict=True)(test))
    return cls


@_with_differences
class TestZarrDirectoryStore(RefgridReadSide, backends.TestZarrDirectoryStore):
    pass


@_with_differences
class TestZarrWriteEmpty(RefgridReadSide, backends.TestZarrWriteEmpty):
    """The tests this class adds (xarray runs all of ZarrBase again under it; once is
    enough here)."""


for _name in dir(backends.ZarrBase):
    if _name.startswith("test_") and _name not in vars(backends.TestZarrWriteEmpty):
        setattr(TestZarrWriteEmpty, _name, None)


@_with_differences
class TestZarrRectilinearChunksRead(backends.TestZarrRectilinearChunksRead):
    """Rectilinear v3 stores zarr wrote, read back through refgrid."""


class TestZarrRegionAuto(backends.TestZarrRegionAuto):
    """Region writes and appends (xarray's); every read between them is refgrid's."""


test_zarr_entrypoint = backends.test_zarr_entrypoint
test_zarr_create_default_indexes = backends.test_zarr_create_default_indexes
test_open_dataset_chunking_zarr = backends.test_open_dataset_chunking_zarr
test_raises_key_error_on_invalid_zarr_store = backends.test_raises_key_error_on_invalid_zarr_store


def test_every_read_went_through_refgrid(tmp_path: Any,
                                         _reads_through_refgrid: list[Any]) -> None:
    """The redirect this module rests on: a plain ``xr.open_zarr`` of a v3 directory is
    answered by a refgrid store."""
    xr.Dataset({"v": ("x", [1, 2, 3])}).to_zarr(tmp_path / "d.zarr", zarr_format=3)
    with xr.open_zarr(tmp_path / "d.zarr") as ds:
        assert ds["v"].values.tolist() == [1, 2, 3]
    assert len(_reads_through_refgrid) == 1  # (the star import shadows ``type``)
    assert isinstance(_reads_through_refgrid[0], RefgridStore)
