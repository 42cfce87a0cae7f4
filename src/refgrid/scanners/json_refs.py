"""JSON reference sets (files or dicts) → the model: refgrid's own, walked directly, or any
other kerchunk form (v0, v1 with templates and generators, Zarr v2 keys) through fsspec."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from refgrid.core.bounds import current as current_limits
from refgrid.core.jsonio import loads
from refgrid.core.keys import METADATA
from refgrid.core.sources import (
    ATTRIBUTES_KEY,
    section,
    sidecar_directory,
    stored_identities,
)
from refgrid.core.typed import JSONObject, StorageOptions
from refgrid.errors import NO_SUCH_FILE, FormatError, NotFoundError
from refgrid.model.virtual import VirtualGroup
from refgrid.model.zarr_json import with_bookkeeping
from refgrid.scanners.kerchunk import kerchunk_to_group, load_kerchunk
from refgrid.scanners.options import ScanOptions
from refgrid.scanners.source import Source
from refgrid.scanners.v3_refs import references_to_group


def scan_json(source: Source, options: ScanOptions) -> VirtualGroup:
    """The model of the JSON reference file at ``source``."""
    return reference_dict_to_group(load_json(source), source.url, source.storage_options)


def load_json(source: Source) -> JSONObject:
    """The parsed reference file (:func:`refgrid.core.jsonio.loads`: orjson on 10^5 keys,
    json where orjson would read otherwise)."""
    try:
        fs, path = source.filesystem()
        data = fs.cat_file(path)
    except FileNotFoundError:
        raise NotFoundError(source.url, None, NO_SUCH_FILE) from None
    except OSError as e:
        raise FormatError(source.url, None, f"cannot read the reference file: {e}") from e
    try:
        refs = loads(data)
    except ValueError as e:
        raise FormatError(source.url, None, f"not a kerchunk reference set (not JSON: {e})") \
            from e
    if not isinstance(refs, dict):
        raise FormatError(source.url, None, "not a kerchunk reference set (the JSON is a "
                          f"{type(refs).__name__}, not an object)")
    return refs


def check_bounds(refs: Mapping[str, object], url: str) -> None:
    """Refuse generators and templates that would expand beyond the limits, before fsspec
    expands them (a ``gen`` of 10^5 x 10^5 keys, a 1 MB template used by every key)."""
    bounds = current_limits()
    templates = refs.get("templates") or {}
    if not isinstance(templates, Mapping):
        raise FormatError(url, "templates", "must be an object of name: URL")
    for name, value in templates.items():
        if not isinstance(value, str) or len(value) > bounds.max_url_length:
            raise FormatError(url, f"templates/{name}", f"not a URL of at most "
                              f"{bounds.max_url_length} characters")
    generators = refs.get("gen") or []
    if not isinstance(generators, list):
        raise FormatError(url, "gen", "must be a list of generators")
    total = 0
    for k, gen in enumerate(generators):
        dims = gen.get("dimensions") if isinstance(gen, Mapping) else None
        if not isinstance(dims, Mapping):
            raise FormatError(url, f"gen/{k}", "a generator needs an object 'dimensions'")
        keys = 1
        for name, spec in dims.items():
            keys *= _span(spec, url, f"gen/{k}/dimensions/{name}")
        total += keys
        if total > bounds.max_references:
            raise FormatError(url, f"gen/{k}", f"generators expand to more than "
                              f"{bounds.max_references} keys (refgrid.set_limits("
                              "max_references=...) raises the limit)")


def _span(spec: object, url: str, where: str) -> int:
    """How many values one generator dimension takes (a list, or start/stop/step)."""
    if isinstance(spec, list):
        return len(spec)
    if isinstance(spec, Mapping):
        try:
            start, stop, step = (int(spec.get(k, d)) for k, d in
                                 (("start", 0), ("stop", 0), ("step", 1)))
            return len(range(start, stop, step))
        except (TypeError, ValueError, OverflowError) as e:
            raise FormatError(url, where, f"unusable range: {e}") from e
    raise FormatError(url, where, f"a list or a start/stop/step object, not {spec!r:.40}")


def reference_dict_to_group(refs: Mapping[str, object], url: str = "<references>",
                            storage_options: StorageOptions | None = None) -> VirtualGroup:
    """The model of a loaded reference set: Zarr v3 keys without generators are walked
    directly; everything else is normalised by fsspec's reference filesystem first."""
    if not isinstance(refs, Mapping):
        raise FormatError(url, None, f"not a kerchunk reference set (a {type(refs).__name__}, "
                          "not an object)")
    check_bounds(refs, url)
    entries = refs.get("refs", refs)
    sidecar = sidecar_directory(refs, url)
    if isinstance(entries, Mapping) and METADATA in entries and "gen" not in refs:
        group = references_to_group(refs, url, sidecar)
    else:
        options = storage_options or {}
        group = with_bookkeeping(kerchunk_to_group(load_kerchunk(dict(refs), url, options),
                                                   url, options),
                                 section(refs).get(ATTRIBUTES_KEY))
    return replace(group, sources=stored_identities(refs, sidecar))
