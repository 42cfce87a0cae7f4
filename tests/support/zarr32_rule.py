"""How zarr-python >= 3.2 reads a rectilinear array, applied to references' raw bytes.

zarr >= 3.2 needs Python >= 3.12, so it cannot run here. Its rule, from
``src/zarr/core/chunk_grids.py`` (``VaryingDimension.chunk_size`` / ``data_size``) and
``tests/test_unified_chunk_grid.py``: chunk ``c`` of a dimension decodes to exactly its declared
edge (``chunk_shapes``, run-length pairs expanded; a bare integer is a regular dimension);
the last edges may reach past the array's extent and are clipped there (``data_size``); no
other field of the grid is read, so ``encoded_chunk_shapes`` is ignored. Decoding uses stock
zarr 3.1's codec pipeline on one chunk of exactly that shape, so a chunk whose bytes hold
more elements fails as it would in zarr 3.2 ("cannot reshape ...").
"""

from __future__ import annotations

import base64
import itertools
import json
import math
from typing import Any

import numpy as np
import zarr
import zarr.storage
from zarr.core.sync import sync


def edges(spec: Any, extent: int) -> list[int]:
    if isinstance(spec, int):
        return [spec] * max(1, math.ceil(extent / spec)) if extent else []
    out: list[int] = []
    for item in spec:
        out.extend([item[0]] * item[1] if isinstance(item, list) else [item])
    assert sum(out) >= extent, (out, extent)
    return out


def _bytes_of(value: Any, templates: dict[str, str]) -> bytes:
    if isinstance(value, str):
        return base64.b64decode(value.removeprefix("base64:")) if value.startswith(
            "base64:") else value.encode()
    url = value[0]
    for name, target in templates.items():
        url = url.replace("{{" + name + "}}", target)
    with open(url.removeprefix("file://"), "rb") as f:
        if len(value) == 1:
            return f.read()
        f.seek(value[1])
        return f.read(value[2])


def read_array(refs: dict[str, Any], path: str) -> np.ndarray:
    """The array at ``path`` of kerchunk v1 references ``refs``, read by zarr 3.2's rule."""
    table, templates = refs["refs"], refs.get("templates", {})
    doc = json.loads(table[f"{path}/zarr.json"])
    shape = doc["shape"]
    grid = doc["chunk_grid"]
    if grid["name"] == "regular":
        per_dim = [edges(n, s) for n, s in zip(grid["configuration"]["chunk_shape"], shape,
                                                strict=True)]
    else:
        assert grid["name"] == "rectilinear"
        per_dim = [edges(spec, s) for spec, s in zip(grid["configuration"]["chunk_shapes"],
                                                      shape, strict=True)]
    bounds = [np.concatenate(([0], np.cumsum(e))).tolist() for e in per_dim]
    meta = {k: v for k, v in doc.items() if k not in ("chunk_grid", "shape")}
    out = None
    for coords in itertools.product(*(range(len(e)) for e in per_dim)):
        start = [b[c] for b, c in zip(bounds, coords, strict=True)]
        if any(s >= n for s, n in zip(start, shape, strict=True)):
            continue  # an edge wholly past the extent (zarr counts it out)
        edge = [e[c] for e, c in zip(per_dim, coords, strict=True)]
        key = "/".join([path, "c", *map(str, coords)]) if coords else f"{path}/c"
        store = zarr.storage.MemoryStore()
        dtype = _dtype(doc)
        one = zarr.create_array(store, shape=edge, chunks=edge, dtype=dtype,
                                fill_value=dtype.from_json_scalar(doc["fill_value"],
                                                                  zarr_format=3),
                                **_pipeline(meta))
        if key in table:
            sync(store.set("/".join(["c", *["0"] * len(edge)]),
                           _buffer(_bytes_of(table[key], templates))))
        values = one[...]
        if out is None:
            out = np.empty(shape, dtype=values.dtype)
        data = tuple(slice(s, min(s + n, size)) for s, n, size in zip(start, edge, shape,
                                                                         strict=True))
        out[data] = values[tuple(slice(0, d.stop - d.start) for d in data)]
    if out is None:  # no chunk at all: a length-0 array
        out = np.empty(shape)
    return out


def _dtype(doc: dict[str, Any]) -> Any:
    from zarr.core.dtype import get_data_type_from_json

    return get_data_type_from_json(doc["data_type"], zarr_format=3)


def _pipeline(meta: dict[str, Any]) -> dict[str, Any]:
    from zarr.abc.codec import ArrayArrayCodec, ArrayBytesCodec
    from zarr.registry import get_codec_class

    codecs = [get_codec_class(c["name"]).from_dict(c) for c in meta["codecs"]]
    filters = [c for c in codecs if isinstance(c, ArrayArrayCodec)]
    serializer = next(c for c in codecs if isinstance(c, ArrayBytesCodec))
    compressors = [c for c in codecs if c not in filters and c is not serializer]
    return {"filters": filters, "serializer": serializer, "compressors": compressors}


def _buffer(data: bytes) -> Any:
    from zarr.core.buffer import default_buffer_prototype

    return default_buffer_prototype().buffer.from_bytes(data)
