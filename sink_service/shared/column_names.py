"""Names of the columns the service writes, known without decoding anything.

The configuration checks need them at startup, before the JVM is launched; the decode package
(pyarrow.compute, the Avro and Protobuf decoders: ~0.3 s of imports) is imported while it starts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

METADATA_COLUMNS = ("_key", "_topic", "_partition", "_offset", "_timestamp", "_headers")
DEFAULT_METADATA_COLUMNS = ("_key", "_topic", "_partition", "_offset", "_timestamp")
OFFSET = "_offset"

_INVALID = re.compile(r"[^A-Za-z0-9_]")


def column_name(path: Sequence[str], *, lowercase: bool) -> str:
    """The flat column name of the field at `path` (its steps from the top-level field down)."""
    name = "_".join(_INVALID.sub("_", step) for step in path) or "_"
    return name.lower() if lowercase else name
