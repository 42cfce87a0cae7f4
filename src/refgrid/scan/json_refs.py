"""JSON reference sets (files or dicts) → the model: refgrid's own, walked directly, or any
other kerchunk form (v0, v1 with templates and generators, Zarr v2 keys) through fsspec."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from refgrid.errors import FormatError
from refgrid.gc_pause import gc_paused
from refgrid.keys import METADATA
from refgrid.model import VirtualGroup
from refgrid.scan.kerchunk import kerchunk_to_group, load_kerchunk
from refgrid.scan.options import ScanOptions
from refgrid.scan.source import Source
from refgrid.scan.v3_refs import references_to_group


def scan_json(source: Source, options: ScanOptions) -> VirtualGroup:
    """The model of the JSON reference file at ``source``."""
    return reference_dict_to_group(load_json(source), source.url, source.storage_options)


def load_json(source: Source) -> dict[str, Any]:
    """The parsed reference file (orjson: several times faster than json on 10^5 keys)."""
    try:
        fs, path = source.filesystem()
        data = fs.cat_file(path)
    except FileNotFoundError:
        raise FormatError(source.url, None, "reference file not found") from None
    except OSError as e:
        raise FormatError(source.url, None, f"cannot read the reference file: {e}") from None
    try:
        with gc_paused():
            refs = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise FormatError(source.url, None, f"not a kerchunk reference set (not JSON: {e})") \
            from None
    if not isinstance(refs, dict):
        raise FormatError(source.url, None, "not a kerchunk reference set (the JSON is a "
                          f"{type(refs).__name__}, not an object)")
    return refs


def reference_dict_to_group(refs: Mapping[str, Any], url: str = "<references>",
                            storage_options: Mapping[str, Any] | None = None) -> VirtualGroup:
    """The model of a loaded reference set: Zarr v3 keys without generators are walked
    directly; everything else is normalised by fsspec's reference filesystem first."""
    entries = refs.get("refs", refs)
    if isinstance(entries, Mapping) and METADATA in entries and "gen" not in refs:
        return references_to_group(refs, url)
    options = storage_options or {}
    return kerchunk_to_group(load_kerchunk(dict(refs), url, options), url, options)
