"""xarray backend engine ``"refgrid"``: references → Dataset, lazily, native chunks.

    xr.open_dataset("refs.json", engine="refgrid", chunks={})

Reads any grid refgrid writes (rectilinear with encoded extents included). Indexing reads
only the chunks touched; ``chunks={}`` gives dask chunks equal to the native chunks (e.g. 31,
28, 31, ... along time) through ``preferred_chunks``. CF decoding is xarray's own.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np
from xarray import Dataset, Variable, conventions
from xarray.backends import BackendArray, BackendEntrypoint
from xarray.core import indexing

from refgrid.dtypes import DTYPE_ATTR, original_dtype, restore_attribute_types
from refgrid.errors import FormatError
from refgrid.model import VirtualArray, VirtualGroup
from refgrid.read.array import output_dtype, read
from refgrid.scan import scan


class RefgridBackendArray(BackendArray):
    """A lazily indexed virtual array (outer indexing: one index per axis)."""

    def __init__(self, array: VirtualArray, path: str,
                 storage_options: dict[str, Any] | None) -> None:
        self.array = array
        self.path = path
        self.storage_options = storage_options
        self.shape = array.shape
        self.records = original_dtype(dict(array.attrs), output_dtype(array))
        """Records refgrid stored as raw bytes come back with their fields ..."""
        self.dtype = self.records.newbyteorder("=") if self.records.fields else self.records
        """... in native byte order, as xarray expects of a backend."""

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(
            key, self.shape, indexing.IndexingSupport.OUTER, self._read)

    def _read(self, key: tuple[Any, ...]) -> np.ndarray:
        values = read(self.array, key, storage_options=self.storage_options, path=self.path)
        if values.dtype == self.dtype:
            return values
        return values.view(self.records).astype(self.dtype)


def _variable(array: VirtualArray, path: str, storage_options: dict[str, Any] | None) -> Variable:
    data = indexing.LazilyIndexedArray(RefgridBackendArray(array, path, storage_options))
    preferred = {}
    for dim, axis in zip(array.dims, array.grid.axes, strict=True):
        size = axis.regular_size
        preferred[dim] = size if size is not None else tuple(axis.logical.tolist())
    encoding = {"preferred_chunks": preferred, "dtype": array.dtype}
    attrs = restore_attribute_types(dict(array.attrs))
    attrs.pop(DTYPE_ATTR, None)  # the records' fields are in the dtype
    if array.fill_value is not None and "_FillValue" not in attrs and array.dtype.kind in "fc":
        encoding["_FillValue"] = array.fill_value
    return Variable(array.dims, data, attrs, encoding)


class RefgridBackendEntrypoint(BackendEntrypoint):
    description = "Open refgrid/kerchunk references (Zarr v3, rectilinear grids included)"
    url = "https://github.com/refgrid/refgrid"
    open_dataset_parameters = ("filename_or_obj", "drop_variables", "group", "storage_options",
                               "mask_and_scale", "decode_times", "decode_timedelta",
                               "use_cftime", "concat_characters", "decode_coords")

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        return False  # references are JSON, which many engines may claim: ask by name

    def open_dataset(  # type: ignore[override]
        self,
        filename_or_obj: str | os.PathLike[str] | dict[str, Any],
        *,
        drop_variables: str | Iterable[str] | None = None,
        group: str | None = None,
        storage_options: dict[str, Any] | None = None,
        mask_and_scale: bool = True,
        decode_times: bool = True,
        decode_timedelta: bool | None = None,
        use_cftime: bool | None = None,
        concat_characters: bool = True,
        decode_coords: bool = True,
    ) -> Dataset:
        node = open_group(filename_or_obj, storage_options, group)
        drop = {drop_variables} if isinstance(drop_variables, str) else set(drop_variables or ())
        prefix = f"{group.strip('/')}/" if group and group.strip("/") else ""
        variables = {name: _variable(array, prefix + name, storage_options)
                     for name, array in node.arrays.items() if name not in drop}
        decoded, attrs, coord_names = conventions.decode_cf_variables(
            variables, restore_attribute_types(dict(node.attrs)), mask_and_scale=mask_and_scale,
            decode_times=decode_times, decode_timedelta=decode_timedelta,
            use_cftime=use_cftime, concat_characters=concat_characters,
            decode_coords=decode_coords)
        return Dataset(decoded, attrs=attrs).set_coords(coord_names & set(decoded))

    def open_groups_as_dict(self, filename_or_obj: Any, **kwargs: Any) -> dict[str, Dataset]:
        storage_options = kwargs.get("storage_options")
        root = open_group(filename_or_obj, storage_options, None)
        out = {"/": self.open_dataset(filename_or_obj, **kwargs)}
        for path, node in root.walk():
            if isinstance(node, VirtualGroup):
                out[f"/{path}"] = self.open_dataset(filename_or_obj, **{**kwargs, "group": path})
        return out

    def open_datatree(self, filename_or_obj: Any, **kwargs: Any) -> Any:
        from xarray import DataTree

        return DataTree.from_dict(self.open_groups_as_dict(filename_or_obj, **kwargs))


def open_group(refs: Any, storage_options: dict[str, Any] | None,
               group: str | None) -> VirtualGroup:
    source = refs if isinstance(refs, str | os.PathLike) else "<references>"
    root = scan(refs, **(storage_options or {}))
    node = root[group] if group and group.strip("/") else root
    if not isinstance(node, VirtualGroup):
        raise FormatError(str(source), group, "is an array, not a group")
    return node
