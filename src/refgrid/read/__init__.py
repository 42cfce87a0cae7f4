"""Reading: the xarray engine (backend, light: xarray imports it on every open; dataset),
the regular-grid fsspec mapper (mapper, view_chunks), and the reader they share (array:
selection → boxes → fetch → decode → assemble; decode; fetch: coalesced byte ranges)."""
