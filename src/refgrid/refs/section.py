"""refgrid's own section of a reference set — JSON's top-level ``refgrid`` key, parquet's
``.zmetadata`` key of the same name — which other readers ignore: the sources' identities,
the ``_refgrid_*`` bookkeeping kept out of the Zarr documents, and the sidecar directory of
rewritten chunks, whose files are named relative to it (``{{sidecar}}/<hash>/tas/c/3/0``), so
that references and sidecar copied or moved together still read.

:class:`Section` is the section typed, in both directions (``from_dict``/``to_dict``, as
zarr-python's metadata classes); parquet references add their record files' keys
(:class:`refgrid.refs.parquet.ParquetSection`). What a reader cannot use is read as it always
was: left out (identities of other shapes, a sidecar name that is no name), never an error —
the section only refines what refgrid shows and checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from refgrid.core.sources import SourceIdentity, valid_identity
from refgrid.core.typed import JSONObject
from refgrid.core.util import gc_paused
from refgrid.model.virtual import VirtualGroup
from refgrid.model.zarr_json import bookkeeping

SECTION_KEY = "refgrid"
"""Top-level key of JSON references (and of parquet's ``.zmetadata``) holding the section:
``{"sources": {url: identity}, "attributes": {node: {name: value}}, "sidecar":
"refs.json.chunks"}``. Its first bytes in a file tell the engine the file is refgrid's
(:data:`refgrid.read.backend.MARKER`)."""
ATTRIBUTES_KEY = "attributes"
"""The section's key of the ``_refgrid_*`` bookkeeping by node path (also the key of a served
native view's ``refgrid.json``)."""
SOURCES_KEY = "sources"
SIDECAR_KEY = "sidecar"
SIDECAR_TEMPLATE = "{{sidecar}}"
"""How references name a file in their sidecar directory: ``{{sidecar}}/<hash>/tas/c/3/0``, a
kerchunk template (``templates["sidecar"]``, the directory where it was written, for fsspec)
that refgrid's readers resolve beside the references wherever they now lie, so references
and sidecar copied or moved together still read."""
_USUAL = frozenset({"size", "mtime"})


@dataclass(frozen=True)
class Section:
    """refgrid's section of a reference set, as stored."""

    sources: Mapping[str, SourceIdentity] | None = None
    """The sources' identities by URL as the references name them (the sidecar's files by
    :data:`SIDECAR_TEMPLATE`); None: kept elsewhere (parquet's source record files)."""
    attributes: object = None
    """The ``_refgrid_*`` bookkeeping by node path, as stored (what is not a mapping of
    mappings is ignored as it is put back: :func:`refgrid.model.zarr_json.with_bookkeeping`)."""
    sidecar: str | None = None
    """The name of the sidecar directory beside the references (a plain name, or None)."""

    @staticmethod
    def of(container: object) -> Section:
        """The section of a reference set (or ``.zmetadata``), as parsed; empty if none."""
        return Section.from_dict(raw_section(container))

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Section:
        """The section as stored: identities of other shapes and a sidecar name that is no
        plain name left out."""
        name = data.get(SIDECAR_KEY)
        return cls(valid_identities(data[SOURCES_KEY]) if SOURCES_KEY in data else None,
                   data.get(ATTRIBUTES_KEY),
                   name if isinstance(name, str) and name and "/" not in name and
                   name not in (".", "..") else None)

    def to_dict(self) -> JSONObject:
        """The section as written (empty parts left out): the sources, the bookkeeping, the
        sidecar's name, in that order."""
        out: dict[str, object] = {}
        if self.sources:
            out[SOURCES_KEY] = dict(self.sources)
        if self.attributes:
            out[ATTRIBUTES_KEY] = self.attributes
        if self.sidecar is not None:
            out[SIDECAR_KEY] = self.sidecar
        # identities (TypedDicts), attribute values as the documents hold them: all JSON
        return cast(JSONObject, out)

    @staticmethod
    def of_group(group: VirtualGroup, portable: Portable, *, sources: bool = True) -> Section:
        """The section written for ``group``; ``sources=False``: without the sources'
        identities (parquet keeps them in record files)."""
        return Section({portable(url): identity for url, identity in group.sources.items()}
                       if group.sources and sources else None, bookkeeping(group) or None,
                       portable.directory.name if portable.directory is not None else None)

    def sidecar_directory(self, url: str) -> str | None:
        """Where the sidecar lies now: beside ``url``, the references (None: no sidecar, or
        references that lie nowhere, such as a dict)."""
        if self.sidecar is None or url.startswith("<"):
            return None
        parent = url.rstrip("/").rsplit("/", 1)[0] if "/" in url.rstrip("/") else "."
        return f"{parent}/{self.sidecar}"

    def identities(self, sidecar: str | None = None) -> Mapping[str, SourceIdentity]:
        """The sources' identities, the sidecar's files named where it lies now (``sidecar``,
        :meth:`sidecar_directory`)."""
        if not self.sources:
            return {}
        if sidecar is None:
            return self.sources
        return {in_sidecar(url, sidecar): identity for url, identity in self.sources.items()}


def raw_section(container: object) -> Mapping[str, object]:
    """refgrid's section of a reference set (or ``.zmetadata``) as parsed, empty if none."""
    found = container.get(SECTION_KEY) if isinstance(container, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def valid_identities(value: object) -> dict[str, SourceIdentity]:
    """A stored table of identities, kept only where it has the expected shape
    (:func:`~refgrid.core.sources.valid_identity`; the entries copied, never shared with the
    parsed container). A table of 10^5 entries is read in one pass: the usual entry — a dict,
    just parsed, of a size and a modification time — is copied as it is."""
    if not isinstance(value, Mapping):
        return {}
    out: dict[str, SourceIdentity] = {}
    with gc_paused():  # 10^5 small dicts: the collector would walk them again and again
        for url, entry in value.items():
            if type(entry) is dict and entry.keys() <= _USUAL and type(url) is str and \
                    type(entry.get("size")) is int and 0 <= entry["size"] < 2**63 and \
                    type(entry.get("mtime", 0.0)) is float:
                kept: SourceIdentity | None = cast(SourceIdentity, entry.copy())
            else:
                kept = valid_identity(entry) if isinstance(url, str) else None
            if kept is not None:
                out[url] = kept
    return out


def stored_identities(container: object, sidecar: str | None = None
                      ) -> Mapping[str, SourceIdentity]:
    """The sources' identities stored in a reference set's section (or ``.zmetadata``'s),
    the sidecar's files named where it lies now (``sidecar``)."""
    return Section.of(container).identities(sidecar)


def in_sidecar(url: str, directory: str | None) -> str:
    """``url`` with the sidecar template resolved to ``directory`` (unchanged if none)."""
    if directory is None or not url.startswith(SIDECAR_TEMPLATE):
        return url
    return directory + url[len(SIDECAR_TEMPLATE):]


class Portable:
    """How references name URLs: files in the sidecar ``directory`` (None: no sidecar)
    relative to it, by :data:`SIDECAR_TEMPLATE`; every other URL as it is."""

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
