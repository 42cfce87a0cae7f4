"""``refgrid serve``: every reference set and Zarr v3 store under a root, served read-only as
Zarr v3 over HTTP — in its native form and as a regular grid stock zarr reads — and over
OPeNDAP (DAP2 and DAP4, :mod:`refgrid.serve.dap`) for netCDF-C's tools, so anyone can read
an archive from any language with no refgrid installed.

    app = refgrid.serve.make_app("/data/refs", allow_sources=("/data/archive",))
    refgrid.serve.run("/data/refs", port=8000)

Needs the ``serve`` extra (aiohttp).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Unpack

from refgrid.core.util import import_extra

if TYPE_CHECKING:
    from aiohttp import web

    from refgrid.serve.app import AppOptions, RunOptions


def make_app(root: str, allow_sources: tuple[str, ...] = (), **options: Unpack[AppOptions]
             ) -> web.Application:
    """The aiohttp application serving ``root`` (see :func:`refgrid.serve.app.make_app`)."""
    import_extra("aiohttp", "serve", "refgrid serve")
    from refgrid.serve.app import make_app as make

    return make(root, allow_sources, **options)


def run(root: str, host: str = "127.0.0.1", port: int = 8000, access_log: bool = True,
        announce: Callable[[str], None] | None = None, header_timeout: float = 10.0,
        **options: Unpack[RunOptions]) -> None:
    """Serve ``root`` until interrupted (see :func:`refgrid.serve.app.run`)."""
    import_extra("aiohttp", "serve", "refgrid serve")
    from refgrid.serve.app import run as serve

    serve(root, host, port, access_log, announce, header_timeout, **options)
