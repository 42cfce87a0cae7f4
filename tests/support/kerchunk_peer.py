"""kerchunk's own references for source files, each made in a forked child process.

kerchunk 0.2.9 with zarr 3.1 hangs on some files (datasets of object or compound dtype: a
failure inside zarr's ``require_array`` leaves its event loop waiting), and after such a
failure later files in the same process may hang too. So a worker process imports kerchunk
once and forks a fresh child per file, killing children that make no progress. Run as a
script, the module is that worker: ``python kerchunk_peer.py TIMEOUT OUT_DIR FILE...``.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Translations:
    refs: dict[Path, Path] = field(default_factory=dict)
    """source file → kerchunk's JSON references"""
    failed: dict[Path, str] = field(default_factory=dict)
    """source file → why kerchunk produced nothing (its error, or a hang)"""


def translate(files: list[Path], out_dir: Path, timeout: float = 5.0) -> Translations:
    """kerchunk references (``SingleHdf5ToZarr`` / ``NetCDF3ToZarr``) for every file."""
    subprocess.run([sys.executable, __file__, str(timeout), str(out_dir), *map(str, files)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = Translations()
    for k, source in enumerate(files):
        refs, error = out_dir / f"{k}.json", out_dir / f"{k}.err"
        if refs.exists():
            result.refs[source] = refs
        else:
            result.failed[source] = error.read_text() if error.exists() else "no output"
    return result


def _translate_one(source: str, refs: Path, error: Path) -> int:
    import kerchunk.hdf
    import kerchunk.netCDF3

    with open(source, "rb") as f:
        classic = f.read(3) == b"CDF"
    translator = kerchunk.netCDF3.NetCDF3ToZarr if classic else kerchunk.hdf.SingleHdf5ToZarr
    try:
        translated = translator(source).translate()  # kerchunk's default: small chunks inlined
    except Exception as e:  # kerchunk's own failure: recorded, not ours
        error.write_text(f"{type(e).__name__}: {e}")
        return 1
    partial = refs.with_suffix(".partial")
    partial.write_text(json.dumps(translated))
    partial.rename(refs)  # a child killed while writing leaves no references behind
    return 0


def _worker(timeout: float, out_dir: Path, files: list[str]) -> None:
    import h5py  # noqa: F401  (before netCDF4's bundled HDF5, as in conftest)
    import hdf5plugin  # noqa: F401
    for module in ("kerchunk.hdf", "kerchunk.netCDF3"):  # imported once: children inherit
        importlib.import_module(module)

    running: dict[int, tuple[int, float]] = {}
    queue = list(enumerate(files))
    while queue or running:
        while queue and len(running) < (os.cpu_count() or 2):
            k, name = queue.pop(0)
            pid = os.fork()
            if pid == 0:
                os._exit(_translate_one(name, out_dir / f"{k}.json", out_dir / f"{k}.err"))
            running[pid] = (k, time.monotonic())
        time.sleep(0.005)
        for pid, (k, started) in list(running.items()):
            if os.waitpid(pid, os.WNOHANG)[0]:
                del running[pid]
            elif time.monotonic() - started > timeout:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                (out_dir / f"{k}.err").write_text(f"kerchunk hung (> {timeout:.0f} s)")
                del running[pid]


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore")
    _worker(float(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
