"""One scanned file as a batch keeps it: the model in plain data, pickled, loaded safely.

A combine of 10^5 recorded files must not parse 10^5 reference sets (milliseconds each), so
records are pickles — but of plain data only (dicts, lists, strings, numbers, numpy arrays
and scalars), read back by an unpickler that refuses every other global, and rebuilt through
the model's validating constructors. A record whose layout this version does not know
(``FORMAT``) is not used: its file is scanned again.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, TypeAlias

from refgrid.errors import BatchError, RefgridError
from refgrid.grid.rectilinear import AxisChunks, RectilinearGrid
from refgrid.model.manifest import ChunkManifest
from refgrid.model.virtual import ReportEntry, VirtualArray, VirtualGroup
from refgrid.model.zarr_json import parse_segments, segments_codec

FORMAT = 1
SAFE_GLOBALS = frozenset({
    ("builtins", "complex"), ("numpy", "dtype"), ("numpy", "ndarray"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "scalar"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy._core._internal", "_convert_to_stringdtype_kwargs"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
})
"""What pickles of numpy arrays, dtypes and scalars name: nothing that runs other code."""
Plain: TypeAlias = dict[str, Any]
"""A node as a record holds it (dicts, lists, strings, numbers, numpy arrays and scalars):
loaded data that mypy cannot check; the model's constructors validate it."""


def dumps(group: VirtualGroup, digests: dict[str, str]) -> bytes:
    return pickle.dumps({"group": _group(group), "digests": digests}, protocol=5)


def loads(data: bytes, where: str) -> tuple[VirtualGroup, dict[str, str]]:
    """The group and digests of a record; a damaged one is a :class:`BatchError`."""
    try:
        plain = _Plain(io.BytesIO(data)).load()
        return _rebuild_group(plain["group"]), dict(plain["digests"])
    except (RefgridError, pickle.UnpicklingError, KeyError, TypeError, ValueError,
            EOFError, AttributeError, IndexError) as e:
        raise BatchError(f"{where}: the record is damaged ({type(e).__name__}: {e}); delete "
                         "it, or the work directory, to scan the file again") from e


class _Plain(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in SAFE_GLOBALS:
            raise pickle.UnpicklingError(f"{module}.{name} is not plain data")
        return super().find_class(module, name)


def _group(group: VirtualGroup) -> Plain:
    return {"attrs": dict(group.attrs),
            "arrays": {name: _array(a) for name, a in group.arrays.items()},
            "groups": {name: _group(g) for name, g in group.groups.items()},
            "report": [[e.url, e.variable, e.action, e.reason] for e in group.report],
            "sources": {url: dict(identity) for url, identity in group.sources.items()}}


def _array(array: VirtualArray) -> Plain:
    m = array.manifest
    return {"name": array.name, "dims": list(array.dims), "dtype": array.dtype,
            "fill": array.fill_value, "codecs": [dict(c) for c in array.codecs],
            "attrs": dict(array.attrs),
            "axes": [[a.logical, a.encoded, a.empty_chunk] for a in array.grid.axes],
            "paths": list(m.paths), "path_id": m.path_id, "offset": m.offset,
            "length": m.length, "inline": [[list(k), v] for k, v in m.inline.items()],
            "segments": None if array.segments is None else segments_codec(array.segments)}


def _rebuild_group(plain: Plain) -> VirtualGroup:
    return VirtualGroup(
        plain["attrs"], {name: _rebuild_array(a) for name, a in plain["arrays"].items()},
        {name: _rebuild_group(g) for name, g in plain["groups"].items()},
        tuple(ReportEntry(*entry) for entry in plain["report"]), plain["sources"])


def _rebuild_array(plain: Plain) -> VirtualArray:
    grid = RectilinearGrid(tuple(AxisChunks.of(d, logical, encoded, int(empty))
                                 for d, (logical, encoded, empty) in enumerate(plain["axes"])))
    manifest = ChunkManifest(plain["paths"], plain["path_id"], plain["offset"],
                             plain["length"], {tuple(k): bytes(v) for k, v in plain["inline"]})
    segments = plain.get("segments")
    return VirtualArray(plain["name"], plain["dims"], plain["dtype"], grid, manifest,
                        plain["fill"], plain["codecs"], plain["attrs"],
                        None if segments is None else parse_segments(segments))
