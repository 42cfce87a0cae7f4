"""How a scan treats what plain references cannot express: one options object for every
format's scanner (``(source, options) -> VirtualGroup``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

OnError = Literal["raise", "report"]


@dataclass(frozen=True)
class ScanOptions:
    """Options every scanner receives (each format uses those that apply to it)."""

    on_error: OnError = "raise"
    """``"raise"``: stop at the first variable that cannot be scanned; ``"report"``: record
    it in ``VirtualGroup.report`` and go on."""
    inline_threshold: int = 0
    """Chunks stored in fewer bytes than this are inlined (verbatim) instead of referenced."""
    fallback_inline_limit: int = 64 * 2**20
    """Largest decoded size of a variable whose filters have no codec that is inlined."""
    contiguous_chunk_bytes: int = 4 * 2**20
    """Contiguous data is cut into virtual chunks of about this size along its first axis."""
    allowed: tuple[str, ...] | None = None
    """Prefixes the files an input names must lie under (None: any), checked by scanners
    that ask those files anything while scanning (DMR++: the data file's identity)."""
    data_url: str | None = None
    """DMR++ input: where the granule is, where the document names it by a relative path or
    Hyrax's placeholder (a URL, or a template whose ``{name}`` is the document's name
    without ``.dmrpp``); default: the file beside the document."""
    dropped: tuple[str, ...] = ()
    """Variables and groups (paths) not scanned — ``drop_variables`` —, each variable noted
    in the report as ``dropped`` (for :func:`~refgrid.model.choose.choose` to check its
    name and take the note off). The HDF5 and DMR++ scanners still name a dropped
    variable's unnamed dimensions, so the others' ``phony_dim_N`` stay as netCDF-C names
    them; other formats drop after reading their (cheap) metadata."""

    def drops(self, path: str) -> bool:
        """Whether ``path`` is dropped: named, or in a group named."""
        return any(isinstance(n, str) and n.strip("/") and (  # (others: choose refuses them)
            path == n.strip("/") or path.startswith(n.strip("/") + "/")) for n in self.dropped)
