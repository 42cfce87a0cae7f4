"""Codecs: the HDF5 filter table and codec JSON (filters), the byte-level codecs and one
chunk's pipeline (pipeline), and refgrid's HDF5 codecs registered for other readers: Zarr v3
codec classes (zarr_v3) and numcodecs classes for Zarr v2 readers (numcodecs_v2)."""
