"""Store keys of a Zarr v3 node tree: metadata at ``zarr.json``, chunks at ``tas/c/0/3/1``.

One module names them for every reader and writer (as zarr-python's
``chunk_key_encodings``), so the parsers of keys can never drift from the writers of keys.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from typing import Any, Literal, TypedDict

METADATA = "zarr.json"


class ChunkKeyEncodingJSON(TypedDict):
    name: Literal["default", "v2"]
    configuration: dict[str, Any]


CHUNK_KEY_ENCODING: ChunkKeyEncodingJSON = {"name": "default",
                                            "configuration": {"separator": "/"}}
"""What refgrid writes: Zarr v3's default encoding with ``/`` separators."""


def document_key(node: str) -> str:
    """The ``zarr.json`` key of a node path (``""`` is the root)."""
    return f"{node}/{METADATA}" if node else METADATA


def document_node(key: str) -> str | None:
    """The node path of a ``zarr.json`` key (``""`` for the root), or None for any other key."""
    if key == METADATA or key.endswith(f"/{METADATA}"):
        return key[: -len(METADATA)].rstrip("/")
    return None


def document_keys(keys: Iterable[str]) -> dict[str, str]:
    """Node path → key, for the ``zarr.json`` keys among ``keys``."""
    return {node: k for k in keys
            if k.endswith(METADATA) and (node := document_node(k)) is not None}


def chunk_key(array_path: str, coords: tuple[int, ...]) -> str:
    """Default v3 chunk key: ``tas/c/0/3/1``; a 0-d array's only chunk is ``name/c``."""
    return "/".join((array_path, "c", *map(str, coords)))


def chunk_of_key(key: str, arrays: Container[str]) -> tuple[str, str] | None:
    """``(array path, "0/3/1")`` for a default-encoded chunk key of one of ``arrays`` (a set
    or a dict keyed by path: called once per key, so it must look up fast), with
    ``(path, "")`` for a 0-d array's chunk; None for any other key."""
    head, sep, tail = key.rpartition("/c/")
    if sep and head in arrays:
        return head, tail
    if key.endswith("/c") and key[:-2] in arrays:
        return key[:-2], ""
    return None
