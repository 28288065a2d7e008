"""The Kafka key of each record."""

from __future__ import annotations

import pyarrow as pa


def key_text(keys: pa.Array) -> pa.Array:
    """Keys as strings; bytes that are not UTF-8 are kept as `\\xNN` escapes."""
    try:
        return keys.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array(
            [None if k is None else k.decode("utf-8", "backslashreplace") for k in keys.to_pylist()],
            pa.string(),
        )
