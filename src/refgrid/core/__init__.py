"""Foundations every part shares: the input formats' table (formats), limits on hostile input
(bounds), store key names (keys), Zarr data types and the ``_refgrid_*`` attribute
conventions (dtypes), the source files behind references (sources: filesystems, identity,
held files), text/HTML reprs (reprs) and small process helpers (util). Imports nothing of
refgrid but :mod:`refgrid.errors`."""
