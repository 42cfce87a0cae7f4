"""JSON reference files as an input of the scan dispatcher: the file read and parsed here,
its reference set — refgrid's own or any other kerchunk form — read by
:mod:`refgrid.refs.json_refs` (:func:`reference_dict_to_group`, which reads loaded dicts
too), which owns the layout in both directions."""

from __future__ import annotations

from refgrid.core.jsonio import loads
from refgrid.core.typed import JSONObject
from refgrid.errors import NO_SUCH_FILE, FormatError, NotFoundError
from refgrid.model.virtual import VirtualGroup
from refgrid.refs.json_refs import reference_dict_to_group
from refgrid.scanners.options import ScanOptions
from refgrid.scanners.source import Source


def scan_json(source: Source, options: ScanOptions) -> VirtualGroup:
    """The model of the JSON reference file at ``source``."""
    return reference_dict_to_group(load_json(source), source.url, source.storage_options)


def load_json(source: Source) -> JSONObject:
    """The parsed reference file (:func:`refgrid.core.jsonio.loads`: orjson on 10^5 keys,
    json where orjson would read otherwise)."""
    try:
        fs, path = source.filesystem()
        data = fs.cat_file(path)
    except FileNotFoundError:
        raise NotFoundError(source.url, None, NO_SUCH_FILE) from None
    except OSError as e:
        raise FormatError(source.url, None, f"cannot read the reference file: {e}") from e
    try:
        refs = loads(data)
    except ValueError as e:
        raise FormatError(source.url, None, f"not a kerchunk reference set (not JSON: {e})") \
            from e
    if not isinstance(refs, dict):
        raise FormatError(source.url, None, "not a kerchunk reference set (the JSON is a "
                          f"{type(refs).__name__}, not an object)")
    return refs


__all__ = ["load_json", "reference_dict_to_group", "scan_json"]
