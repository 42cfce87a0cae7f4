"""``scan(url)``: one file → :class:`~refgrid.model.VirtualGroup`, format sniffed from its bytes."""

from __future__ import annotations

import os
from typing import Any

from refgrid.errors import FormatError, ScanError
from refgrid.model import VirtualGroup
from refgrid.scan.hdf5 import OnError, ScanOptions, scan_hdf5
from refgrid.scan.kerchunk import scan_kerchunk
from refgrid.scan.kerchunk_parquet import is_parquet_references
from refgrid.scan.netcdf3 import scan_netcdf3
from refgrid.scan.source import Source

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
NETCDF3_MAGIC = (b"CDF\x01", b"CDF\x02", b"CDF\x05")


def scan(
    url: str | os.PathLike[str],
    *,
    on_error: OnError = "raise",
    inline_threshold: int = 0,
    fallback_inline_limit: int = ScanOptions.fallback_inline_limit,
    contiguous_chunk_bytes: int = ScanOptions.contiguous_chunk_bytes,
    **storage_options: Any,
) -> VirtualGroup:
    """Scan one HDF5 / NetCDF4 / NetCDF3 file, or a kerchunk reference set (JSON or parquet),
    local or remote (any fsspec URL).

    ``on_error="raise"`` (default) stops at the first variable that cannot be scanned, naming
    the file, the variable and the reason; ``"report"`` records it in ``VirtualGroup.report``
    and goes on. Variables served another way than byte-range references (inlined, decoded,
    specially encoded) are always listed in the report. ``storage_options`` go to fsspec.
    """
    source = Source.of(url, storage_options)
    options = ScanOptions(on_error, inline_threshold, fallback_inline_limit,
                          contiguous_chunk_bytes)
    if source.url.endswith(".json"):
        return scan_kerchunk(source.url, storage_options)
    if (source.is_local and os.path.isdir(source.url)) or source.url.endswith(
            (".parq", ".parquet")):
        return scan_kerchunk(source.url, storage_options, parquet=True)
    try:
        head = source.head(4096)
    except ScanError:  # a remote "directory": kerchunk parquet references, or nothing
        if is_parquet_references(source.url, storage_options):
            return scan_kerchunk(source.url, storage_options, parquet=True)
        raise
    if any(head[k:k + 8] == HDF5_MAGIC for k in (0, 512, 1024, 2048)):
        return scan_hdf5(source, options)
    if head[:4] in NETCDF3_MAGIC:
        return scan_netcdf3(source, contiguous_chunk_bytes)
    if head[:1] == b"{":
        return scan_kerchunk(source.url, storage_options)
    raise FormatError(source.url, None,
                      f"not an HDF5/NetCDF4/NetCDF3 file (starts with {head[:8]!r})")


__all__ = ["ScanOptions", "scan"]
