"""Opening a served store with refgrid's engine: ``xr.open_dataset(URL, engine="refgrid")`` on
``refgrid serve``'s native view, against zarr's own ``xr.open_zarr`` of the same URL.

An archive as a new user built it — 24 monthly files of 2001-2002 (28-31 days), ``tas``,
``hurs``, ``psl`` float32 and ``pr`` packed int16 in HDF5 chunks (10, 45, 90), ``time_bnds``,
``orog`` — is combined, written as references and served by ``refgrid serve`` (a process of
its own). Each reader opens the URL and then reads every variable; the server's access log
counts the requests. Before, the engine listed every chunk directory and asked every chunk's
size (4.2 s and thousands of requests to open, where zarr took 0.04 s).

Targets: the engine's open in <= 20 requests (no request per chunk) and <= 3x zarr's open
time (best of three warm opens each); reading every variable <= 2x zarr's time.

    python benchmarks/open_served.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr

import refgrid
from _common import DATA
from serve import free_port, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
OPEN_REQUESTS, OPEN_RATIO, READ_RATIO = 20, 3.0, 2.0
VARIABLES = ("tas", "hurs", "psl", "pr")


def archive() -> list[Path]:
    """The 24 monthly files, written once."""
    import netCDF4

    from realistic import months

    root = DATA / "served_archive"
    specs = months(2001, 12, "days since {start}") + months(2002, 12, "hours since {start}")
    paths = [root / f"clim_{m.start[:7].replace('-', '')}.nc" for m in specs]
    if all(p.exists() for p in paths):
        return paths
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    for spec, path in zip(specs, paths, strict=True):
        days = np.arange(spec.days)
        with netCDF4.Dataset(path, "w") as ds:
            for dim, n in (("time", None), ("nv", 2), ("lat", 45), ("lon", 90)):
                ds.createDimension(dim, n)
            factor = 1.0 if spec.units.startswith("days") else 24.0
            time_ = ds.createVariable("time", "f8", ("time",))
            time_.setncatts({"units": spec.units, "calendar": "standard",
                             "bounds": "time_bnds"})
            time_[:] = (days + 0.5) * factor
            ds.createVariable("time_bnds", "f8", ("time", "nv"))[:] = np.stack(
                [days * factor, (days + 1) * factor], axis=1)
            ds.createVariable("lat", "f4", ("lat",))[:] = np.linspace(-88, 88, 45)
            ds.createVariable("lon", "f4", ("lon",))[:] = np.linspace(0, 356, 90)
            ds.createVariable("orog", "f4", ("lat", "lon"))[:] = np.linspace(
                0, 3000, 45 * 90, dtype="f4").reshape(45, 90)
            for name in ("tas", "hurs", "psl"):
                v = ds.createVariable(name, "f4", ("time", "lat", "lon"), zlib=True,
                                      shuffle=True, chunksizes=(10, 45, 90))
                v[:] = rng.random((spec.days, 45, 90), dtype="f4") * 100
            pr = ds.createVariable("pr", "i2", ("time", "lat", "lon"), zlib=True,
                                   shuffle=True, chunksizes=(10, 45, 90))
            pr.set_auto_maskandscale(False)
            pr.setncatts({"scale_factor": np.float32(0.001), "add_offset": np.float32(0)})
            pr[:] = rng.integers(0, 20000, (spec.days, 45, 90), dtype="i2")
    return paths


def requests_during(log: Path, fn: Any) -> tuple[float, Any, list[str]]:
    """Time ``fn()`` and the requests the server logged meanwhile."""
    before = len(log.read_text().splitlines())
    started = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - started
    time.sleep(0.2)  # the access log lines of the last answers
    lines = log.read_text().splitlines()[before:]
    return seconds, result, [json.loads(line)["path"] for line in lines if line.startswith("{")]


def main() -> None:
    files = archive()
    work = Path(tempfile.mkdtemp(prefix="refgrid-open-served-"))
    refgrid.write(refgrid.combine([str(f) for f in files], "time"), work / "refs" / "year.json")
    port = free_port()
    log = work / "access.log"
    with open(log, "w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "refgrid.cli", "serve", str(work / "refs"), "--port",
             str(port), "--allow-source", str(files[0].parent)], stderr=sink)
    url = f"http://127.0.0.1:{port}/year/native"
    try:
        wait_for(f"{url}/zarr.json", process)
        results: dict[str, dict[str, Any]] = {}
        with zarr.config.set({"array.rectilinear_chunks": True}):
            for name, opener in (
                    ("refgrid engine", lambda: xr.open_dataset(url, engine="refgrid")),
                    ("zarr (xr.open_zarr)", lambda: xr.open_zarr(url, chunks=None))):
                opener()  # warm: imports, connections
                seconds, ds, paths = min((requests_during(log, opener) for _ in range(3)),
                                         key=lambda r: r[0])
                read, values, read_paths = requests_during(
                    log, lambda ds=ds: {v: ds[v].values for v in VARIABLES})
                results[name] = {"open": seconds, "open_requests": len(paths), "read": read,
                                 "read_requests": len(read_paths), "values": values}
    finally:
        process.terminate()
        process.wait(30)
    ours, theirs = results["refgrid engine"], results["zarr (xr.open_zarr)"]
    for v in VARIABLES:
        np.testing.assert_allclose(ours["values"][v], theirs["values"][v], rtol=1e-6)
    print(f"a served native view of {len(files)} monthly files ({', '.join(VARIABLES)}, "
          "chunks 10 x 45 x 90), loopback")
    print(f"{'reader':22s} {'open s':>8s} {'requests':>9s} {'read s':>8s} {'requests':>9s}")
    for name, r in results.items():
        print(f"{name:22s} {r['open']:8.3f} {r['open_requests']:9d} {r['read']:8.3f} "
              f"{r['read_requests']:9d}")
    open_ratio, read_ratio = ours["open"] / theirs["open"], ours["read"] / theirs["read"]
    print(f"engine / zarr: open {open_ratio:.2f}x (target <= {OPEN_RATIO}x), "
          f"{ours['open_requests']} requests (target <= {OPEN_REQUESTS}); read "
          f"{read_ratio:.2f}x (target <= {READ_RATIO}x)")
    print(json.dumps({"open_ratio": round(open_ratio, 3), "read_ratio": round(read_ratio, 3),
                      "open_requests": ours["open_requests"]}))


if __name__ == "__main__":
    main()
