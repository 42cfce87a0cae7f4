"""OPeNDAP from ``refgrid serve`` against its own Zarr view and against xpublish-opendap.

One NetCDF4 file (365 x 180 x 360 float32, zlib chunks of 30 x 45 x 90: 95 MB of values) is
scanned; its references are served by ``refgrid serve`` (a process of its own, access log
off) and the file itself, opened with xarray, by xpublish with xpublish-opendap (DAP2) in
another process. Three patterns are read: a time series (``v[:, i, j]``, 365 values), a map
(``v[t, :, :]``, 260 KB) and the full variable (95 MB); each through

- refgrid's DAP2 (``.dods``) and DAP4 (``.dap``) endpoints, fetched and decoded by a minimal
  client (one GET, the values parsed out with numpy), and through netCDF-C's DAP2 client
  (netCDF4-python) for the large hyperslab;
- refgrid's regular Zarr view, read by zarr-python (its chunks fetched concurrently and
  decoded on the client);
- xpublish-opendap's ``.dods``, with the same minimal client.

Every answer is checked against the file. Printed per pattern and server: requests/s (small
patterns, sequential) and MB/s of values (all). Targets: refgrid's DAP >= 0.5x its Zarr
view's MB/s for the full variable, and faster than xpublish-opendap on every pattern.

    python benchmarks/serve_dap.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import refgrid
from _common import netcdf4_file
from serve import free_port, wait_for

SHAPE, CHUNKS = (365, 180, 360), (30, 45, 90)
PATTERNS = {"time series": (slice(None), 90, 180), "map": (100, slice(None), slice(None)),
            "full variable": (slice(None), slice(None), slice(None))}
RATIO_TARGET = 0.5


def xpublish_server(path: str, port: int) -> None:
    import xarray as xr
    import xpublish
    from xpublish_opendap import OpenDapPlugin

    ds = xr.open_dataset(path, chunks={})
    rest = xpublish.Rest({"data": ds}, plugins={"opendap": OpenDapPlugin()})
    rest.serve(host="127.0.0.1", port=port, log_level="error")


def _hyperslab(selection: tuple[Any, ...]) -> str:
    """``[i]`` and ``[start:stop]`` only: opendap-protocol (under xpublish-opendap) reads
    ``[a:b:c]`` as Python's start:stop:step, where DAP2 means start:stride:stop."""
    out = ""
    for s, n in zip(selection, SHAPE, strict=True):
        out += f"[{s}]" if isinstance(s, int) else f"[0:{n - 1}]"
    return out


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=600) as answer:
        return answer.read()


def dods_values(body: bytes) -> np.ndarray:
    """The values of a one-variable DAP2 response (Float32; xpublish-opendap ends its DDS
    with ``Data:\\r\\n``, refgrid with ``Data:\\n``: both are read)."""
    data = re.split(rb"\nData:\r?\n", body, maxsplit=1)[1]
    count = struct.unpack(">I", data[:4])[0]
    return np.frombuffer(data, ">f4", count, 8)


def dap_values(body: bytes) -> np.ndarray:
    """The values of a one-variable DAP4 response (Float32, little-endian)."""
    parts, view, at = [], memoryview(body), 0
    while at < len(view):
        length = struct.unpack(">I", view[at: at + 4])[0] & 0xFFFFFF
        parts.append(view[at + 4: at + 4 + length])
        at += 4 + length
    return np.frombuffer(b"".join(parts[1:]), "<f4")


def timed(fn: Callable[[], np.ndarray], want: np.ndarray, repeat: int) -> float:
    """The median seconds of ``fn`` (checked against ``want`` each time)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        got = fn()
        times.append(time.perf_counter() - t0)
        np.testing.assert_array_equal(np.asarray(got).ravel(), want.ravel())
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--xpublish", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.xpublish:
        xpublish_server(args.xpublish[0], int(args.xpublish[1]))
        return
    import netCDF4
    import zarr
    from zarr.storage import FsspecStore

    source = netcdf4_file("serve_dap.nc", SHAPE, CHUNKS)
    with netCDF4.Dataset(source) as nc:
        truth = np.asarray(nc["v"][...])
    servers: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        refgrid.write(refgrid.scan(source), root / "data.json")
        port = free_port()
        servers.append(subprocess.Popen(
            [sys.executable, "-m", "refgrid.cli", "serve", str(root), "--port", str(port),
             "--no-access-log", "--allow-source", str(source.parent), "--dap-max-bytes",
             "1GiB"], stderr=subprocess.DEVNULL))
        ours = f"http://127.0.0.1:{port}"
        wait_for(f"{ours}/healthz", servers[-1])
        peer = None
        try:
            import xpublish_opendap  # noqa: F401
        except ImportError as e:
            print(f"xpublish-opendap: not installed ({e}): not measured")
        else:
            port2 = free_port()
            servers.append(subprocess.Popen(
                [sys.executable, __file__, "--xpublish", str(source), str(port2)],
                stderr=subprocess.DEVNULL))
            peer = f"http://127.0.0.1:{port2}/datasets/data/opendap"
            wait_for(f"{peer}.dds", servers[-1], 120)
        try:
            zarr_array = zarr.open_array(FsspecStore.from_url(
                f"{ours}/data/regular/v", read_only=True), mode="r")
            rows = []
            for pattern, selection in PATTERNS.items():
                want = truth[selection]
                slab = _hyperslab(selection)
                ways: dict[str, Callable[[], np.ndarray]] = {
                    "refgrid DAP2": lambda s=slab: dods_values(_get(f"{ours}/dap/data.dods?v{s}")),
                    "refgrid DAP4": lambda s=slab: dap_values(
                        _get(f"{ours}/dap/data.dap?dap4.ce=/v{s}")),
                    "refgrid Zarr view (zarr-python)": lambda sel=selection: zarr_array[sel],
                }
                if pattern == "full variable":
                    def netcdf_c() -> np.ndarray:
                        with netCDF4.Dataset(f"{ours}/dap/data#mode=dap2") as ds:
                            return np.asarray(ds["v"][...])
                    ways["refgrid DAP2 (netCDF-C client)"] = netcdf_c
                if peer is not None:
                    ways["xpublish-opendap DAP2"] = lambda s=slab: dods_values(
                        _get(f"{peer}.dods?v{s}"))
                for way, fn in ways.items():
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        fn()  # warm-up (opens the dataset, fills caches)
                        seconds = timed(fn, want, args.repeat)
                    rows.append((pattern, way, seconds, want.nbytes / seconds / 1e6))
        finally:
            for server in servers:
                server.terminate()
                server.wait(30)
    print(f"{'pattern':<14} {'server / protocol':<34} {'req/s':>8} {'MB/s':>9}")
    for pattern, way, seconds, mbps in rows:
        print(f"{pattern:<14} {way:<34} {1 / seconds:>8.1f} {mbps:>9.1f}")
    speed = {(p, w): m for p, w, _, m in rows}
    zarr_speed = speed[("full variable", "refgrid Zarr view (zarr-python)")]
    ok = True
    for protocol in ("DAP2", "DAP4"):
        ratio = speed[("full variable", f"refgrid {protocol}")] / zarr_speed
        ok &= ratio >= RATIO_TARGET
        print(f"full variable: refgrid {protocol} / Zarr view = {ratio:.2f}x "
              f"(target >= {RATIO_TARGET}x)")
    if peer is not None:
        for pattern in PATTERNS:
            ratio = speed[(pattern, "refgrid DAP2")] / speed[(pattern, "xpublish-opendap DAP2")]
            ok &= ratio > 1
            print(f"{pattern}: refgrid DAP2 / xpublish-opendap = {ratio:.1f}x (target > 1x)")
    print("targets met" if ok else "TARGETS MISSED")
    if not ok and os.environ.get("REFGRID_BENCH_STRICT"):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
