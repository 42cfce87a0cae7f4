"""Reading a virtual array: selection → chunks → byte ranges → decode → crop → assemble.

Chunks decode to their *encoded* shape and only the logical part is kept (the selection's
in-chunk indices never reach past it), so padded chunks inside a rectilinear grid read
correctly. Missing chunks read as the fill value. Decoding runs in a thread pool: the codecs
release the GIL, so both cores work.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from refgrid.codecs import decode_chunk
from refgrid.errors import ReadError
from refgrid.manifest import INLINE, MISSING
from refgrid.model import VirtualArray
from refgrid.read.fetch import Range, fetch
from refgrid.selection import ChunkSelection
from refgrid.write.zarr_v3 import chunk_key


def output_dtype(array: VirtualArray) -> np.dtype:
    """Values come back in native byte order (strings and bytes as objects)."""
    if array.dtype.kind in "OT":
        return np.dtype(object)
    if array.dtype.fields is None and array.dtype.itemsize > 1 and array.dtype.kind != "V":
        return array.dtype.newbyteorder("=")
    return array.dtype


def read(array: VirtualArray, selection: Any = ..., *,
         storage_options: dict[str, Any] | None = None, path: str | None = None) -> np.ndarray:
    """``array[selection]`` (orthogonal indexing) read through the references."""
    if selection is ... and array.grid.nchunks == 1 and \
            array.manifest.path_id.reshape(-1)[0] == INLINE:  # small coordinates, scalars
        coords = (0,) * array.grid.ndim
        block = decode_chunk(array.manifest.inline[coords], array.codecs, array.dtype,
                             array.grid.encoded_chunk_shape(coords))
        return np.array(block[array.grid.chunk_region(coords)], dtype=output_dtype(array))
    decomposition = array.grid.select(selection)
    dtype = output_dtype(array)
    fill = array.fill_value if array.fill_value is not None else np.zeros((), dtype)[()]
    out = np.empty(decomposition.shape, dtype=dtype)
    out[...] = fill
    manifest = array.manifest
    pieces: list[ChunkSelection] = [p for p in decomposition if
                                    manifest.path_id[p.coords] != MISSING]
    stored = [p for p in pieces if manifest.path_id[p.coords] != INLINE]
    ranges = [Range(manifest.paths[manifest.path_id[p.coords]], int(manifest.offset[p.coords]),
                    int(manifest.length[p.coords])) for p in stored]
    name = path or array.name
    try:
        blobs = dict(zip((p.coords for p in stored), fetch(ranges, storage_options),
                         strict=True))
    except FileNotFoundError as e:
        raise ReadError(f"array {name!r}: source file not found: {e}") from None
    except OSError as e:
        raise ReadError(f"array {name!r}: cannot read source bytes: {e}") from None

    def place(piece: ChunkSelection) -> None:
        coords = piece.coords
        key = chunk_key(name, coords)
        if manifest.path_id[coords] == INLINE:
            data = manifest.inline[coords]
        else:
            data = blobs[coords]
            expected = int(manifest.length[coords])
            if len(data) != expected:
                r = ranges[stored.index(piece)]
                raise ReadError(f"array {name!r}, chunk {key}: short read from {r.url} bytes "
                                f"{r.offset}-{r.offset + r.length} ({len(data)} of {expected})")
        try:
            block = decode_chunk(data, array.codecs, array.dtype,
                                 array.grid.encoded_chunk_shape(coords))
        except Exception as e:
            where = "inline bytes" if manifest.path_id[coords] == INLINE else (
                f"{manifest.paths[manifest.path_id[coords]]} bytes "
                f"{int(manifest.offset[coords])}+{int(manifest.length[coords])}")
            raise ReadError(f"array {name!r}, chunk {key} ({where}) does not decode: "
                            f"{type(e).__name__}: {e}") from None
        piece.write_into(out, piece.read_from(block))

    if len(pieces) > 1:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(place, pieces))
    else:
        for piece in pieces:
            place(piece)
    return out
