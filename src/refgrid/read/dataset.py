"""What the ``"refgrid"`` engine builds: Datasets of lazily indexed virtual arrays.

Indexing reads only the chunks touched; ``chunks={}`` gives dask chunks equal to the native
chunks (e.g. 31, 28, 31, ... along time) through ``preferred_chunks``. CF decoding is
xarray's own.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
from xarray import Coordinates, Dataset, Variable, conventions
from xarray.backends import BackendArray
from xarray.backends.common import _decode_variable_name
from xarray.coding.strings import create_vlen_dtype
from xarray.core import indexing

from refgrid.core.dtypes import (
    dataset_encoding,
    original_dtype,
    reader_attrs,
    variable_encoding,
    vlen_element,
)
from refgrid.core.sources import SourceCheck, Verify, source_check
from refgrid.errors import ArgumentError, FormatError, GroupError
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.read.array import ArrayReader, reader_of
from refgrid.scanners import Input, OnError, ScanOptions, scan_with


class RefgridBackendArray(BackendArray):
    """A lazily indexed virtual array (outer indexing: one index per axis)."""

    def __init__(self, virtual: VirtualArray, path: str,
                 storage_options: dict[str, object] | None, check: SourceCheck | None) -> None:
        self.virtual = virtual
        """(Not ``array``: xarray's helpers walk an ``array`` attribute as a wrapped array.)"""
        self.read_options = (path, storage_options, check)
        self.reader: ArrayReader | None = None
        """Made at the first read (a codec refgrid cannot decode fails the read, not the
        open) and kept for the next ones; not pickled (dask sends arrays to workers)."""
        self.shape = virtual.shape
        self.records = original_dtype(virtual.attrs, virtual.value_dtype)
        """Records refgrid stored as raw bytes come back with their fields ..."""
        self.dtype = self.records.newbyteorder("=") if self.records.fields else self.records
        """... in native byte order, as xarray expects of a backend; variable-length text
        and bytes as object arrays tagged with their element type, as netCDF4's engine
        tags them (xarray's string decoding relies on the tag)."""
        self.element = vlen_element(virtual.attrs)
        """Variable-length sequences of numbers refgrid stored as bytes, given back typed."""
        if self.element is not None:
            self.dtype = np.dtype("O", metadata={"vlen": self.element})  # as h5py tags them
        elif virtual.dtype.kind in "OT":
            self.dtype = create_vlen_dtype(str if virtual.dtype.kind == "T" else bytes)

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(
            key, self.shape, indexing.IndexingSupport.OUTER, self._read)

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "reader": None}

    def _read(self, key: tuple[int | slice | np.ndarray, ...]) -> np.ndarray:
        if self.reader is None:
            self.reader = reader_of(self.virtual, *self.read_options)
        values = self.reader.read(key)
        if self.element is not None:
            return _sequences(values, self.element)
        if values.dtype == self.dtype or values.dtype.kind == "O":
            return values
        return values.view(self.records).astype(self.dtype)


def _sequences(values: np.ndarray, element: np.dtype) -> np.ndarray:
    """Byte strings → an object array of 1-d arrays of ``element`` (native byte order)."""
    out = np.empty(values.shape, dtype=object)
    for index, raw in np.ndenumerate(values):
        out[index] = np.frombuffer(raw, dtype=element).astype(element.newbyteorder("="))
    return out


def _variable(array: VirtualArray, path: str, storage_options: dict[str, object] | None,
              check: SourceCheck | None) -> Variable:
    """One variable with the attributes and encoding xarray's netCDF4 engine gives it."""
    backend_array = RefgridBackendArray(array, path, storage_options, check)
    data = indexing.LazilyIndexedArray(backend_array)
    attrs = reader_attrs(array.attrs, records_typed=True)
    kind = array.dtype.kind
    encoding = variable_encoding(
        array.attrs, str if kind == "T" else array.dtype if kind not in "OV" else
        backend_array.dtype, array.shape)
    preferred: dict[str, int | tuple[int, ...]] = {}
    for dim, axis in zip(array.dims, array.grid.axes, strict=True):
        size = axis.regular_size
        preferred[dim] = size if size is not None else tuple(axis.logical.tolist())
    encoding["preferred_chunks"] = preferred
    if backend_array.dtype.kind == "S" and isinstance(attrs.get("_FillValue"), str):
        attrs["_FillValue"] = np.bytes_(attrs["_FillValue"].encode("utf-8"))  # as netCDF4 does
    return Variable(array.dims, data, attrs, encoding)


class OpenArgs(NamedTuple):
    """What ``open_dataset`` takes besides the input (xarray's CF decoding switches last)."""

    drop_variables: str | Iterable[str] | None = None
    group: str | None = None
    storage_options: dict[str, object] | None = None
    mask_and_scale: bool = True
    decode_times: bool = True
    decode_timedelta: bool | None = None
    use_cftime: bool | None = None
    concat_characters: bool = True
    decode_coords: bool = True
    allowed_sources: Sequence[str] | None = None
    verify_sources: Verify = True
    on_error: OnError = "raise"

    def decoding(self) -> dict[str, Any]:
        return {k: v for k, v in self._asdict().items() if k not in DATASET_ARGS}

    @property
    def dropped(self) -> tuple[str, ...]:
        """The paths of ``drop_variables``, which are named in ``group``."""
        names = [self.drop_variables] if isinstance(self.drop_variables, str) else \
            list(self.drop_variables or ())
        base = self.group.strip("/") if isinstance(self.group, str) else ""
        return tuple(f"{base}/{n}".strip("/") if isinstance(n, str) else n for n in names)


DATASET_ARGS = frozenset({"drop_variables", "group", "storage_options", "allowed_sources",
                          "verify_sources", "on_error"})


def open_groups(source: Input, args: OpenArgs, subgroups: bool) -> dict[str, Dataset]:
    """The Dataset of ``args.group`` (key ``/``) and, with ``subgroups``, of every group
    below it (``/sub``, ...), from one scan of ``source``, the variables ``drop_variables``
    names in ``group`` left unscanned (as xarray's, names it does not hold are no error)."""
    options = ScanOptions(on_error=args.on_error, dropped=args.dropped)
    scanned = scan_with(source, options, args.allowed_sources, args.storage_options or {})
    check = source_check(scanned.sources, args.storage_options, args.verify_sources)
    root = _group(scanned, args.group, source)
    base = args.group.strip("/") if args.group else ""
    nodes = {"": root} | ({path: node for path, node in root.walk()
                           if isinstance(node, VirtualGroup)} if subgroups else {})
    return {f"/{path}": _dataset(node, "/".join(p for p in (base, path) if p), args, check)
            for path, node in nodes.items()}


def _dataset(node: VirtualGroup, path: str, args: OpenArgs,
             check: SourceCheck | None) -> Dataset:
    """One group (at ``path``) as xarray decodes it, without indexes (xarray adds them
    unless asked not to: ``create_default_indexes``)."""
    prefix = f"{path}/" if path else ""
    variables = {_decode_variable_name(name): _variable(array, prefix + name,
                                                        args.storage_options, check)
                 for name, array in node.arrays.items()}
    decoded, attrs, coord_names = conventions.decode_cf_variables(
        variables, reader_attrs(node.attrs), drop_variables=args.drop_variables,
        **args.decoding())
    coords = {name: var for name, var in decoded.items()
              if name in coord_names or var.dims == (name,)}
    data = {name: var for name, var in decoded.items() if name not in coords}
    ds = Dataset(data, coords=Coordinates(coords, indexes={}), attrs=attrs)
    ds.encoding = dataset_encoding(node.attrs)
    return ds


def _group(root: VirtualGroup, group: object, source: Input) -> VirtualGroup:
    if group is not None and not isinstance(group, str):
        raise ArgumentError(f"group must be a string path, not {type(group).__name__}")
    where = os.fspath(source) if isinstance(source, str | os.PathLike) else "<references>"
    try:
        node = root[group] if group and group.strip("/") else root
    except KeyError:
        raise GroupError(f"{where}: no group {group!r}") from None
    if not isinstance(node, VirtualGroup):
        raise FormatError(where, group, "is an array, not a group")
    return node
