"""Parquet reference sets as an input of the scan dispatcher: refgrid's own (Zarr v3
documents) or kerchunk's (Zarr v2), read by :mod:`refgrid.refs.parquet`, which owns the
layout in both directions."""

from __future__ import annotations

from refgrid.model.virtual import VirtualGroup
from refgrid.refs.parquet import parquet_group
from refgrid.scanners.options import ScanOptions
from refgrid.scanners.source import Source


def scan_parquet(source: Source, options: ScanOptions) -> VirtualGroup:
    """The model of the parquet reference set at ``source``."""
    return parquet_group(source.url, source.storage_options)
