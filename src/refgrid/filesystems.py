"""fsspec filesystems for URLs, with the optional ``remote`` extra named when it is missing.

Local files need nothing beyond fsspec; ``s3://`` needs s3fs and ``http(s)://`` aiohttp,
which ``pip install 'refgrid[remote]'`` brings. fsspec's own message for a missing protocol
package does not say how to get it through refgrid.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from refgrid.errors import MissingExtraError


def filesystem(url: str, storage_options: Mapping[str, Any] | None = None
               ) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem serving ``url`` and the path within it."""
    try:
        return url_to_fs(url, **(storage_options or {}))
    except ImportError as e:
        protocol = url.split("://", 1)[0] if "://" in url else "file"
        raise MissingExtraError("remote", f"reading {protocol}:// URLs ({url})",
                                e.name or str(e)) from None
