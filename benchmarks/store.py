"""refgrid's zarr store read by stock zarr (>= 3.4) through xarray, against the peers a zarr
user has.

A NetCDF4 file of tas(7300, 40, 40) in 23,360 zlib chunks of (5, 10, 10), each reader being
``xr.open_dataset(store, engine="zarr", cache=False)`` opened once. Locally, for the full
array, a time series at one point and one map, each as a ratio to h5py in the same run: zarr
on a plain local Zarr store of the same data (zarr's default codecs), fsspec's
``reference://`` filesystem on refgrid's references wrapped in ``FsspecStore`` (the usual
way), ``refgrid.open_store`` with zarr's default configuration, and with
``refgrid.zarr_config()``. Over S3 (moto) behind a proxy holding each request 20 ms: a time
series and a map through fsspec's reference filesystem and through the store, each from a
fresh open, with the requests counted. moto, in this process, reads the whole object for
each ranged GET (tens of ms for this 43 MB file, under the GIL): a request costs that on top
of the 20 ms, and fsspec's requests, however concurrent, are served one at a time — the
floor printed is one bare ranged GET.

Targets: the store with zarr's defaults <= 1.2x the plain local Zarr store; with
``refgrid.zarr_config()``, full read and time series <= 3x h5py; over 20 ms per request,
>= 5x faster than fsspec + zarr for the time series and the map, with requests <= 2 per run
of neighbouring chunks + 1 per file.

    python benchmarks/store.py
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import xarray as xr
import zarr

import refgrid
from _common import DATA, best_of, netcdf4_file
from read_remote import BUCKET, LATENCY, Counter, fewest_requests, measure, slow_bucket
from refgrid.read.fetch import REMOTE_GAP

SHAPE, CHUNKS = (7300, 40, 40), (5, 10, 10)
SELECTIONS = {"full": (slice(None),) * 3, "series": (slice(None), 17, 23),
              "map": (100, slice(None), slice(None))}
REPEAT = 3


def h5py_read(path: Path, selection: tuple[Any, ...]) -> tuple[float, np.ndarray]:
    def read() -> np.ndarray:
        with h5py.File(path) as f:
            return f["v"][selection]
    return best_of(read)


def plain_copy(path: Path) -> Path:
    """The same data in a plain local Zarr v3 store, same chunks, zarr's default codecs."""
    copy = DATA / "store_plain_v.zarr"
    if not copy.exists():
        partial = DATA / "store_plain_v.partial"
        shutil.rmtree(partial, ignore_errors=True)
        with xr.open_dataset(path) as ds:
            ds.to_zarr(partial, zarr_format=3, consolidated=True,
                       encoding={"v": {"chunks": CHUNKS}})
        partial.rename(copy)
    return copy


def opened(store: Any) -> xr.DataArray:
    """``v`` as xarray reads it from a zarr store (uncached: every read goes to zarr)."""
    return xr.open_dataset(store, engine="zarr", cache=False)["v"]


def reference_store(refs: Path, **options: Any) -> Any:
    """fsspec's reference filesystem on refgrid's references, wrapped in FsspecStore."""
    from zarr.storage import FsspecStore

    storage = {"fo": str(refs), **({"remote_protocol": "s3", "remote_options": options}
                                   if options else {})}
    return FsspecStore.from_url("reference://", storage_options=storage, read_only=True)


def local(path: Path, refs: Path, verdicts: list[bool]) -> None:
    plain = opened(plain_copy(path))
    referenced = opened(reference_store(refs))
    store = refgrid.open_store(refs)  # each opened once: reads are timed
    stored = opened(store)
    with zarr.config.set(refgrid.zarr_config()):
        configured = opened(refgrid.open_store(refs))  # the pipeline is the array's
    readers: dict[str, Callable[[tuple[Any, ...]], np.ndarray]] = {
        "plain zarr": lambda s: plain[s].values, "fsspec refs": lambda s: referenced[s].values,
        "store": lambda s: stored[s].values}
    print(f"local: {SHAPE} float32 in {CHUNKS} zlib chunks ({np.prod(SHAPE) // np.prod(CHUNKS):,}"
          " chunks); time / h5py time, best of 3")
    print(f"{'selection':9s} {'h5py':>8s} " + " ".join(f"{n:>12s}" for n in readers)
          + f" {'store+config':>13s}  targets")
    for label, sel in SELECTIONS.items():
        t_h5, expected = h5py_read(path, sel)
        ratios = {}
        for name, reader in readers.items():
            t, got = best_of(lambda r=reader, s=sel: r(s))
            assert np.array_equal(got, expected), (label, name)
            ratios[name] = t / t_h5
        with zarr.config.set(refgrid.zarr_config()):
            t, got = best_of(lambda s=sel: configured[s].values)
        assert np.array_equal(got, expected), (label, "store+config")
        ratios["store+config"] = t / t_h5
        met = [ratios["store"] <= 1.2 * ratios["plain zarr"]]
        notes = [f"store/plain {ratios['store'] / ratios['plain zarr']:.2f} (<= 1.2: "
                 f"{'met' if met[0] else 'MISSED'})"]
        if label in ("full", "series"):
            met.append(ratios["store+config"] <= 3)
            notes.append(f"config {ratios['store+config']:.1f}x (<= 3x: "
                         f"{'met' if met[1] else 'MISSED'})")
        verdicts += met
        print(f"{label:9s} {t_h5:7.3f}s " + " ".join(f"{ratios[n]:11.1f}x" for n in readers)
              + f" {ratios['store+config']:12.1f}x  " + "; ".join(notes))


def remote(path: Path, verdicts: list[bool]) -> None:
    counter = Counter()
    with slow_bucket([path], counter) as options:
        url = f"s3://{BUCKET}/{path.name}"
        group = refgrid.scan(url, **options)
        refs = refgrid.write(group, Path(tempfile.mkdtemp()) / "refs.json")
        with h5py.File(path) as f:
            truth = f["v"][...]

        print(f"S3 (moto) behind a {LATENCY * 1000:.0f} ms proxy, one fresh open per read "
              f"(best of {REPEAT} for the map)")
        for label in ("series", "map"):
            sel, repeat = SELECTIONS[label], REPEAT if label == "map" else 1
            t_ref, n_ref, got = measure(counter, lambda s=sel: opened(
                reference_store(refs, **{**options, "asynchronous": True}))[s].values, repeat)
            assert np.array_equal(got, truth[sel])
            with zarr.config.set(refgrid.zarr_config()):
                t_st, n_st, got = measure(counter, lambda s=sel: opened(
                    refgrid.open_store(refs, **options))[s].values, repeat)
            assert np.array_equal(got, truth[sel])
            runs = fewest_requests(group, sel, REMOTE_GAP)
            met = [t_ref / t_st >= 5, n_st <= 2 * runs + 1]
            verdicts += met
            print(f"{label:9s} fsspec refs + zarr {t_ref:6.2f}s {n_ref:5d} requests; store "
                  f"{t_st:6.2f}s {n_st:4d} requests: {t_ref / t_st:.1f}x faster (>= 5x: "
                  f"{'met' if met[0] else 'MISSED'}), runs of neighbouring chunks {runs} "
                  f"(requests <= {2 * runs + 1}: {'met' if met[1] else 'MISSED'})")
        print(f"floor: one bare ranged GET of the map's bytes takes {_bare_get(group, options):.3f}"
              " s (moto's own cost included)")


def _bare_get(group: refgrid.VirtualGroup, options: dict[str, Any]) -> float:
    """Best time of one s3fs request for the bytes of the map's chunks."""
    import s3fs

    array = group["v"]
    assert isinstance(array, refgrid.VirtualArray)
    index = int(np.searchsorted(array.grid.axes[0].bounds, SELECTIONS["map"][0], "right")) - 1
    start = int(array.manifest.offset[index].min())
    end = int((array.manifest.offset[index] + array.manifest.length[index]).max())
    fs = s3fs.S3FileSystem(**options)
    url = array.manifest.paths[0]
    return best_of(lambda: fs.cat_file(url, start=start, end=end))[0]


def main() -> None:
    warnings.simplefilter("ignore")
    path = netcdf4_file("store_chunks23k.nc", SHAPE, CHUNKS)
    refs = refgrid.write(refgrid.scan(path), Path(tempfile.mkdtemp()) / "refs.json")
    verdicts: list[bool] = []
    local(path, refs, verdicts)
    remote(path, verdicts)
    print(f"targets met: {sum(verdicts)} of {len(verdicts)}")


if __name__ == "__main__":
    main()
