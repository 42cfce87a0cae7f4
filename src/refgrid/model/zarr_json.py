"""Zarr v3 metadata documents (``zarr.json``) ↔ the model, in both directions.

Writers emit these documents inside references; the reference and store scanners parse them
back; the regular-grid view serves documents of its own. Keeping both directions here (as
zarr-python's ``ArrayV3Metadata.from_dict``/``to_dict``) means a field added on one side
cannot be forgotten on the other.

The documents are what any Zarr reader sees, so they carry none of refgrid's ``_refgrid_*``
bookkeeping: :func:`bookkeeping` collects it by node path, writers store it beside the
documents (the ``refgrid`` section of references), and :func:`with_bookkeeping` puts it back
when refgrid reads them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Literal, NotRequired, TypedDict, cast

from refgrid.codecs.filters import CodecJSON, bytes_codec, stored_dtype
from refgrid.core.cf import PACKING_ATTRS
from refgrid.core.dtypes import (
    BOOKKEEPING_PREFIX,
    model_attributes,
    recast_fill,
    split_bookkeeping,
    storable,
    zarr_attributes,
    zarr_data_type,
    zarr_fill_value,
)
from refgrid.core.keys import (
    DEFAULT_ENCODING,
    ChunkKeyEncodingJSON,
    KeyEncoding,
    document_key,
)
from refgrid.core.typed import JSON, Attributes
from refgrid.core.util import same_value
from refgrid.errors import FormatError, ModelError, RefgridError, WriteError
from refgrid.grid.json_forms import ChunkGridJSON, emit_chunk_grid, parse_chunk_grid
from refgrid.grid.rectilinear import GridForm, RectilinearGrid
from refgrid.model.manifest import ChunkManifest
from refgrid.model.segments import Encoding, Segments
from refgrid.model.virtual import VirtualArray, VirtualGroup

if TYPE_CHECKING:
    import numpy as np
    from zarr.core.common import JSON as ZarrJSON
    from zarr.core.dtype.common import DTypeSpec_V3


class ArrayDocument(TypedDict):
    zarr_format: Literal[3]
    node_type: Literal["array"]
    shape: list[int]
    data_type: DTypeSpec_V3
    chunk_grid: ChunkGridJSON
    chunk_key_encoding: ChunkKeyEncodingJSON
    fill_value: ZarrJSON
    codecs: list[CodecJSON]
    attributes: Attributes
    dimension_names: NotRequired[list[str | None]]
    storage_transformers: NotRequired[list[JSON]]


class GroupDocument(TypedDict):
    zarr_format: Literal[3]
    node_type: Literal["group"]
    attributes: Attributes
    consolidated_metadata: NotRequired[dict[str, object]]


Document = ArrayDocument | GroupDocument
ManifestFor = Callable[[str, RectilinearGrid], ChunkManifest]
"""(array path, its grid) → its manifest: how a scanner supplies chunk references."""


KEY_ENCODING_ATTR = "_refgrid_chunk_key_encoding"
"""An array's chunk key encoding where its source store's was not Zarr v3's default (a
``v2`` or ``.``-separated store): its keys are written and served the same way."""
DIMENSION_NAMES_ATTR = "_refgrid_dimension_names"
"""An array's ``dimension_names`` where its source store left some out (``null``; the whole
attribute ``null`` where the store had none): the model names them ``dim_0``..., which
refgrid's engine shows, but documents keep the source's, so xarray's Zarr engine refuses an
unnamed array as it would the store's."""
ROOT_ARRAY_ATTR = "_refgrid_root_array"
"""(On the root group.) The name under which the array that was a store's root is shown:
documents and keys put it back at the root."""


def key_encoding(array: VirtualArray) -> KeyEncoding:
    """The chunk key encoding an array's keys are written and served in (the default where
    what is recorded is none zarr defines: :func:`with_bookkeeping` drops such records)."""
    found = array.attrs.get(KEY_ENCODING_ATTR)
    try:
        return KeyEncoding.from_json(found) if found is not None else DEFAULT_ENCODING
    except ValueError:
        return DEFAULT_ENCODING


def dimension_names(array: VirtualArray) -> list[str | None] | None:
    """The ``dimension_names`` of an array's document: as its source store had them (some
    or all left out, None: none at all) where that is recorded for its dimensions, else
    its dimensions."""
    if DIMENSION_NAMES_ATTR not in array.attrs:
        return list(array.dims)
    names = array.attrs[DIMENSION_NAMES_ATTR]
    if names is None:
        return None
    if isinstance(names, list) and len(names) == len(array.dims) and all(
            n is None or isinstance(n, str) for n in names):
        return list(names)
    return list(array.dims)


def array_document(array: VirtualArray, grid_form: GridForm = "auto") -> ArrayDocument:
    """The ``zarr.json`` of one array: regular grid when possible, rectilinear otherwise."""
    names = dimension_names(array)
    try:
        fill = zarr_fill_value(array.dtype, array.fill_value)
        codecs = [c.copy() for c in array.codecs] if array.segments is None else \
            [segments_codec(array.segments)]
    except ValueError as e:
        raise ModelError(f"array {array.name!r}: {e}") from e
    doc: ArrayDocument = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(array.shape),
        "data_type": zarr_data_type(array.dtype),
        "chunk_grid": emit_chunk_grid(array.grid, grid_form),
        "chunk_key_encoding": key_encoding(array).to_json(),
        "fill_value": fill,
        "codecs": codecs,
        "attributes": zarr_attributes(split_bookkeeping(array.attrs)[0], array.value_dtype),
        "storage_transformers": [],
    }
    if names is not None:
        doc["dimension_names"] = list(names)
    return doc


SEGMENTS_CODEC = "refgrid.segments"
"""The codec an array in segments declares in written documents (``docs/segments.md``): its
configuration holds each segment's encoding. Stock readers refuse a codec they do not know —
loudly, never reading one segment's bytes with another's encoding; refgrid reads it back."""


def segments_codec(segments: Segments) -> CodecJSON:
    """The ``refgrid.segments`` codec of an array in ``segments``: each distinct way of
    storing chunks once (``storage``), the decoding attributes every segment shares once
    (``attributes``), each segment its first chunk, its storage and the attributes that
    are its own (``docs/segments.md``)."""
    storage: list[dict[str, object]] = []
    runs = []
    every = [zarr_attributes(e.attrs, e.dtype) for e in segments.encodings]
    common = {k: v for k, v in every[0].items() if all(
        k in attrs and same_value(attrs[k], v) for attrs in every)}
    for start, e, attrs in zip(segments.starts, segments.encodings, every, strict=True):
        kind: dict[str, object] = {"data_type": zarr_data_type(e.dtype),
                                   "fill_value": zarr_fill_value(e.dtype, e.fill_value),
                                   "codecs": [dict(c) for c in e.codecs]}
        if kind not in storage:
            storage.append(kind)
        run: dict[str, object] = {"start": start, "storage": storage.index(kind)}
        own = {k: v for k, v in attrs.items() if k not in common}
        if own:
            run["attributes"] = own
        runs.append(run)
    return {"name": SEGMENTS_CODEC, "configuration": {
        "dimension": segments.dim, "shown": "decoded" if segments.decoded else "stored",
        "storage": storage, "attributes": common, "segments": runs}}


def refuse_segments(arrays: VirtualGroup | Mapping[str, VirtualArray], output: str) -> None:
    """A :class:`WriteError` naming the arrays (of a group, or by path) stored in segments,
    where ``output`` cannot record them (its readers would read every segment by one
    encoding)."""
    nodes = arrays.walk() if isinstance(arrays, VirtualGroup) else arrays.items()
    found = [(path, node.segments) for path, node in nodes
             if isinstance(node, VirtualArray) and node.segments is not None]
    if found:
        named = "; ".join(f"{path!r}: {len(seg)} segments along {seg.dim!r}"
                          for path, seg in found[:5])
        raise WriteError(
            f"{output} cannot record arrays whose files store them in other ways ({named}"
            f"{' ...' if len(found) > 5 else ''}): its readers would decode every segment "
            "by one encoding. Write format='json' or 'parquet' (read by refgrid's engine, "
            "open_store, get_mapper and serve), or combine with codecs='recode' for a "
            "uniform copy")


def parse_segments(codec: Mapping[str, object]) -> Segments:
    """The inverse of :func:`segments_codec` (a configuration that does not fit is a
    ``ValueError``/``KeyError``/``TypeError``: the caller names the document)."""
    from zarr.core.dtype import get_data_type_from_json

    config = codec["configuration"]
    if not isinstance(config, Mapping) or config.get("shown") not in ("decoded", "stored") \
            or not isinstance(config["dimension"], str) or not all(
            isinstance(config[k], list) and config[k] for k in ("storage", "segments")):
        raise ValueError(f"{SEGMENTS_CODEC} configuration {config!r:.120} is not one")
    storage = []
    for kind in config["storage"]:
        codecs = tuple(kind["codecs"])
        if not codecs or not all(isinstance(c, Mapping) and isinstance(c.get("name"), str)
                                 for c in codecs):
            raise ValueError(f"storage {kind!r:.120} has no codecs")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            zdtype = get_data_type_from_json(kind["data_type"], zarr_format=3)
            dtype = stored_dtype(zdtype.to_native_dtype(), codecs)
            fill = zdtype.from_json_scalar(kind["fill_value"], zarr_format=3)
        storage.append((dtype, codecs, fill))
    starts, encodings = [], []
    common = config.get("attributes") or {}
    if not isinstance(common, Mapping):
        raise ValueError(f"attributes {common!r:.120} are not a mapping")
    for run in config["segments"]:
        if type(run["start"]) is not int or type(run["storage"]) is not int or \
                not 0 <= run["storage"] < len(storage):
            raise ValueError(f"segment {run!r:.120} is not one")
        dtype, codecs, fill = storage[run["storage"]]
        starts.append(run["start"])
        encodings.append(Encoding.of(dtype, codecs, fill, model_attributes(
            {**common, **(run.get("attributes") or {})}, dtype)))
    return Segments(config["dimension"], tuple(starts), tuple(encodings),
                    config["shown"] == "decoded")


def _check_shown(segments: Segments, dtype: np.dtype, dims: tuple[str, ...], name: str,
                 attrs: Mapping[str, object]) -> None:
    """A ``ValueError`` unless a document shows its segments as refgrid would: as its
    segments give (stored or decoded, the type) and, shown as stored, with the packing
    every segment has — a document that says otherwise would have every segment read by
    the top-level encoding."""
    from refgrid.model.presented import presentation

    decoded, shown, _, _ = presentation(name, segments.encodings, dims, attrs)
    mine, theirs = ({k: a.get(k) for k in PACKING_ATTRS}
                    for a in (attrs, segments.encodings[0].attrs))
    if (decoded, shown) != (segments.decoded, dtype.newbyteorder("=")) or (
            not decoded and not same_value(mine, theirs)):
        raise ValueError(f"its segments are shown {'decoded' if decoded else 'as stored'} "
                         f"as {shown}, not as the document says "
                         f"({'decoded' if segments.decoded else 'as stored'}, {dtype})")


def consolidated(root: Mapping[str, object], docs: Mapping[str, Document]
                 ) -> dict[str, object]:
    """``root`` with every other node's document inlined (``docs``: node path → document,
    ``""`` the root, left out): zarr's consolidated metadata, so a store opens in one request.
    Ordered as zarr writes it, by depth then path (zarr 3.1 loses children otherwise)."""
    out = dict(root)
    out["consolidated_metadata"] = {
        "kind": "inline", "must_understand": False,
        "metadata": {p: docs[p] for p in sorted((p for p in docs if p),
                                                key=lambda p: (p.count("/"), p))}}
    return out


def group_document(group: VirtualGroup) -> GroupDocument:
    return {"zarr_format": 3, "node_type": "group",
            "attributes": split_bookkeeping(group.attrs)[0]}


Bookkeeping = dict[str, Attributes]
"""Node path (``""`` the root) → its ``_refgrid_*`` attributes."""


def bookkeeping(group: VirtualGroup) -> Bookkeeping:
    """The ``_refgrid_*`` attributes of every node that has some, by node path."""
    nodes = [("", group), *group.walk()]
    found = {path: split_bookkeeping(node.attrs)[1] for path, node in nodes}
    return {path: kept for path, kept in found.items() if kept}


def with_bookkeeping(group: VirtualGroup, kept: object) -> VirtualGroup:
    """``group`` with the bookkeeping :func:`bookkeeping` collected put back (a section that
    is not a mapping of mappings, or names nodes the group lacks, is ignored: it only
    refines how refgrid shows the data)."""
    if not isinstance(kept, Mapping) or not kept:
        return group

    def merged(node: VirtualArray | VirtualGroup, path: str) -> Attributes:
        extra = kept.get(path)
        if not isinstance(extra, Mapping):
            return dict(node.attrs)
        return {**node.attrs, **{k: v for k, v in extra.items()
                                 if isinstance(k, str) and k.startswith(BOOKKEEPING_PREFIX)
                                 and _usable(node, k, v)}}

    def rebuilt(node: VirtualGroup, prefix: str) -> VirtualGroup:
        arrays = {name: replace(a, attrs=merged(a, prefix + name))
                  for name, a in node.arrays.items()}
        groups = {name: rebuilt(g, f"{prefix}{name}/") for name, g in node.groups.items()}
        return replace(node, attrs=merged(node, prefix.rstrip("/")), arrays=arrays,
                       groups=groups)

    return rebuilt(group, "")


def documents(group: VirtualGroup, grid_form: GridForm = "auto") -> dict[str, Document]:
    """Every node's ``zarr.json``, keyed ``zarr.json``, ``tas/zarr.json``, ``sub/zarr.json``..."""
    out: dict[str, Document] = {document_key(""): group_document(group)}
    for path, node in group.walk():
        out[document_key(path)] = group_document(node) if isinstance(node, VirtualGroup) \
            else array_document(node, grid_form)
    return out


def store_documents(group: VirtualGroup) -> dict[str, Document]:
    """:func:`documents` as the store the group came from had them: a store whose root was
    an array has that array's document at its root again (what a view re-serves; reference
    writers keep the group that holds it)."""
    root = root_array(group)
    if root is not None:
        return {document_key(""): array_document(root)}
    return documents(group)


def _usable(node: VirtualArray | VirtualGroup, name: str, value: object) -> bool:
    """Whether a store-layout record read back from references fits ``node`` (references
    are untrusted: a record that does not fit is dropped, and the node is served as refgrid
    would serve it without one)."""
    if name == KEY_ENCODING_ATTR:
        try:
            KeyEncoding.from_json(value)
        except (ValueError, TypeError, AttributeError):
            return False
    elif name == DIMENSION_NAMES_ATTR and isinstance(node, VirtualArray):
        return value is None or (isinstance(value, list) and len(value) == len(node.dims)
                                 and all(n is None or isinstance(n, str) for n in value))
    elif name == ROOT_ARRAY_ATTR and isinstance(node, VirtualGroup):
        return isinstance(value, str) and set(node.arrays) == {value} and not node.groups
    return True


def root_array(group: VirtualGroup) -> VirtualArray | None:
    """The array a group stands for where the store it came from was that array (and the
    group holds only it: a group that was combined with others is served as a group)."""
    name = group.attrs.get(ROOT_ARRAY_ATTR)
    if not isinstance(name, str) or set(group.arrays) != {name} or group.groups:
        return None
    return group.arrays[name]


def node_paths(group: VirtualGroup) -> dict[str, VirtualArray]:
    """Every array by the path its documents and keys are at (``""``: the root array)."""
    root = root_array(group)
    if root is not None:
        return {"": root}
    return {path: node for path, node in group.walk() if isinstance(node, VirtualArray)}


def group_from_documents(docs: Mapping[str, Mapping[str, object]], manifest_for: ManifestFor,
                         source: str) -> VirtualGroup:
    """The model of a tree of ``zarr.json`` documents (keyed by node path, ``""`` the root);
    ``manifest_for`` supplies each array's chunk references."""
    if "" not in docs:
        raise FormatError(source, None, "no root zarr.json: not Zarr v3 references")
    arrays = {path: _array(path, doc, manifest_for, source)
              for path, doc in docs.items() if doc.get("node_type") == "array"}
    if "" in arrays:  # a store that is one array: shown as a group holding it
        name = root_array_name(source)
        return VirtualGroup(attrs={ROOT_ARRAY_ATTR: name},
                            arrays={name: replace(arrays[""], name=name)})
    return _group("", docs, arrays)


def root_array_name(source: str) -> str:
    """The variable name of a store whose root is an array: the store's name without its
    suffix (``tas.zarr`` → ``tas``), as a user would call it."""
    stem = source.rstrip("/").rsplit("/", 1)[-1].split(".", 1)[0]
    return stem or "data"


def _records_stored(dtype: np.dtype, fill: object, codecs: tuple[CodecJSON, ...]
                   ) -> tuple[np.dtype, object, tuple[CodecJSON, ...], Attributes]:
    """Records another writer described as a Zarr ``struct`` (or a Zarr v2 record type) as
    refgrid stores them (:func:`refgrid.core.dtypes.storable`): raw bytes and the record type
    in ``_refgrid_dtype`` where stock readers would misread the struct (big-endian fields),
    so what refgrid writes again reads right everywhere. The dtype, fill value, codecs and
    the bookkeeping attributes to add."""
    stored, records = storable(dtype)
    if not records:
        return dtype, fill, codecs, {}
    raw = tuple(bytes_codec(stored) if c["name"] == "bytes" else c for c in codecs)
    return stored, recast_fill(fill, dtype, stored), raw, records


def _group(path: str, docs: Mapping[str, Mapping[str, object]],
           arrays: dict[str, VirtualArray]) -> VirtualGroup:
    prefix = f"{path}/" if path else ""
    children = [p for p in docs if p.startswith(prefix) and p != path
                and "/" not in p[len(prefix):]]
    return VirtualGroup(
        attrs=cast("GroupDocument", docs[path]).get("attributes", {}),
        arrays={p[len(prefix):]: arrays[p] for p in children if p in arrays},
        groups={p[len(prefix):]: _group(p, docs, arrays) for p in children
                if docs[p].get("node_type") == "group"},
    )


def _array(path: str, found: Mapping[str, object], manifest_for: ManifestFor,
           source: str) -> VirtualArray:
    from zarr.core.dtype import get_data_type_from_json

    doc = cast("ArrayDocument", found)  # as the format has it; what does not fails below
    try:
        shape = [int(n) for n in doc["shape"]]
        grid = parse_chunk_grid(doc["chunk_grid"], shape)
        codecs = tuple(doc.get("codecs", ()))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            zdtype = get_data_type_from_json(doc["data_type"], zarr_format=3)
            dtype = zdtype.to_native_dtype()
            given_fill = zdtype.from_json_scalar(doc.get("fill_value"), zarr_format=3)
        segments = parse_segments(codecs[0]) if codecs and codecs[0].get("name") == \
            SEGMENTS_CODEC else None
        if segments is not None:
            if len(codecs) != 1:
                raise ValueError(f"{SEGMENTS_CODEC} must be the only codec")
            codecs = (bytes_codec(dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype),)
        elif codecs:
            dtype = stored_dtype(dtype, codecs)
        dtype, fill, codecs, records = _records_stored(dtype, given_fill, codecs)
        given = doc.get("dimension_names")
        names = given if given is not None else [None] * len(shape)
        if not isinstance(names, list) or len(names) != len(shape) or not all(
                n is None or isinstance(n, str) for n in names):
            raise FormatError(source, path, f"dimension_names {names!r:.80} is not a list of "
                              f"{len(shape)} names")
        dims = tuple(n if n is not None else f"dim_{k}" for k, n in enumerate(names))
        attrs = {**model_attributes(doc.get("attributes") or {}, dtype), **records}
        if segments is not None:
            _check_shown(segments, dtype, dims, path.rsplit("/", 1)[-1], attrs)
        if given is None or None in names:
            attrs[DIMENSION_NAMES_ATTR] = None if given is None else list(names)
        encoding = KeyEncoding.from_json(doc.get("chunk_key_encoding"))
        if encoding != DEFAULT_ENCODING:
            attrs[KEY_ENCODING_ATTR] = encoding.to_json()
        return VirtualArray(path.rsplit("/", 1)[-1], dims, dtype, grid,
                            manifest_for(path, grid), fill, codecs, attrs, segments)
    except ModelError as e:  # (segments that do not fit the array, say)
        raise FormatError(source, path, f"unusable zarr.json: {e}") from e
    except RefgridError:
        raise
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as e:
        raise FormatError(source, path, f"unusable zarr.json: {type(e).__name__}: {e}") from e
