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
from urllib.parse import urlsplit

from refgrid.core.sources import is_local
from refgrid.errors import AccessError
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
                  remedy: str = "pass allowed_sources=[...], or --allow-source PREFIX on the "
                                "command line, to allow it") -> None:
    """Raise :class:`AccessError` for the first array whose references name a file outside
    ``prefixes``; the message ends with ``remedy``."""
    bases = [normalized(p) for p in prefixes]
    for path, node in group.walk():
        if isinstance(node, VirtualArray):
            for url in node.manifest.paths:
                if not is_allowed(url, bases):
                    raise AccessError(where, path, f"references {url!r}, outside the allowed "
                                      f"sources {list(prefixes)} ({remedy})")
