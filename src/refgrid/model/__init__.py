"""The in-memory model: :class:`~refgrid.model.virtual.VirtualArray` and
:class:`~refgrid.model.virtual.VirtualGroup` (virtual, with the scan report), the chunk
manifest (manifest) and ``zarr.json`` documents to and from the model (zarr_json)."""
