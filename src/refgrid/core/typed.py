"""Names for the loosely structured data refgrid passes around — JSON, attributes, storage
options — so that signatures say what they hold instead of ``Any``.

``Any`` stays only where a third-party type really is untyped (h5py objects, fsspec
filesystems, numcodecs codecs, dask and distributed objects); those are named here too, so
each is one mention with its reason rather than one per signature.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias, cast

JSONScalar: TypeAlias = str | int | float | bool | None
JSON: TypeAlias = JSONScalar | list["JSON"] | dict[str, "JSON"]
"""A value ``json.loads`` returns."""
JSONObject: TypeAlias = dict[str, JSON]
"""A JSON object (a Zarr document, a reference set, refgrid's section of one)."""

StorageOptions: TypeAlias = Mapping[str, object]
"""fsspec's keyword arguments (credentials, endpoint, ...), passed on untouched."""

Attributes: TypeAlias = dict[str, object]
"""A node's attributes as netCDF4 presents them: strings, numbers, numpy scalars and arrays,
lists; refgrid's bookkeeping (``_refgrid_*``) beside them in the model."""

Bytes: TypeAlias = bytes | bytearray | memoryview
"""A chunk's bytes as read: whole, or a view into a larger read they were cut from."""

def as_buffer(data: Bytes) -> bytes:
    """``data`` for a C codec that reads any buffer, though some versions' type stubs say
    ``bytes`` (imagecodecs): the same object, no copy."""
    return cast("bytes", data)


Untyped: TypeAlias = Any
"""An object of a library without type annotations (h5py, fsspec, numcodecs, dask,
distributed, tqdm): what mypy cannot check either way."""
