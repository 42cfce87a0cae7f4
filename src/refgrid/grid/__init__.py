"""The chunk grid: :class:`~refgrid.grid.rectilinear.RectilinearGrid` (logical and encoded
chunk lengths per dimension), its JSON forms (json_forms: ``rectilinear``, ZEP0003
``rectangular``, ``regular``), selections (selection) and its SVG picture (svg). It knows
nothing about files."""
