"""Kafka record headers as one JSON object per record: the `_headers` column.

`{"name": "value", ...}`: values are text (bytes that are not UTF-8 kept as `\\xNN` escapes), a
header without a value is `null`, and when a name repeats the last value wins, as Kafka's
`Headers.lastHeader` reads it. A record without headers has a null `_headers`.

The JSON is built for the whole batch at once; only a batch holding a repeated name, a control
character or a value that is not UTF-8 is built record by record.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

HEADER = pa.struct([("key", pa.string()), ("value", pa.binary())])
HEADERS = pa.list_(HEADER)
_CONTROL = r"[\x00-\x1f]"


def headers_json(headers: pa.Array) -> pa.Array:
    """Each record's headers (a list of `HEADER`) as JSON text; null where it has none."""
    if headers.null_count == len(headers):
        return pa.nulls(len(headers), pa.string())
    entries = pc.list_flatten(headers)
    names, values = entries.field("key"), entries.field("value")
    try:
        text = values.cast(pa.string())
    except pa.ArrowInvalid:  # not UTF-8
        return _each(headers)
    if _any(pc.match_substring_regex(names, _CONTROL)) or _any(pc.match_substring_regex(text, _CONTROL)) \
            or _repeats_a_name(headers, names):
        return _each(headers)
    member = pc.binary_join_element_wise(
        '"', _escaped(names), '":', pc.fill_null(pc.binary_join_element_wise('"', _escaped(text), '"', ""), "null"), "")
    lists = headers.combine_chunks() if isinstance(headers, pa.ChunkedArray) else headers
    offsets = pc.subtract(lists.offsets, lists.offsets[0])
    members = pa.ListArray.from_arrays(offsets, member, mask=lists.is_null() if lists.null_count else None)
    return pc.binary_join_element_wise("{", pc.binary_join(members, ","), "}", "")


def _escaped(text: pa.Array) -> pa.Array:
    return pc.replace_substring(pc.replace_substring(text, "\\", "\\\\"), '"', '\\"')


def _any(mask: pa.Array) -> bool:
    return bool(pc.any(mask).as_py())


def _repeats_a_name(headers: pa.Array, names: pa.Array) -> bool:
    owners = pc.list_parent_indices(headers)
    pairs = pa.table({"owner": owners, "name": names})
    return pairs.group_by(["owner", "name"], use_threads=False).aggregate([]).num_rows != len(names)


def _each(headers: pa.Array) -> pa.Array:
    return pa.array([None if h is None else _one(h) for h in headers.to_pylist()], pa.string())


def _one(headers: list[dict]) -> str:
    entries = {h["key"]: None if h["value"] is None else h["value"].decode("utf-8", "backslashreplace")
               for h in headers}
    return json.dumps(entries, ensure_ascii=False, separators=(",", ":"))
