"""OPeNDAP for the served datasets: DAP2 and DAP4, so netCDF-C's tools and pydap read them.

The same opened dataset as the Zarr endpoints, described once in DAP's terms
(:mod:`.model`), its values read through the native view's readers, a block at a time
(:mod:`.blocks`), for the projections a constraint expression names (:mod:`.constraint`),
encoded by :mod:`.dap2` and :mod:`.dap4` and streamed by :mod:`.responses`. Needs the
``serve`` extra, as the rest of the service.
"""
