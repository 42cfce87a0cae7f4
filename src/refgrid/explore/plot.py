"""Pictures of a virtual array with matplotlib (the ``plot`` extra): how its chunks are
sized, where along time its files and padded chunks fall, and what reading a time series or
a map costs in chunks and bytes.

Every function draws into ``ax`` (a new figure when None) and returns the Axes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from refgrid.core.util import import_extra
from refgrid.errors import ArgumentError
from refgrid.grid.svg import CHUNK_COLOUR, EDGE_COLOUR, PADDED_COLOUR
from refgrid.model.manifest import MISSING
from refgrid.model.virtual import VirtualArray

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def _axes(ax: Axes | None, size: tuple[float, float]) -> Axes:
    if ax is not None:
        return ax
    pyplot = import_extra("matplotlib.pyplot", "plot", "refgrid.explore.plot")
    return pyplot.subplots(figsize=size, layout="constrained")[1]


def _dim(array: VirtualArray, dim: str | None) -> int:
    if dim is None:
        if not array.dims:
            raise ArgumentError(f"array {array.name!r} is a scalar: it has no chunks to plot")
        return 0
    if dim not in array.dims:
        raise ArgumentError(f"array {array.name!r} has no dimension {dim!r} (its dimensions: "
                            f"{', '.join(array.dims)})")
    return array.dims.index(dim)


def chunk_lengths(array: VirtualArray, dim: str | None = None,
                  ax: Axes | None = None) -> Axes:
    """A histogram of the chunk lengths along ``dim`` (default: the first dimension)."""
    d = _dim(array, dim)
    axis = array.grid.axes[d]
    ax = _axes(ax, (6, 3))
    lengths, counts = np.unique(axis.logical, return_counts=True)
    ax.bar(lengths, counts, width=0.8, color=CHUNK_COLOUR, edgecolor=EDGE_COLOUR)
    ax.set_xlabel(f"chunk length along {array.dims[d]}")
    ax.set_ylabel("chunks")
    ax.set_title(f"{array.name}: the lengths of its {axis.nchunks:,} chunks along "
                 f"{array.dims[d]}")
    return ax


def file_boundaries(array: VirtualArray, dim: int = 0) -> np.ndarray:
    """Where along ``dim`` the source file changes (element indices), from the manifest."""
    index = [0] * array.grid.ndim
    index[dim] = slice(None)  # type: ignore[call-overload]
    files = array.manifest.path_id[tuple(index)]
    stored = files != MISSING
    change = np.flatnonzero((files[1:] != files[:-1]) & stored[1:] & stored[:-1]) + 1
    return array.grid.axes[dim].bounds[change]


def time_axis(array: VirtualArray, dim: str | None = None, ax: Axes | None = None) -> Axes:
    """The chunks along ``dim`` (default: the first dimension) as a strip: chunk edges,
    source file boundaries (dashed) and padded chunks (marked)."""
    d = _dim(array, dim)
    axis = array.grid.axes[d]
    ax = _axes(ax, (9, 2.2))
    ax.broken_barh([(0, axis.length)], (0, 1), facecolors=CHUNK_COLOUR)
    ax.vlines(axis.bounds[1:-1], 0, 1, colors=EDGE_COLOUR, linewidth=0.6, label="chunk edge")
    files = file_boundaries(array, d)
    if len(files):
        ax.vlines(files, -0.35, 1.35, colors="black", linestyles="dashed", linewidth=1.2,
                  label=f"file boundary ({len(files) + 1} files)")
    padded = np.flatnonzero(axis.encoded[:-1] != axis.logical[:-1])
    if len(padded):
        ax.broken_barh([(int(axis.bounds[p]), int(axis.logical[p])) for p in padded],
                       (-0.3, 0.25), facecolors=PADDED_COLOUR,
                       label=f"padded chunk ({len(padded)})")
    ax.set_xlim(0, axis.length)
    ax.set_ylim(-0.45, 1.45)
    ax.set_yticks([])
    ax.set_xlabel(f"{array.dims[d]} index")
    ax.set_title(f"{array.name}: where its chunks and files fall along {array.dims[d]}")
    # beside the strip, not over it
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small",
              frameon=False)
    return ax


def selection_cost(array: VirtualArray, ax: Axes | None = None) -> Axes:
    """Chunks and stored bytes a time series (one point, the whole first dimension) and a
    map (one step of the first dimension, the rest whole) touch, side by side."""
    if array.grid.ndim < 2:
        raise ArgumentError(f"array {array.name!r} has {array.grid.ndim} dimension(s): a time "
                            "series and a map need two or more")
    costs = {"time series": selection_numbers(array, series=True),
             "map": selection_numbers(array, series=False)}
    ax = _axes(ax, (6, 3))
    names = list(costs)
    chunks = [costs[n][0] for n in names]
    megabytes = [costs[n][1] / 1e6 for n in names]
    x = np.arange(len(names))
    bars = ax.bar(x - 0.2, chunks, 0.4, color=CHUNK_COLOUR, edgecolor=EDGE_COLOUR,
                  label="chunks")
    ax.bar_label(bars, labels=[f"{n:,}" for n in chunks], padding=2, fontsize="small")
    ax.set_ylabel("chunks read")
    ax.margins(y=0.15)  # room for the labels
    twin = ax.twinx()
    bars = twin.bar(x + 0.2, megabytes, 0.4, color=PADDED_COLOUR, label="MB read (stored)")
    twin.bar_label(bars, labels=[f"{m:.3g} MB" for m in megabytes], padding=2,
                   fontsize="small")
    twin.set_ylabel("MB read (stored)")
    twin.margins(y=0.15)
    ax.set_xticks(x, names)
    ax.set_title(f"{array.name}: the cost of a selection")
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles, ["chunks", "MB read (stored)"], loc="upper right", fontsize="small",
              frameon=False)
    return ax


def selection_numbers(array: VirtualArray, series: bool) -> tuple[int, int]:
    """``(chunks, stored bytes)`` of a time series at the first point (``series``) or a map
    at the first step."""
    index: tuple[slice | int, ...] = (slice(None),) + (0,) * (array.grid.ndim - 1) if series else \
        (0,) + (slice(None),) * (array.grid.ndim - 1)
    ids = array.manifest.path_id[index]
    lengths = array.manifest.length[index]
    stored = (ids >= 0) & ~array.manifest.unsized[index]
    return int(ids.size), int(lengths[stored].sum())
