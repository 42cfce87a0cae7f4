"""Start-up costs: ``import refgrid``, and a whole process that opens references and reads.

For the ~187,000-chunk NetCDF4 file of ``read.py``, times (best of several fresh processes):
``import refgrid``; a process that opens its parquet references with the engine and reads one
time series, against a process doing the same with ``xr.open_dataset`` on the netCDF file
(the netCDF4 engine), measured in the same run, and the floor both share: importing xarray,
which imports every installed engine's entry point. Targets: ``import refgrid`` <= 0.15 s; the
whole process <= 0.8x the netCDF4 one.

    python benchmarks/startup.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import refgrid
from _common import netcdf4_file

REPEAT = 7
IMPORT_TARGET = 0.15
PROCESS_TARGET = 0.8
SERIES = "ds['v'][:, 37, 58].values"


def process_time(code: str) -> float:
    """Best wall time of ``REPEAT`` fresh interpreters running ``code``."""
    best = float("inf")
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        best = min(best, time.perf_counter() - t0)
    return best


def import_time() -> float:
    """Best time of ``import refgrid`` itself, measured inside fresh interpreters."""
    code = ("import time; t = time.perf_counter(); import refgrid; "
            "print(time.perf_counter() - t)")
    return min(float(subprocess.run([sys.executable, "-c", code], check=True,
                                    capture_output=True, text=True).stdout)
               for _ in range(REPEAT))


def main() -> None:
    path = netcdf4_file("chunks187k.nc", (1870, 100, 100), (1, 10, 10))
    refs = refgrid.write(refgrid.scan(path), Path(tempfile.mkdtemp()) / "refs.parq",
                         format="parquet")
    t_import = import_time()
    empty = process_time("pass")
    floor = process_time("import xarray as xr; xr.backends.list_engines()")
    ours = process_time(f"import xarray as xr; ds = xr.open_dataset({str(refs)!r}, "
                        f"engine='refgrid'); {SERIES}")
    netcdf = process_time(f"import xarray as xr; ds = xr.open_dataset({str(path)!r}); {SERIES}")
    met = [t_import <= IMPORT_TARGET, ours / netcdf <= PROCESS_TARGET]
    print(f"import refgrid: {t_import:.3f} s (target <= {IMPORT_TARGET} s: "
          f"{'met' if met[0] else 'MISSED'})")
    print(f"whole process, open parquet references of 187k chunks + one time series: "
          f"{ours:.3f} s; xr.open_dataset on the netCDF file: {netcdf:.3f} s; ratio "
          f"{ours / netcdf:.2f}x (target <= {PROCESS_TARGET}x: {'met' if met[1] else 'MISSED'})"
          f"; an empty interpreter: {empty:.3f} s; one that imports xarray and lists its "
          f"engines, as both do: {floor:.3f} s ({floor / netcdf:.2f}x)")
    print(f"targets met: {sum(met)} of {len(met)}")


if __name__ == "__main__":
    main()
