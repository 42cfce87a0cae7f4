"""kerchunk's own references for source files, each made in a child process.

kerchunk 0.2.9 with zarr 3.1 hangs on some files (datasets of object or compound dtype: a
failure inside zarr's ``require_array`` leaves its event loop waiting), and after such a
failure later files in the same process may hang too — so every file gets a fresh process
with a time limit. Run as a script, the module is that worker:
``python kerchunk_peer.py SOURCE OUT.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Translations:
    refs: dict[Path, Path] = field(default_factory=dict)
    """source file → kerchunk's JSON references"""
    failed: dict[Path, str] = field(default_factory=dict)
    """source file → why kerchunk produced nothing (its error, or a hang)"""


def translate(files: list[Path], out_dir: Path, timeout: float = 10.0) -> Translations:
    """kerchunk references (``SingleHdf5ToZarr`` / ``NetCDF3ToZarr``) for every file."""
    def one(k: int, source: Path) -> tuple[Path, Path | None, str]:
        target = out_dir / f"{k}.json"
        try:
            done = subprocess.run([sys.executable, __file__, str(source), str(target)],
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return source, None, f"kerchunk hung (> {timeout:.0f} s)"
        if done.returncode:
            last = (done.stdout.strip() or done.stderr.strip()).splitlines()[-1:]
            return source, None, last[0] if last else f"kerchunk exited {done.returncode}"
        return source, target, ""

    result = Translations()
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        for source, target, reason in pool.map(one, range(len(files)), files):
            if target is None:
                result.failed[source] = reason
            else:
                result.refs[source] = target
    return result


def _worker(source: str, target: str) -> int:
    import h5py  # noqa: F401  (before netCDF4's bundled HDF5, as in conftest)
    import hdf5plugin  # noqa: F401
    import kerchunk.hdf
    import kerchunk.netCDF3

    with open(source, "rb") as f:
        classic = f.read(3) == b"CDF"
    translator = kerchunk.netCDF3.NetCDF3ToZarr if classic else kerchunk.hdf.SingleHdf5ToZarr
    try:
        refs = translator(source).translate()  # kerchunk's default: small chunks inlined
    except Exception as e:  # kerchunk's own failure: recorded, not ours
        print(f"{type(e).__name__}: {e}")
        return 1
    Path(target).write_text(json.dumps(refs))
    return 0


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore")
    sys.exit(_worker(sys.argv[1], sys.argv[2]))
