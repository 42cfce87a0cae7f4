"""Zarr v3 metadata documents (``zarr.json``) for groups and arrays, and chunk keys."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from refgrid.dtypes import zarr_data_type, zarr_fill_value
from refgrid.grid import GridForm
from refgrid.model import VirtualArray, VirtualGroup

CHUNK_KEY_ENCODING = {"name": "default", "configuration": {"separator": "/"}}


def array_document(array: VirtualArray, grid_form: GridForm = "auto") -> dict[str, Any]:
    """The ``zarr.json`` of one array: regular grid when possible, rectilinear otherwise."""
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(array.shape),
        "data_type": zarr_data_type(array.dtype),
        "chunk_grid": array.grid.to_json(grid_form),
        "chunk_key_encoding": CHUNK_KEY_ENCODING,
        "fill_value": zarr_fill_value(array.dtype, array.fill_value),
        "codecs": [dict(c) for c in array.codecs],
        "attributes": dict(array.attrs),
        "dimension_names": list(array.dims),
        "storage_transformers": [],
    }


def group_document(group: VirtualGroup) -> dict[str, Any]:
    return {"zarr_format": 3, "node_type": "group", "attributes": dict(group.attrs)}


def documents(group: VirtualGroup, grid_form: GridForm = "auto") -> dict[str, dict[str, Any]]:
    """Every node's ``zarr.json``, keyed ``zarr.json``, ``tas/zarr.json``, ``sub/zarr.json``..."""
    out = {"zarr.json": group_document(group)}
    for path, node in group.walk():
        out[f"{path}/zarr.json"] = group_document(node) if isinstance(node, VirtualGroup) \
            else array_document(node, grid_form)
    return out


def document_node(key: str) -> str | None:
    """The node path of a ``zarr.json`` key as :func:`documents` names them (``""`` for the
    root), or None for any other key."""
    if key == "zarr.json" or key.endswith("/zarr.json"):
        return key[: -len("zarr.json")].rstrip("/")
    return None


def document_keys(keys: Iterable[str]) -> dict[str, str]:
    """Node path → key, for the ``zarr.json`` keys among ``keys``."""
    return {node: k for k in keys
            if k.endswith("zarr.json") and (node := document_node(k)) is not None}


def chunk_key(array_path: str, coords: tuple[int, ...]) -> str:
    """Default v3 chunk key: ``tas/c/0/3/1``; a 0-d array's only chunk is ``name/c``."""
    return "/".join((array_path, "c", *map(str, coords)))
