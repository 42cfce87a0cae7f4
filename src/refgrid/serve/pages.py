"""The HTML pages of the service: the list of datasets at ``/`` and one page per dataset, with
its arrays, their chunk pictures and the lines that open each view from Python.

Directory listings of the views (``/<name>/native/tas/``) are plain link lists, the form
fsspec's HTTP filesystem reads as a directory, so a client can list a store as it would a
static file server's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from refgrid.core.reprs import (
    array_summary,
    files_text,
    group_summary,
    size,
    unusual_chunks,
)
from refgrid.core.sources import source_count
from refgrid.model.virtual import VirtualArray
from refgrid.serve.catalog import Dataset, Entry

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem auto;max-width:62rem;color:#1b1b1b}
h1{font-size:1.4rem}h2{font-size:1.15rem;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0}td,th{padding:.25rem .6rem;text-align:left;
border-bottom:1px solid #ddd;vertical-align:top}th{background:#f3f3f3}
pre{background:#f6f8fa;padding:.6rem;overflow-x:auto}.error{color:#a40000}
code{font-size:.9em}figure{margin:.5rem 0 1rem}
"""


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style></head>"
            f"<body>{body}</body></html>")


@dataclass(frozen=True)
class Unavailable:
    """A dataset that cannot be served: the status its endpoints answer, and why."""

    status: int
    reason: str

    def html(self) -> str:
        return (f'<span class="error">unavailable ({self.status}): {escape(self.reason)}'
                "</span>")


def index_page(entries: Sequence[Entry], opened: dict[str, Dataset | Unavailable]) -> str:
    """``/``: every dataset, with its arrays where it has been opened (or why it cannot be)."""
    rows = []
    for entry in entries:
        name = escape(entry.name)
        state = opened.get(entry.name)
        if isinstance(state, Unavailable):
            detail = state.html()
        elif state is not None:
            summary = group_summary(state.group)
            arrays = summary["arrays"]
            dims = sorted({f"{d}: {n}" for a in arrays.values()
                           for d, n in zip(a["dims"], a["shape"], strict=True)})
            detail = (f"{len(arrays)} arrays ({escape(', '.join(arrays))})<br>dims "
                      f"{escape(', '.join(dims))}<br>{size(summary['bytes'])} from "
                      f"{files_text(summary['sources'])}")
        else:
            detail = "not opened (follow the link)"
        rows.append(f'<tr><td><a href="/{name}/">{name}</a></td><td>{entry.kind}</td>'
                    f"<td>{detail}</td></tr>")
    table = ("<table><tr><th>dataset</th><th>references</th><th>contents</th></tr>"
             + "".join(rows) + "</table>") if rows else "<p>No datasets under the root.</p>"
    return _page("refgrid serve", "<h1>refgrid serve</h1><p>Virtual datasets served as Zarr "
                 "v3: <code>/&lt;name&gt;/native/</code> (the dataset as it is) and "
                 "<code>/&lt;name&gt;/regular/</code> (a regular grid stock zarr reads); "
                 "and over OPeNDAP at <code>/dap/&lt;name&gt;</code> (DAP2 and DAP4, for "
                 f"netCDF-C's tools and pydap).</p>{table}")


def dataset_page(dataset: Dataset, base: str) -> str:
    """``/<name>/``: the dataset's arrays, their chunk pictures and how to open each view."""
    name = dataset.entry.name
    url = f"{base}/{name}"
    parts = [f"<h1>{escape(name)}</h1>",
             f"<p>{escape(dataset.entry.kind)} references · "
             f"{files_text(source_count(dataset.group.sources))} · "
             f"<a href=\"/\">all datasets</a></p>",
             "<h2>Open it</h2>",
             "<p>With stock zarr / xarray (the regular view):</p>",
             f"<pre>import fsspec, xarray as xr\nds = xr.open_dataset(fsspec.get_mapper("
             f"\"{escape(url)}/regular\"), engine=\"zarr\")\n# other chunks: "
             f"\"{escape(url)}/regular;chunks=time:30\"</pre>",
             "<p>The dataset as it is (rectilinear grids, native chunks), with zarr &ge; 3.2 "
             "(Python &ge; 3.12) or with refgrid:</p>",
             "<pre>import zarr\nzarr.config.set({\"array.rectilinear_chunks\": True})\n"
             f"ds = xr.open_zarr(\"{escape(url)}/native\")\n"
             f"ds = xr.open_dataset(\"{escape(url)}/native\", engine=\"refgrid\")</pre>",
             "<p>Over OPeNDAP, for netCDF-C's tools (ncdump, NCO, MATLAB, R, IDL, Panoply) "
             f"and pydap: <a href=\"/dap/{escape(name)}\"><code>{escape(base)}/dap/"
             f"{escape(name)}</code></a> (DAP2; DAP4 with <code>#mode=dap4</code>)</p>",
             f"<pre>ncdump -h \"{escape(base)}/dap/{escape(name)}\"\n"
             f"ds = xr.open_dataset(\"{escape(base)}/dap/{escape(name)}\", "
             "engine=\"netcdf4\")</pre>",
             "<h2>Arrays</h2>",
             "<table><tr><th>array</th><th>dims &times; shape</th><th>dtype</th><th>chunks</th>"
             "<th>size</th><th>stored</th></tr>"]
    figures = []
    for path, array in dataset.group.walk():
        if not isinstance(array, VirtualArray):
            continue
        s = array_summary(array)
        shape = " &times; ".join(f"{escape(d)} {n:,}"
                                 for d, n in zip(s["dims"], s["shape"], strict=True))
        kind = ", ".join([s["grid"], *unusual_chunks(s)])
        parts.append(f"<tr><td><code>{escape(path)}</code></td><td>{shape or 'scalar'}"
                     f"</td><td>{escape(s['dtype'])}</td><td>{s['chunks']:,} ({kind})</td>"
                     f"<td>{size(s['bytes'])}</td><td>{size(s['referenced_bytes'])} "
                     f"referenced, {size(s['inline_bytes'])} inline</td></tr>")
        figures.append(f"<figure>{array.grid.svg(array.dims, path)}</figure>")
    parts.append("</table><h2>Chunk grids</h2>")
    parts.extend(figures)
    return _page(f"{name} · refgrid serve", "".join(parts))


def unavailable_page(entry: Entry, unavailable: Unavailable) -> str:
    """``/<name>/`` of a dataset that cannot be served: why, as its endpoints answer."""
    name = escape(entry.name)
    return _page(f"{entry.name} · refgrid serve", (
        f"<h1>{name}</h1><p>{escape(entry.kind)} references · <a href=\"/\">all datasets"
        f"</a></p><p>{unavailable.html()}</p>"))


def listing_page(title: str, prefix: str, names: Sequence[str]) -> str:
    """A directory of a view: links to ``prefix + name`` (absolute paths)."""
    links = "".join(f'<li><a href="{escape(prefix + n, quote=True)}">{escape(n)}</a></li>'
                    for n in names)
    return _page(title, f"<h1>{escape(title)}</h1><ul>{links}</ul>")
