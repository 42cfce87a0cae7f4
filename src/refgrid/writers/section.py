"""refgrid's own section of a reference set (JSON's top-level ``refgrid`` key, parquet's
``.zmetadata`` key of the same name), which other readers ignore: the sources' identities,
the ``_refgrid_*`` bookkeeping kept out of the Zarr documents, and the sidecar directory of
rewritten chunks — whose files are named relative to it (``{{sidecar}}/<hash>/tas/c/3/0``), so
references and sidecar copied or moved together still read (:mod:`refgrid.core.sources`)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from refgrid.core.sources import ATTRIBUTES_KEY, SIDECAR_KEY, SIDECAR_TEMPLATE
from refgrid.core.typed import JSONObject
from refgrid.model.virtual import VirtualGroup
from refgrid.model.zarr_json import bookkeeping


class Portable:
    """Names of files in the sidecar ``directory`` (None: no sidecar) written relative to
    it; every other URL as it is."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self.prefix = f"{directory.resolve()}/" if directory is not None else None

    def __call__(self, url: str) -> str:
        if self.prefix is not None and url.startswith(self.prefix):
            return f"{SIDECAR_TEMPLATE}/{url[len(self.prefix):]}"
        return url

    @property
    def template(self) -> dict[str, str]:
        """The kerchunk template fsspec expands (where the sidecar was written)."""
        if self.directory is None:
            return {}
        return {SIDECAR_TEMPLATE.strip("{}"): str(self.directory.resolve())}


def section(group: VirtualGroup, portable: Portable, *, sources: bool = True,
            **more: object) -> JSONObject:
    """The section for ``group`` (empty parts left out); ``sources=False``: without the
    sources' identities (parquet keeps them in record files); ``more``: other JSON values
    (the parquet writer's record digests)."""
    out: dict[str, object] = {}
    if group.sources and sources:
        out["sources"] = {portable(url): identity for url, identity in group.sources.items()}
    kept = bookkeeping(group)
    if kept:
        out[ATTRIBUTES_KEY] = kept
    if portable.directory is not None:
        out[SIDECAR_KEY] = portable.directory.name
    # identities (TypedDicts), attribute values as the documents hold them: all JSON
    return cast(JSONObject, {**out, **more})
