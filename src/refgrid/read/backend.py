"""xarray backend engine ``"refgrid"``: any refgrid input → Dataset, lazily, native chunks.

    xr.open_dataset("refs.json", engine="refgrid", chunks={})

Opens whatever :func:`refgrid.scan` accepts (reference sets, Zarr v3 stores, HDF5/NetCDF
files) and reads any grid refgrid writes (rectilinear with encoded extents included).

xarray imports every installed engine's entry point whenever it opens anything, so this
module holds only the entry point; what it opens with (:mod:`refgrid.read.dataset`) is
imported on the first open.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from xarray.backends import BackendEntrypoint

if TYPE_CHECKING:
    from xarray import Dataset, DataTree

    from refgrid.core.sources import Verify
    from refgrid.scanners import Input, OnError


class RefgridBackendEntrypoint(BackendEntrypoint):
    description = "Open refgrid/kerchunk references (Zarr v3, rectilinear grids included)"
    url = "https://github.com/refgrid/refgrid"
    supports_groups = True
    open_dataset_parameters = ("filename_or_obj", "drop_variables", "group", "storage_options",
                               "mask_and_scale", "decode_times", "decode_timedelta",
                               "use_cftime", "concat_characters", "decode_coords",
                               "auto_complex", "allowed_sources", "verify_sources",
                               "on_error")

    def guess_can_open(self, filename_or_obj: object) -> bool:
        """refgrid's own outputs, by their first bytes (JSON references and parquet's
        ``.zmetadata`` begin with refgrid's section): ``xr.open_dataset("refs.json")`` needs
        no ``engine=``. Other references are JSON that many engines may claim: those are
        opened by name."""
        return owned_output(filename_or_obj)

    def open_dataset(  # type: ignore[override]
        self,
        filename_or_obj: Input,
        *,
        drop_variables: str | Iterable[str] | None = None,
        group: str | None = None,
        storage_options: dict[str, object] | None = None,
        mask_and_scale: bool = True,
        decode_times: bool = True,
        decode_timedelta: bool | None = None,
        use_cftime: bool | None = None,
        concat_characters: bool = True,
        decode_coords: bool = True,
        auto_complex: bool | None = None,
        allowed_sources: Sequence[str] | None = None,
        verify_sources: Verify = True,
        on_error: OnError = "raise",
    ) -> Dataset:
        """``auto_complex`` is accepted for netCDF4-engine compatibility: refgrid always
        reads HDF5 complex compounds (``r``/``i`` members) as complex numbers.
        ``allowed_sources``: prefixes the files named by references must lie under (see
        :func:`refgrid.scan`). ``verify_sources``: check each source file's size,
        modification time or ETag against the references' record before reading it (once
        per file), and every local read after it (the file read still the one checked), so
        a changed source is an error rather than other data; ``"strict"`` also notices a
        local rewrite whose modification time was put back (the change time, from the
        first read on; a ``chmod`` counts as a change). ``on_error``: as
        :func:`refgrid.scan` takes it — ``"report"`` leaves out a variable refgrid cannot
        read (``refgrid.scan(x, on_error="report").report`` says why) rather than failing
        the open. ``drop_variables`` are left unscanned, so a variable refgrid cannot read
        stops nothing once dropped."""
        from refgrid.read.dataset import OpenArgs, open_groups

        args = OpenArgs(drop_variables, group, storage_options, mask_and_scale, decode_times,
                        decode_timedelta, use_cftime, concat_characters, decode_coords,
                        allowed_sources, verify_sources, on_error)
        return open_groups(filename_or_obj, args, subgroups=False)["/"]

    def open_groups_as_dict(  # type: ignore[override]
        self, filename_or_obj: Input, **kwargs: Any
    ) -> dict[str, Dataset]:
        """Every group below ``group`` as a Dataset, keyed ``/``, ``/sub``, ... — from one
        parse of the input (``kwargs``: those of :meth:`open_dataset`)."""
        from refgrid.read.dataset import OpenArgs, open_groups

        return open_groups(filename_or_obj, OpenArgs(**kwargs), subgroups=True)

    def open_datatree(self, filename_or_obj: Input, **kwargs: Any) -> DataTree:  # type: ignore[override]
        from xarray import DataTree

        return DataTree.from_dict(self.open_groups_as_dict(filename_or_obj, **kwargs))


MARKER = b'{"refgrid":'
"""How refgrid's JSON references and parquet ``.zmetadata`` begin."""


def owned_output(target: object) -> bool:
    """Whether ``target`` is a local path to references refgrid wrote (a read of a few
    bytes; nothing remote is asked, nothing imported)."""
    import os

    if not isinstance(target, str | os.PathLike):
        return False
    path = os.fspath(target)
    if "://" in path and not path.startswith("file://"):
        return False
    path = path.removeprefix("file://")
    if os.path.isdir(path):
        path = os.path.join(path, ".zmetadata")
    try:
        with open(path, "rb") as f:
            return f.read(len(MARKER)) == MARKER
    except OSError:
        return False
