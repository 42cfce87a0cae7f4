"""Reference sets on disk, one module per layout, each read and written by the same module
(as :mod:`refgrid.model.zarr_json` holds ``zarr.json`` both ways), so a field added on one side
cannot be forgotten on the other:

* :mod:`~refgrid.refs.section` — refgrid's section of every reference set (sources,
  bookkeeping, sidecar), typed;
* :mod:`~refgrid.refs.json_refs` — JSON references (kerchunk v1, Zarr v3 keys or classic v2
  ones; other kerchunk forms read through fsspec);
* :mod:`~refgrid.refs.parquet` — parquet reference directories: ``.zmetadata`` typed, written
  whole or appended to, read as they open; their :mod:`~refgrid.refs.records` (record files
  of references) and :mod:`~refgrid.refs.source_pages` (the sources' record files);
* :mod:`~refgrid.refs.kerchunk_v2` — classic kerchunk's Zarr v2 documents and keys;
* :mod:`~refgrid.refs.icechunk_state` — refgrid's record of an Icechunk repository a batch
  writes (the snapshot, its documents' keys, the section a commit does not carry);
* :mod:`~refgrid.refs.growth` — what an append changes in an archive's Zarr documents, for
  parquet and Icechunk alike, and the check that all else equals the archive's.

The scanners (:mod:`refgrid.scanners`) read through it and the writers (:mod:`refgrid.writers`)
write what it lays out, swapping the files in; it sits between them and the model it builds,
so neither reads its own layout through the other.
"""
