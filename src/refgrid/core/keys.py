"""Store keys of a Zarr v3 node tree: metadata at ``zarr.json``, chunks at ``tas/c/0/3/1``.

One module names them for every reader and writer (as zarr-python's
``chunk_key_encodings``), so the parsers of keys can never drift from the writers of keys.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterable, Mapping
from typing import Any, Literal, TypedDict, TypeVar

V = TypeVar("V")

METADATA = "zarr.json"
ZMETADATA = ".zmetadata"
"""The consolidated metadata of parquet references (kerchunk's and refgrid's)."""
BOOKKEEPING = "refgrid.json"
"""refgrid's bookkeeping beside a served store's documents (``{"attributes": {node: ...}}``),
answered but never listed: stock readers do not see it, refgrid's engine reads it back."""
ZGROUP, ZARRAY, ZATTRS = ".zgroup", ".zarray", ".zattrs"
"""Zarr v2 metadata documents (classic kerchunk references, read and written)."""


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


def chunk_key_tail(coords: tuple[int, ...], encoding: Any = None) -> str:
    """A chunk's key below its array under ``encoding`` (an array document's
    ``chunk_key_encoding``; None: Zarr v3's ``default`` with ``/``): ``c/0/3/1``, ``c.0.3.1``,
    ``0.3.1`` or ``0/3/1`` (``v2``); ``c`` or ``0`` for a 0-d array."""
    name, separator = _key_encoding({"chunk_key_encoding": encoding})
    if separator not in ("/", "."):
        raise ValueError(f"unknown chunk key separator {separator!r}")
    if name == "v2":
        return separator.join(map(str, coords)) if coords else "0"
    if name == "default":
        return separator.join(("c", *map(str, coords)))
    raise ValueError(f"unknown chunk key encoding {name!r}")


def chunk_key_v2(array_path: str, coords: tuple[int, ...]) -> str:
    """Zarr v2 chunk key with ``.`` separators: ``tas/0.3.1``; ``name/0`` for a 0-d array."""
    return f"{array_path}/{'.'.join(map(str, coords)) if coords else '0'}"


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


DIGITS = re.compile(r"\d+(/\d+)*")


def chunk_entries(entries: Iterable[tuple[str, V]], documents: Mapping[str, Mapping[str, Any]]
                  ) -> dict[str, list[tuple[str, V]]]:
    """Each array's chunks among store ``entries`` (key, value): array path → ``[(coordinates
    "0/3/1", value), ...]``, each array under its own ``chunk_key_encoding`` (``default`` or
    ``v2``, ``/`` or ``.``). One pass over 10^5 keys: the common encoding (``default``, ``/``,
    no array at the root) is parsed inline, without a call per key."""
    arrays = {path: _key_encoding(doc) for path, doc in documents.items()
              if doc.get("node_type") == "array"}
    found: dict[str, list[tuple[str, V]]] = {path: [] for path in arrays}
    if "" not in arrays and all(e == ("default", "/") for e in arrays.values()):
        for key, value in entries:
            head, sep, tail = key.rpartition("/c/")
            if sep and head in found:
                found[head].append((tail, value))
            elif key.endswith("/c") and key[:-2] in found:
                found[key[:-2]].append(("", value))
        return found
    ndims = {path: len(documents[path].get("shape") or ()) for path in arrays}
    for key, value in entries:
        head = key
        while True:
            head = head.rpartition("/")[0]
            if head in arrays or not head:
                break
        if head not in arrays:
            continue
        tail = key[len(head) + 1:] if head else key
        coords = _coords(tail, *arrays[head], ndims[head])
        if coords is not None:
            found[head].append((coords, value))
    return found


def _key_encoding(doc: Mapping[str, Any]) -> tuple[str, str]:
    encoding = doc.get("chunk_key_encoding") or {"name": "default"}
    name = encoding.get("name", "default") if isinstance(encoding, Mapping) else "default"
    config = (encoding.get("configuration") or {}) if isinstance(encoding, Mapping) else {}
    return name, config.get("separator", "/" if name == "default" else ".")


def _coords(tail: str, name: str, separator: str, ndim: int) -> str | None:
    """Coordinates ``"0/3/1"`` of a chunk key's part below its array, or None."""
    if name == "default":
        if tail == "c":
            return "" if ndim == 0 else None
        if not tail.startswith("c" + separator):
            return None
        tail = tail[2:]
    elif ndim == 0:
        return "" if tail == "0" else None
    coords = tail.replace(separator, "/") if separator != "/" else tail
    if not DIGITS.fullmatch(coords) or coords.count("/") + 1 != ndim:
        return None
    return coords
