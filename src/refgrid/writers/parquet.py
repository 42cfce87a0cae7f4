"""Parquet references for large archives: kerchunk's columnar layout with Zarr v3 documents.

The layout is fsspec's ``LazyReferenceMapper``'s: ``.zmetadata`` holds every metadata
document (here the ``zarr.json`` of each node) and the ``record_size``; the references of each
array are in ``<array>/refs.<n>.parq``, row ``i`` of file ``n`` being chunk
``n * record_size + i`` of the chunk grid in C order, with columns ``path`` (dictionary
encoded: an archive names few files many times), ``offset``, ``size`` and ``raw`` (inline
bytes). Missing chunks are rows without a path. A reader takes each column whole, so opening an
archive of 10^6 chunks costs milliseconds and no Python object per chunk; the JSON form of the
same archive costs a parse of every key. Pages carry CRC checksums and ``.zmetadata`` a digest
of each record file (the checksums leave page headers and the footer uncovered), so a damaged
record file reads as an error rather than as other references. (fsspec's own reader of this
layout knows only Zarr v2 documents: refgrid's engine and mapper read the v3 form, and the
classic kerchunk form, ``zarr_format=2``, is fsspec's own.)
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from refgrid.core.keys import ZMETADATA
from refgrid.core.sources import RECORDS_KEY, SOURCES_KEY, record_digest
from refgrid.grid.rectilinear import GridForm
from refgrid.model.manifest import flat_index
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.model.zarr_json import documents
from refgrid.writers.atomic import replace_directory, temporary_for
from refgrid.writers.kerchunk_v2 import v2_documents
from refgrid.writers.section import Portable, section

RECORD_SIZE = 100_000
"""Chunks per record file: large enough for few files, small enough to read one quickly."""
DELTA_ENCODED = {"offset": "DELTA_BINARY_PACKED", "size": "DELTA_BINARY_PACKED"}
"""Successive chunks lie one after another: offsets differ by about a chunk's size, which
delta encoding stores in a few bits (plain + zstd leaves ~5 B per offset)."""


def write_parquet(group: VirtualGroup, target: Path, *, grid_form: GridForm = "auto",
                  record_size: int = RECORD_SIZE, zarr_format: Literal[2, 3] = 3,
                  sidecar: Path | None = None) -> Path:
    """Write ``group`` as a parquet reference directory at ``target``, atomically: it is
    built under a temporary name and renamed (an existing directory is replaced).
    ``zarr_format=2`` writes classic kerchunk's v2 documents (regular grids only);
    ``sidecar``: the directory of rewritten chunks beside it, whose files are named relative
    to it."""
    portable = Portable(sidecar)
    metadata = v2_documents(group) if zarr_format == 2 else documents(group, grid_form)
    temporary = temporary_for(target)
    try:
        temporary.mkdir(parents=True)
        digests: dict[str, str] = {}
        for path, node in group.walk():
            if isinstance(node, VirtualArray):
                _write_records(node, temporary, path, record_size, digests, portable)
        (temporary / ZMETADATA).write_text(
            json.dumps({SOURCES_KEY: section(group, portable, **{RECORDS_KEY: digests}),
                        "metadata": metadata, "record_size": record_size}),
            encoding="utf-8")
        replace_directory(temporary, target)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return target

_PANDAS_COLUMNS = [("path", "unicode", "object"), ("offset", "int64", "int64"),
                   ("size", "int64", "int64"), ("raw", "bytes", "object")]
SCHEMA = pa.schema(
    [pa.field("path", pa.dictionary(pa.int32(), pa.string())),
     pa.field("offset", pa.int64()),
     pa.field("size", pa.int64()),
     pa.field("raw", pa.binary())],
    metadata={"pandas": json.dumps({
        "index_columns": [], "column_indexes": [], "columns": [
            {"name": n, "field_name": n, "pandas_type": p, "numpy_type": t, "metadata": None}
            for n, p, t in _PANDAS_COLUMNS]})})
"""The pandas description tells fastparquet (fsspec's default reader of the layout) that
offsets and sizes are plain int64: without it, it reads them as floats. (The columns stay
optional: a required column has no definition levels, and damaged bytes in its pages then
decode to other numbers more often instead of failing.)"""


def _write_records(array: VirtualArray, root: Path, path: str, record_size: int,
                   digests: dict[str, str], portable: Portable) -> None:
    manifest = array.manifest
    path_id = manifest.path_id.reshape(-1)
    table = pa.table({
        "path": pa.DictionaryArray.from_arrays(
            pa.array(path_id, pa.int32(), mask=path_id < 0),
            pa.array([portable(url) for url in manifest.paths], pa.string())),
        "offset": manifest.offset.reshape(-1).astype(np.int64),
        "size": manifest.length.reshape(-1).astype(np.int64),
        "raw": _inline_column(manifest.inline, manifest.shape, len(path_id)),
    }, schema=SCHEMA)
    (root / path).mkdir(parents=True, exist_ok=True)
    for n, first in enumerate(range(0, len(table), record_size)):
        sink = pa.BufferOutputStream()
        pq.write_table(table.slice(first, record_size), sink,
                       compression="zstd", write_statistics=False, write_page_checksum=True,
                       use_dictionary=["path"], column_encoding=DELTA_ENCODED)
        data = sink.getvalue().to_pybytes()
        name = f"{path}/refs.{n}.parq"
        (root / name).write_bytes(data)
        digests[name] = record_digest(data)


def _inline_column(inline: Mapping[tuple[int, ...], bytes], shape: tuple[int, ...],
                   size: int) -> pa.Array:
    """The ``raw`` column: inline chunk bytes at their flat positions, null elsewhere."""
    if not inline:
        return pa.nulls(size, pa.binary())
    raw = np.full(size, None, dtype=object)
    for coords, data in inline.items():
        raw[flat_index(coords, shape)] = data
    return pa.array(raw, pa.binary())
