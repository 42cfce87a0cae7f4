"""Which files a reference set may make refgrid read.

References are data, and data can be hostile: a reference fetched over HTTP may name
``/proc/self/environ``, ``file:///home/...`` or ``../../secret``, and reading it would hand
that file's bytes to whoever wrote the references. Every URL a reference set names is checked
against an allow-list of prefixes before anything is read. The default for references loaded
from a remote URL is that URL's own scheme and host (or bucket); for local references and
dicts, anything, unless ``allowed_sources`` says otherwise.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

import numpy as np

from refgrid.core.sources import is_local
from refgrid.errors import AccessError
from refgrid.model.manifest import Page, PagedManifest, Pages
from refgrid.model.virtual import VirtualArray, VirtualGroup


def default_allowed(references_url: str | None) -> list[str] | None:
    """The allow-list for references loaded from ``references_url`` (None: no restriction)."""
    if references_url is None or is_local(references_url):
        return None
    parts = urlsplit(references_url)
    return [f"{parts.scheme}://{parts.netloc}/"]


def normalized(url: str) -> str:
    """A URL with ``.``/``..`` segments resolved; local paths absolute, symlinks resolved."""
    if is_local(url):
        return os.path.realpath(url.removeprefix("file://"))
    parts = urlsplit(url)
    path = posixpath.normpath(parts.path) if parts.path else "/"
    query = f"?{parts.query}" if parts.query else ""
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{path}{query}"


def is_allowed(url: str, bases: Sequence[str]) -> bool:
    """Whether ``url`` lies under one of ``bases`` (prefixes already :func:`normalized`)."""
    target = normalized(url)
    return any(target == base or target.startswith(base if base.endswith("/") else base + "/")
               for base in bases)


def check_sources(group: VirtualGroup, prefixes: Sequence[str], where: str,
                  remedy: str | None = None) -> VirtualGroup:
    """Raise :class:`AccessError` for the first array whose references name a file outside
    ``prefixes``; the message ends with ``remedy``. A paged manifest's URLs are checked as
    each page loads, before any of its chunks is read: ``group`` is returned with those
    manifests checking (the others were checked here)."""
    remedy = remedy or REMEDY
    bases = [normalized(p) for p in prefixes]
    paged = {}
    for path, node in group.walk():
        if isinstance(node, VirtualArray):
            manifest = node.manifest
            if isinstance(manifest, PagedManifest):
                for url in manifest.table:  # (the pages loaded so far)
                    _check(url, bases, prefixes, where, path, remedy)
                paged[path] = replace(node, manifest=manifest.with_pages(AllowedPages(
                    manifest.pages, tuple(bases), tuple(prefixes), where, path, remedy)))
                continue
            for url in manifest.paths:
                _check(url, bases, prefixes, where, path, remedy)
    return group.with_arrays(paged) if paged else group


def check_url(url: str, prefixes: Sequence[str], where: str, path: str) -> None:
    """One URL an input names, checked before anything is asked of it (a DMR++ document's
    data file is asked its identity as the document is read)."""
    _check(url, [normalized(p) for p in prefixes], prefixes, where, path, REMEDY)


REMEDY = "pass allowed_sources=[...], or --allow-source PREFIX on the command line, to allow it"


def _check(url: str, bases: Sequence[str], prefixes: Sequence[str], where: str, path: str,
           remedy: str) -> None:
    if not is_allowed(url, bases):
        raise AccessError(where, path, f"references {url!r}, outside the allowed sources "
                          f"{list(prefixes)} ({remedy})")


@dataclass(frozen=True)
class AllowedPages:
    """A paged manifest's pages, each page's URLs checked against the allow-list as it
    loads (a 10^8-chunk archive is not read whole to check it)."""

    pages: Pages
    bases: tuple[str, ...]
    prefixes: tuple[str, ...]
    where: str
    path: str
    remedy: str

    @property
    def size(self) -> int:
        return self.pages.size

    def load(self, n: int, rows: int) -> Page:
        page = self.pages.load(n, rows)
        ids = np.asarray(page.ids)
        for k in np.unique(ids[ids >= 0]).tolist():
            _check(page.urls[k], self.bases, self.prefixes, self.where, self.path,
                   self.remedy)
        return page
