"""refgrid's record of an Icechunk repository a batch writes, in both directions: the snapshot
the batch committed last, the keys of the documents it holds and refgrid's section of it —
the sources and bookkeeping, which a commit does not carry — kept in the work directory
(``<output>.refgrid.json``), so that planning the next append reads neither every reference
nor a commit's metadata (:class:`IcechunkRecord`); and the archive an append is planned on,
its documents read from that snapshot (:class:`IcechunkState`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from refgrid.core.sources import SourceIdentity
from refgrid.model.virtual import VirtualGroup
from refgrid.model.zarr_json import bookkeeping, documents
from refgrid.refs.section import ATTRIBUTES_KEY, SOURCES_KEY, Section

SNAPSHOT_KEY = "snapshot"
DOCUMENTS_KEY = "documents"


@dataclass(frozen=True)
class IcechunkRecord:
    """The record as stored: ``{"snapshot": id, "sources": {url: identity}, "documents":
    [key, ...], "attributes": {node: bookkeeping}}`` (no ``attributes`` where there are
    none)."""

    snapshot: str
    section: Section
    """The sources (all of them: the record is read whole) and the bookkeeping."""
    documents: tuple[str, ...]
    """The keys of the documents the snapshot holds."""

    @classmethod
    def from_bytes(cls, data: bytes) -> IcechunkRecord:
        """The record as read (a ``ValueError`` where it is not one)."""
        kept = json.loads(data)
        if not isinstance(kept, dict) or not isinstance(kept.get(SNAPSHOT_KEY), str):
            raise ValueError("no snapshot recorded")
        keys = kept.get(DOCUMENTS_KEY)
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise ValueError(f"{DOCUMENTS_KEY} is not a list of keys: {keys!r:.80}")
        return cls(kept[SNAPSHOT_KEY], Section.from_dict(kept), tuple(keys))

    @classmethod
    def of_group(cls, snapshot: str, group: VirtualGroup) -> IcechunkRecord:
        """The record of ``snapshot``, a whole write of ``group``."""
        return cls(snapshot, Section(group.sources, bookkeeping(group)),
                   tuple(documents(group)))

    def to_bytes(self) -> bytes:
        attributes = self.section.attributes
        return json.dumps({SNAPSHOT_KEY: self.snapshot, SOURCES_KEY: dict(self.section.sources
                                                                          or {}),
                           DOCUMENTS_KEY: list(self.documents),
                           **({ATTRIBUTES_KEY: attributes} if attributes else {})}).encode()


@dataclass(frozen=True)
class IcechunkState:
    """What an Icechunk output's append is planned on: the snapshot this batch committed
    last, its documents (read from it) and refgrid's section of it (from its
    :class:`IcechunkRecord`)."""

    section: Section
    metadata: Mapping[str, Mapping[str, Any]]
    """Document key (``tas/zarr.json``) → the document."""
    snapshot: str

    def committed(self, snapshot: str, sources: Mapping[str, SourceIdentity],
                  docs: Iterable[str]) -> IcechunkRecord:
        """The record of ``snapshot``, an append to this state: its ``sources`` added, its
        documents ``docs`` (keys)."""
        return IcechunkRecord(snapshot, Section({**self.section.identities(), **sources},
                                                self.section.attributes), tuple(docs))
