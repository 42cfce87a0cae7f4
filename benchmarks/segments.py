"""Per-file packing as one exact array, without copying: an IMOS-like archive.

IMOS's L3S SST collection changes ``add_offset`` every day. Here: 1,000 daily files of int16
``sst`` packed with a float32 ``scale_factor`` and an ``add_offset`` that drifts per file
(zlib, one chunk per file), and a uniform archive of the same shape (one ``add_offset``).
In the same run:

- scan + combine per file, packed vs uniform (target: within 1.2x);
- a time series at one point (every file, one chunk each) through the engine and through
  ``open_store`` read by xarray's zarr engine, packed vs uniform (target: within 1.2x) —
  and with ``unpack=True``, where the uniform archive too reaches a stock reader decoded
  (float32, as xarray reads the files; without it, the uniform archive's chunks go out
  packed and xarray unpacks them in float64, the 1,000 points it keeps only);
- no byte copied: no chunk of ``sst`` is inlined, and the references are the same size;
- peers: kerchunk's ``MultiZarrToZarr`` (its values against ``open_mfdataset``'s: wrong
  values counted, largest error), VirtualiZarr's ``open_virtual_mfdataset`` (refused or
  not), and ``open_mfdataset``'s own time for the time series.

    python benchmarks/segments.py [FILES]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import netCDF4
import numpy as np
import xarray as xr

import refgrid
from _common import DATA
from refgrid.model.manifest import INLINE

FILES = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
LAT, LON = 90, 180
TARGET = 1.2
REPEAT = 9


def archive(kind: str) -> list[Path]:
    """``FILES`` daily files of packed ``sst`` (``kind``: "drift" or "uniform"), made once."""
    root = DATA / f"segments_{kind}_{FILES}"
    paths = [root / f"sst_{k:05d}.nc" for k in range(FILES)]
    if (root / "done").exists():
        return paths
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for k, path in enumerate(paths):
        offset = np.float32(290.0 + (0.37 * k % 7.0 if kind == "drift" else 0.0))
        values = offset + rng.normal(0, 5, (1, LAT, LON)).astype("f4")
        with netCDF4.Dataset(path, "w") as ds:
            ds.createDimension("time", None)
            ds.createDimension("lat", LAT)
            ds.createDimension("lon", LON)
            t = ds.createVariable("time", "f8", ("time",))
            t.units = "days since 2000-01-01"
            t[:] = [k]
            ds.createVariable("lat", "f4", ("lat",))[:] = np.linspace(-89, 89, LAT)
            ds.createVariable("lon", "f4", ("lon",))[:] = np.linspace(0, 358, LON)
            v = ds.createVariable("sst", "i2", ("time", "lat", "lon"), fill_value=-32768,
                                  zlib=True, complevel=1, chunksizes=(1, LAT, LON))
            v.scale_factor, v.add_offset = np.float32(0.01), offset
            v.units = "kelvin"
            v[:] = values
    (root / "done").touch()
    return paths


def timed(fn, repeat: int = REPEAT) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def series_engine(refs: Path) -> np.ndarray:
    with xr.open_dataset(refs, engine="refgrid") as ds:
        return ds.sst[:, LAT // 2, LON // 2].values


def series_store(refs: Path, unpack: bool = False) -> np.ndarray:
    with xr.open_dataset(refgrid.open_store(refs, chunks="auto", unpack=unpack), engine="zarr",
                         consolidated=True) as ds:
        return ds.sst[:, LAT // 2, LON // 2].values


def series_unpacked(refs: Path) -> np.ndarray:
    return series_store(refs, unpack=True)


def kerchunk_values(paths: list[Path]) -> np.ndarray | str:
    try:
        import fsspec
        from kerchunk.combine import MultiZarrToZarr
        from kerchunk.hdf import SingleHdf5ToZarr
    except ImportError as e:
        return f"not installed ({e})"
    singles = []
    for p in paths:
        with fsspec.open(str(p)) as f:
            singles.append(SingleHdf5ToZarr(f, str(p)).translate())
    refs = MultiZarrToZarr(singles, concat_dims=["time"],
                           identical_dims=["lat", "lon"]).translate()
    mapper = fsspec.get_mapper("reference://", fo=refs)
    with xr.open_dataset(mapper, engine="zarr", consolidated=False, zarr_format=2) as ds:
        return ds.sst[:, LAT // 2, LON // 2].values


def virtualizarr_outcome(paths: list[Path], expected: np.ndarray) -> str:
    try:
        from obstore.store import LocalStore
        from virtualizarr import open_virtual_mfdataset
        from virtualizarr.parsers import HDFParser
    except ImportError as e:
        return f"not installed ({e})"
    try:
        from obspec_utils.registry import ObjectStoreRegistry
    except ImportError:
        from virtualizarr.registry import ObjectStoreRegistry  # older releases
    registry = ObjectStoreRegistry({"file://": LocalStore()})
    try:
        ds = open_virtual_mfdataset([f"file://{p}" for p in paths], registry=registry,
                                    parser=HDFParser(), concat_dim="time", combine="nested",
                                    data_vars="minimal", coords="minimal", compat="override")
        refs = ds.vz.to_kerchunk(format="dict")
    except Exception as e:  # what it says is the outcome
        return f"refused: {type(e).__name__}: {str(e)[:120]}"
    import fsspec

    with xr.open_dataset(fsspec.get_mapper("reference://", fo=refs), engine="zarr",
                         consolidated=False, zarr_format=2) as opened:
        theirs = opened.sst[:, LAT // 2, LON // 2].values
    wrong = theirs != expected[:len(theirs)]
    return (f"accepted {len(paths)} files; {int(wrong.sum())} of {wrong.size} values wrong, "
            f"largest error {np.nanmax(np.abs(theirs - expected[:len(theirs)])):.2f} K")


def main() -> None:
    drift, uniform = archive("drift"), archive("uniform")
    print(f"{FILES} daily files of int16 sst ({LAT}x{LON}, zlib), packing per file vs one")
    with tempfile.TemporaryDirectory() as tmp:
        out = {}
        for kind, paths in (("drift", drift), ("uniform", uniform)):
            seconds, group = timed(lambda p=paths: refgrid.combine([str(f) for f in p]), 3)
            refs = refgrid.write(group, Path(tmp) / f"{kind}.json")
            inline = int((np.asarray(group["sst"].manifest.path_id) == INLINE).sum())
            out[kind] = (seconds, refs, group, inline)
        d, u = out["drift"], out["uniform"]
        print(f"scan + combine per file: packed {d[0] / FILES * 1e3:.2f} ms, uniform "
              f"{u[0] / FILES * 1e3:.2f} ms; ratio {d[0] / u[0]:.2f} (target <= {TARGET})")
        segments = d[2]["sst"].segments
        print(f"segments: {len(segments) if segments else 0}; sst chunks inlined: packed "
              f"{d[3]}, uniform {u[3]}; references {d[1].stat().st_size / 1e3:.0f} kB vs "
              f"{u[1].stat().st_size / 1e3:.0f} kB")
        expected = None
        for name, read in (("engine", series_engine), ("open_store", series_store),
                           ("open_store(unpack=True)", series_unpacked)):
            pairs, got = [], None
            for _ in range(REPEAT):  # alternated: the ratio of each pair, its median
                one, got = timed(lambda r=d[1], f=read: f(r), 1)
                other, _ = timed(lambda r=u[1], f=read: f(r), 1)
                pairs.append((one, other))
            td, tu = (statistics.median(p[i] for p in pairs) for i in (0, 1))
            ratio = statistics.median(a / b for a, b in pairs)
            if expected is None:
                with xr.open_mfdataset(drift, combine="nested", concat_dim="time") as ds:
                    start = time.perf_counter()
                    expected = ds.sst[:, LAT // 2, LON // 2].values
                    t_mf = time.perf_counter() - start
            exact = np.array_equal(got, expected, equal_nan=True) and got.dtype == \
                expected.dtype
            print(f"time series through {name}: packed {td * 1e3:.1f} ms, uniform "
                  f"{tu * 1e3:.1f} ms; paired ratio {ratio:.2f} (target <= {TARGET}); "
                  f"exact against open_mfdataset: {exact}")
        print(f"open_mfdataset's own time series read: {t_mf * 1e3:.0f} ms")
        theirs = kerchunk_values(drift)
        if isinstance(theirs, str):
            print(f"kerchunk: {theirs}")
        else:
            wrong = ~np.isclose(theirs, expected, rtol=0, atol=0, equal_nan=True)
            print(f"kerchunk MultiZarrToZarr: {int(wrong.sum())} of {wrong.size} values wrong, "
                  f"largest error {np.nanmax(np.abs(theirs - expected)):.2f} K")
        print(f"VirtualiZarr open_virtual_mfdataset: "
              f"{virtualizarr_outcome(drift[:50], expected)}")


if __name__ == "__main__":
    main()
