"""The raw records decoding starts from: one Arrow batch per read of a topic-partition offset range.

`sink_service.task.range_reader` yields batches of `RAW_SCHEMA`; every stage of
`sink_service.decode` reads its columns by these names.
"""

from __future__ import annotations

import pyarrow as pa

from sink_service.decode.headers import HEADERS

RAW_SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp_ms", pa.int64()),
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("headers", HEADERS),  # null when the record has none
])
