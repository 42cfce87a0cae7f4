"""Names for dimensions a file does not name, as netCDF-C names them (``phony_dim_N``).

HDF5 datasets without dimension scales, and DMR++ ``<Dim size=…/>`` entries, have axes with
a length only; netCDF-C (and so netCDF4-python and xarray) names them one per length, in the
order met, with a new name when one variable repeats a length. Both the HDF5 and the DMR++
scanner name them so, through one :class:`PhonyNames` per file.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PhonyNames:
    by_length: dict[int, list[str]] = field(default_factory=dict)

    def name(self, length: int, taken: list[str]) -> str:
        """The name of an axis of ``length`` for a variable whose other axes are ``taken``."""
        names = self.by_length.setdefault(length, [])
        for name in names:
            if name not in taken:
                return name
        name = f"phony_dim_{sum(len(v) for v in self.by_length.values())}"
        names.append(name)
        return name
