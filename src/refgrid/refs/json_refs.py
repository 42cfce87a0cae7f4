"""JSON reference sets (kerchunk's version 1: ``{"version": 1, "templates": ..., "refs":
...}``, refgrid's section first) in both directions.

Written: keys are Zarr v3 (``zarr.json``, ``tas/c/0/3/1``: :func:`to_kerchunk`), or classic
kerchunk's Zarr v2 (``tas/.zarray``, ``tas/0.3.1``: :func:`to_kerchunk_v2`, documents from
:mod:`refgrid.refs.kerchunk_v2`); values are ``[url, offset, length]``, or ``base64:`` inline
bytes stored verbatim. URLs go through ``templates`` (``{{u0}}``) where several files are
referenced — a combined archive names each file for many chunks; the references of a single
file name it plainly, the form readers that do not expand templates (VirtualiZarr's kerchunk
parser) open. refgrid's section (:mod:`refgrid.refs.section`) comes first: its first bytes
tell the engine the file is refgrid's.

Read (:func:`reference_dict_to_group`): Zarr v3 keys without generators — refgrid's own — are
walked directly (:func:`references_to_group`: every ``zarr.json`` a group or an array, the
chunk references manifest columns, key parsing and value columns done in numpy, so a reference
dict of 10^5 keys is walked once with no Python object kept per chunk); any other kerchunk
form (v0, v1 with templates and generators, Zarr v2 keys) is normalised by fsspec's reference
filesystem first, generators and templates bounded before it expands them.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import fsspec
import numpy as np

from refgrid.core.bounds import current as current_limits
from refgrid.core.jsonio import dumps
from refgrid.core.keys import (
    METADATA,
    chunk_entries,
    chunk_key,
    chunk_key_v2,
    document_keys,
    flat_indices,
)
from refgrid.core.typed import JSON, JSONObject, StorageOptions
from refgrid.core.util import gc_paused
from refgrid.errors import NO_SUCH_FILE, FormatError, NotFoundError
from refgrid.grid.rectilinear import GridForm, RectilinearGrid
from refgrid.model.manifest import ChunkManifest, ManifestBuilder, chunk_coords
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.model.zarr_json import (
    consolidated,
    documents,
    group_from_documents,
    key_encoding,
    with_bookkeeping,
)
from refgrid.refs.kerchunk_v2 import KerchunkValue, as_base64, v2_documents, v2_keys_group
from refgrid.refs.section import SECTION_KEY, SIDECAR_TEMPLATE, Portable, Section

KeyOf = Callable[[str, tuple[int, ...], VirtualArray], str]
"""(array path, chunk coordinates, the array) → the chunk's key."""


def to_kerchunk(group: VirtualGroup, *, grid_form: GridForm = "auto",
                sidecar: Path | None = None) -> JSONObject:
    """The kerchunk v1 reference dict of ``group`` (metadata documents included). Where
    every array's grid is regular, the root's document carries every node's as consolidated
    metadata, so stock zarr and xarray open it in one read, without a warning; a rectilinear
    grid there would make zarr 3.1 (or zarr >= 3.2 without its flag) refuse the whole group
    rather than that one array, so such references are opened with ``consolidated=False``.
    ``sidecar``: the directory of rewritten chunks beside the references, whose files are
    named relative to it."""
    docs = documents(group, grid_form)
    if all(array.grid.is_regular for _, array in group.walk()
           if isinstance(array, VirtualArray)) and grid_form == "auto":
        nodes = {key[:-len(METADATA)].rstrip("/"): doc for key, doc in docs.items()}
        docs[METADATA] = consolidated(nodes[""], nodes)  # type: ignore[assignment]
    return _references(group, {k: dumps(d) for k, d in docs.items()},
                       lambda path, coords, array: chunk_key(path, coords, key_encoding(array)),
                       Portable(sidecar))


def to_kerchunk_v2(group: VirtualGroup) -> JSONObject:
    """Classic kerchunk references of ``group``: Zarr v2 keys and documents (regular grids
    only; a rectilinear array is a :class:`~refgrid.errors.WriteError` naming it)."""
    return _references(group, {k: dumps(d) for k, d in v2_documents(group).items()},
                       lambda path, coords, array: chunk_key_v2(path, coords), Portable(None))


def _references(group: VirtualGroup, metadata: dict[str, str], key_of: KeyOf,
                portable: Portable) -> JSONObject:
    """The reference dict of ``group``: refgrid's section, the templates, ``metadata`` (key
    → document text) and every chunk's reference at ``key_of`` its coordinates."""
    arrays = [(path, node) for path, node in group.walk() if isinstance(node, VirtualArray)]
    names = {portable(url) for _, array in arrays for url in array.manifest.paths}
    templates: dict[str, str] | None = {} if len(names) > 1 else None
    refs: dict[str, JSON] = dict(metadata)
    with gc_paused():  # 10^5 small lists: the collector would walk them again and again
        for path, array in arrays:
            _chunk_refs(path, array, templates, refs, key_of, portable)
    # refgrid's section first (readers check the sources against it; fsspec ignores it):
    # its first bytes tell xarray the file is refgrid's (read/backend.owned_output)
    out: JSONObject = {SECTION_KEY: Section.of_group(group, portable).to_dict(), "version": 1}
    if templates or portable.template:
        out["templates"] = {**{v: k for k, v in (templates or {}).items()},
                            **portable.template}
    out["refs"] = refs
    return out


def _chunk_refs(path: str, array: VirtualArray, templates: dict[str, str] | None,
                refs: dict[str, JSON], key_of: KeyOf,
                portable: Portable) -> None:
    """``templates`` is None where URLs are written plainly (a sidecar's files are always
    written through its own template)."""
    manifest = array.manifest
    urls = [portable(url) for url in manifest.paths]
    names = urls if templates is None else [
        url if url.startswith("{{") else
        "{{" + templates.setdefault(url, f"u{len(templates)}") + "}}" for url in urls]
    flat, ids, offsets, lengths = manifest.stored()
    axes = np.unravel_index(flat, manifest.shape) if manifest.shape else ()
    for k, (pid, off, n) in enumerate(zip(ids, offsets, lengths, strict=True)):
        key = key_of(path, tuple(int(c[k]) for c in axes), array)
        refs[key] = [names[pid], off, n]
    for coords, data in manifest.inline.items():  # ChunkManifest checks they are marked INLINE
        refs[key_of(path, coords, array)] = "base64:" + base64.b64encode(data).decode("ascii")


# -- read ------------------------------------------------------------------------------

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
    section = Section.of(refs)
    sidecar = section.sidecar_directory(url)
    if isinstance(entries, Mapping) and METADATA in entries and "gen" not in refs:
        group = _walked(refs, url, sidecar)
    else:
        options = storage_options or {}
        normalised = load_kerchunk(dict(refs), url, options)
        group = _walked({"refs": {k: value if isinstance(value, list) else as_base64(value)
                                  for k, value in normalised.items()}}, url, None) \
            if METADATA in normalised else v2_keys_group(normalised, url, options)
    return replace(with_bookkeeping(group, section.attributes),
                   sources=section.identities(sidecar))


def load_kerchunk(refs: str | Mapping[str, object], url: str,
                  storage_options: StorageOptions) -> Mapping[str, KerchunkValue]:
    """The key → value mapping of a kerchunk reference set (a URL, or a loaded dict)."""
    try:
        fs = fsspec.filesystem("reference", fo=refs, target_options=dict(storage_options),
                               remote_options=dict(storage_options), simple_templates=False,
                               skip_instance_cache=True)
    except FileNotFoundError as e:
        raise NotFoundError(url, None, NO_SUCH_FILE) from e
    except (ValueError, KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
        raise FormatError(url, None, f"not a kerchunk reference set: {e}") from e
    return fs.references


ChunkRefs = list[tuple[str, Any]]
"""One array's chunk references: (key tail such as ``"0/3/1"``, reference value). A value is
``[url, offset, length]`` or inline text as the reference set holds it, unchecked: it is
used duck-typed, and whatever is not one of those is refused as it is read."""


def references_to_group(refs: Mapping[str, object], source: str = "<references>",
                        sidecar: str | None = None) -> VirtualGroup:
    """Build the model of a reference set written with Zarr v3 keys (a kerchunk dict, with
    or without the ``{"version": 1, "refs": ...}`` wrapper) and its section's bookkeeping;
    ``sidecar``: where its sidecar directory lies now (its template resolved there)."""
    return with_bookkeeping(_walked(refs, source, sidecar), Section.of(refs).attributes)


def _walked(refs: Mapping[str, object], source: str, sidecar: str | None) -> VirtualGroup:
    # (as the callers checked them: entries an object, templates name → URL or absent)
    entries = cast(Mapping[str, object], refs.get("refs", refs))
    templates = dict(cast(Mapping[str, str], refs.get("templates", {})))
    if sidecar is not None:
        templates[SIDECAR_TEMPLATE.strip("{}")] = sidecar
    docs = {node: document(entries[k], source, k) for node, k in document_keys(entries).items()}
    with gc_paused():
        chunks = chunk_entries(entries.items(), docs)
        return group_from_documents(docs, lambda path, grid: chunk_manifest(
            grid, chunks.get(path, []), templates, f"{source}:{path}"), source)


def document(value: object, source: str, key: str) -> JSONObject:
    """A ``zarr.json`` reference value (JSON text, ``base64:`` text or an object) parsed."""
    try:
        if isinstance(value, str) and value.startswith("base64:"):
            value = base64.b64decode(value[7:], validate=True).decode("utf-8")
        parsed = json.loads(value) if isinstance(value, str | bytes) else dict(
            cast(Mapping[str, JSON], value))  # an inline object
    except (json.JSONDecodeError, TypeError, ValueError, binascii.Error) as e:
        raise FormatError(source, key, f"metadata is not a JSON document: {e}") from e
    if not isinstance(parsed, dict):
        raise FormatError(source, key, f"metadata is a JSON {type(parsed).__name__}, not an "
                          "object")
    return parsed


def chunk_manifest(grid: RectilinearGrid, chunks: ChunkRefs, templates: Mapping[str, str],
                   where: str) -> ChunkManifest:
    """Chunk references → manifest columns, key parsing and value columns done in numpy."""
    counts = grid.chunk_counts
    built = ManifestBuilder(counts)
    flat = flat_indices([tail for tail, _ in chunks], counts)
    values = [value for _, value in chunks]
    ranged = np.array([type(v) is list for v in values], bool)
    keep = flat >= 0  # a key outside the grid holds no data of this array
    refs = np.flatnonzero(ranged & keep)
    if len(refs):
        rows = [values[k] for k in refs.tolist()] if len(refs) < len(values) else values
        if set(map(len, rows)) != {3}:
            bad = next(k for k in refs.tolist() if len(values[k]) != 3)
            raise FormatError(where, chunks[bad][0], "whole-file references are not supported "
                              "for chunks") from None
        targets, offsets, lengths = zip(*rows, strict=True)
        try:
            names = dict.fromkeys(targets)
        except TypeError:  # an unhashable target (a list, an object) is no URL
            names = {None: None}
        if not all(isinstance(n, str) for n in names):
            bad = next(k for k in refs.tolist() if not isinstance(values[k][0], str))
            raise FormatError(where, chunks[bad][0], f"reference {values[bad]!r:.80} names "
                              "no URL")
        remap = np.array([built.url(_render(n, templates)) for n in names], np.int32)
        if len(names) == 1:
            ids = remap[0]
        else:
            code = {n: k for k, n in enumerate(names)}
            ids = remap[np.fromiter(map(code.__getitem__, targets), np.int32, len(targets))]
        built.ranges(flat[refs], ids, _byte_counts(offsets, "offset", chunks, refs, where),
                     _byte_counts(lengths, "length", chunks, refs, where))
    for k in np.flatnonzero(~ranged & keep).tolist():
        value = values[k]
        try:
            data = base64.b64decode(value[7:], validate=True) if value.startswith("base64:") \
                else value.encode("utf-8")
        except (AttributeError, binascii.Error, UnicodeEncodeError) as e:
            raise FormatError(where, chunks[k][0], f"inline chunk {value!r:.40} is neither "
                              f"text nor base64 ({e})") from e
        built.inlined(chunk_coords(int(flat[k]), counts), data)
    return built.build()


MAX_BYTES = 2**62
"""The largest offset or length accepted (sums of them stay within int64)."""


def _byte_counts(column: Sequence[object], what: str, chunks: ChunkRefs, rows: np.ndarray,
                 where: str) -> np.ndarray:
    """An offset or length column as uint64, every entry an integer in [0, 2**62]."""
    if set(map(type, column)) <= {int}:  # the JSON case: checked in bulk
        values = np.array(column)  # int64, or object beyond it
        if values.dtype.kind == "i" and values.min() >= 0 and values.max() <= MAX_BYTES:
            return values.astype(np.uint64)
    ok = [isinstance(v, int | np.integer) and not isinstance(v, bool) and 0 <= v <= MAX_BYTES
          for v in column]
    if not all(ok):
        k = ok.index(False)
        raise FormatError(where, chunks[int(rows[k])][0], f"chunk {what} {column[k]!r:.40} is "
                          "not an integer in [0, 2**62]")
    integers = cast(Sequence[int | np.integer], column)  # (each checked above)
    return np.array([int(v) for v in integers], dtype=np.uint64)


TEMPLATE = re.compile(r"\{\{(\w+)\}\}")
"""A template's place in a URL (``{{u}}``)."""


def _render(url: str, templates: Mapping[str, str]) -> str:
    """``url`` with each ``{{name}}`` of ``templates`` rendered, in one pass (as fsspec's
    reference filesystem renders them): one look per URL, not one per template — a
    reference set of 10^3 files names 10^3 templates."""
    if "{{" not in url:
        return url
    return TEMPLATE.sub(lambda m: templates.get(m.group(1), m.group(0)), url)
