"""How an array in segments (:mod:`.segments`) is shown, and how parts join in segments.

A combine of files that store a variable in other ways gives it a *presentation* — the one
encoding every reader sees — chosen as xarray's ``open_mfdataset`` would see the files:

* **stored**: the segments differ only in how bytes are stored (byte order, codecs, a storage
  fill) and every decoding attribute agrees. The values are the stored values, in their
  native type; the attributes (packing included) are the files'.
* **decoded**: packing, fill markers or the type differ. Each segment is masked and scaled
  by xarray's own decoder (:func:`refgrid.core.cf.mask_and_scale`), in the type it gives for
  that file, and the values are shown in the type those promote to (float32 beside float64
  is float64, as ``xr.concat`` makes it), without packing attributes — bit for bit what
  xarray reads from each file.

Reading is :mod:`refgrid.read.segmented`'s; the combine (:mod:`refgrid.combining.concat`) and
an append (:mod:`refgrid.refs.growth`) decide the presentation here, alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from refgrid.codecs.filters import plain_codec
from refgrid.core.cf import PACKING_ATTRS, mask_and_scale
from refgrid.core.dtypes import ATTRIBUTE_TYPES_ATTR, ENCODING_ATTR, reader_attrs
from refgrid.core.typed import Attributes
from refgrid.core.util import same_value
from refgrid.errors import ModelError
from refgrid.model.segments import Encoding, Segments
from refgrid.model.virtual import VirtualArray


def presentation(name: str, encodings: Sequence[Encoding], dims: tuple[str, ...],
                 attrs: Mapping[str, object]) -> tuple[bool, np.dtype, object, Attributes]:
    """Whether segments of array ``name`` stored as ``encodings`` are shown decoded, and the
    type, fill value and attributes they are shown with (``attrs``: the combined array's)."""
    first = encodings[0]
    values = {_value_dtype(e.dtype) for e in encodings}
    if len(values) == 1 and all(same_value(dict(e.attrs), dict(first.attrs))
                                for e in encodings):
        dtype = values.pop()
        return False, dtype, first.fill_value, dict(attrs)
    kinds = {kind_of(e): e for e in encodings}  # (xarray's rules ask types, not values)
    types = [mask_and_scale(name, dims, reader_attrs(e.attrs), np.zeros(
        (0,) * len(dims), _value_dtype(e.dtype))).dtype for e in kinds.values()]
    odd = [t for t in types if t.kind not in "iuf"]
    if odd:
        raise ModelError(f"array {name!r}: a segment decodes to {odd[0]}, not numbers (its "
                         "packing attributes are not numbers)")
    dtype = np.result_type(*types)
    fill = np.nan if dtype.kind in "fc" else np.zeros((), dtype)[()]
    shown = {k: v for k, v in attrs.items() if k not in PACKING_ATTRS}
    encoding = shown.get(ENCODING_ATTR)
    if isinstance(encoding, Mapping) and "dtype" in encoding:  # (a file's stored type: not
        shown[ENCODING_ATTR] = {k: v for k, v in encoding.items() if k != "dtype"}  # these)
    return True, dtype, fill, shown


def kind_of(encoding: Encoding) -> tuple[object, ...]:
    """What xarray's decoding of a segment asks of it, values aside: its stored type, and
    its decoding attributes' names, types and NaN-ness (xarray drops a NaN marker) — the
    type it decodes to, and how (:mod:`refgrid.read.segmented`)."""
    attrs = encoding.attrs
    types = attrs.get(ATTRIBUTE_TYPES_ATTR)
    recorded = types if isinstance(types, Mapping) else {}
    return encoding.dtype.str, *sorted(
        (k, str(recorded.get(k) or type(v).__name__), _nan(v))
        for k, v in attrs.items() if k != ATTRIBUTE_TYPES_ATTR)


def _nan(value: object) -> bool:
    return isinstance(value, float) and value != value


def _value_dtype(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("=") if dtype.itemsize > 1 else dtype


def joined(parts: Sequence[VirtualArray], dim: str, attrs: Attributes) -> VirtualArray:
    """``parts`` (each uniform or itself in segments) joined along ``dim`` in segments,
    shown as :func:`presentation` decides; one encoding throughout is no segment at all."""
    across = [p.segments.dim for p in parts if p.segments is not None and
              p.segments.dim != dim]
    if across:
        raise ModelError(f"array {parts[0].name!r} is stored in segments along "
                         f"{across[0]!r}, and cannot be joined in segments along {dim!r} "
                         "as well (stack members whose files store it alike, or combine "
                         "each member apart)")
    pieces: list[tuple[VirtualArray, Encoding]] = []
    for part in parts:
        pieces.extend(_pieces(part))
    axis = parts[0].axis(dim)
    counts = np.cumsum([0, *(p.grid.chunk_counts[axis] for p, _ in pieces)])
    runs = Segments.of_runs(dim, [(int(c), e) for c, (_, e) in zip(counts, pieces,
                                                                 strict=False)])
    encodings = runs.encodings
    first = pieces[0][0]
    aligned = [replace(p, dtype=first.dtype, codecs=first.codecs, fill_value=first.fill_value,
                       attrs=first.attrs) for p, _ in pieces]
    whole = VirtualArray.concat(aligned, dim)
    if len(encodings) == 1:
        only = encodings[0]
        return replace(whole, dtype=only.dtype, codecs=only.codecs,
                       fill_value=only.fill_value, attrs=attrs)
    decoded, dtype, fill, shown = presentation(whole.name, encodings, whole.dims, attrs)
    return shown_as(whole, replace(runs, decoded=decoded), dtype, fill, shown)


def shown_as(array: VirtualArray, segments: Segments, dtype: np.dtype, fill: object,
             attrs: Attributes) -> VirtualArray:
    """``array``'s grid and chunks in ``segments``, shown in ``dtype`` with ``fill`` and
    ``attrs`` (:func:`presentation`), its chunks served plain."""
    return replace(array, dtype=dtype, codecs=(plain_codec(dtype),), fill_value=fill,
                   attrs=attrs, segments=segments)


def _pieces(part: VirtualArray) -> list[tuple[VirtualArray, Encoding]]:
    """A part as its runs of one encoding each (itself, if it has no segments)."""
    segments = part.segments
    if segments is None:
        return [(part, Encoding.of(part.dtype, part.codecs, part.fill_value, part.attrs))]
    axis = part.axis(segments.dim)
    bounds = part.grid.axes[axis].bounds
    ranges = segments.chunk_ranges(part.grid.chunk_counts[axis])
    return [(replace(part, segments=None).slice(segments.dim, int(bounds[a]), int(bounds[b])),
             encoding) for (a, b), encoding in zip(ranges, segments.encodings, strict=True)]
