"""NetCDF3 scan cost: a classic file with 20 record variables x 4000 records (80,000 record
chunks), refgrid's header scan against kerchunk's NetCDF3ToZarr measured in the same run.
Target: at least 10x faster than kerchunk.

    python benchmarks/scan_netcdf3.py
"""

from __future__ import annotations

import netCDF4
import numpy as np

import refgrid
from _common import DATA, best_of


def build() -> str:
    path = DATA / "records_20x4000.nc"
    if not path.exists():
        DATA.mkdir(parents=True, exist_ok=True)
        with netCDF4.Dataset(path.with_suffix(".partial"), "w", format="NETCDF3_CLASSIC") as ds:
            ds.createDimension("time", None)
            ds.createDimension("x", 16)
            for k in range(20):
                ds.createVariable(f"v{k:02d}", "f4", ("time", "x"))[:] = \
                    np.random.default_rng(k).random((4000, 16), dtype="f4")
        path.with_suffix(".partial").rename(path)
    return str(path)


def main() -> None:
    path = build()
    try:
        from kerchunk.netCDF3 import NetCDF3ToZarr
    except ImportError:
        raise SystemExit("kerchunk's NetCDF3ToZarr needs scipy: pip install '.[bench]'") from None
    t_ours, group = best_of(lambda: refgrid.scan(path))
    t_kc, _ = best_of(lambda: NetCDF3ToZarr(path, inline_threshold=0).translate(), repeat=1)
    chunks = sum(a.grid.nchunks for _, a in group.walk())
    print(f"20 record variables x 4000 records ({chunks:,} chunks): refgrid {t_ours * 1e3:.0f} ms,"
          f" kerchunk NetCDF3ToZarr {t_kc * 1e3:.0f} ms -> refgrid {t_kc / t_ours:.1f}x faster "
          f"(target >= 10x: {'met' if t_kc / t_ours >= 10 else 'MISSED'})")


if __name__ == "__main__":
    main()
