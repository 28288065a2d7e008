"""CSV values (SINK_VALUE_FORMAT=csv) and raw values (SINK_VALUE_FORMAT=raw) to rows.

CSV: each value is one row. Its columns are named and typed by SINK_CSV_COLUMNS (Spark DDL, in
order), or, with SINK_CSV_HEADER=true, each value is a header line naming its columns followed
by one data row (a header per message: records stay self-describing, and a replay or retention
never loses the line that names the columns). Header columns are typed by SINK_CSV_COLUMNS where
it declares them (by name); the others are strings, never guessed.

The fast path joins a chunk's values with newlines and parses them with `pyarrow.csv` in one
call; only a chunk that fails is bisected, as JSON chunks are, to find the values at fault. A
value with a different number of fields, a field that does not convert to its declared type, a
quote left open, or more than one row is a bad record (`invalid_csv`); an empty one `empty_value`.
Quoted fields may hold the delimiter, doubled quotes and newlines. An empty field is null, except
in a STRING column, where it is the empty string.

Raw: the value's bytes as they came, in one binary column `value` (metadata columns all start
with `_`, so it cannot collide with them).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pv

from sink_service.decode.bad_records import Failures
from sink_service.decode.json_values import ParsedValues

RAW_VALUE_COLUMN = "value"


@dataclass(frozen=True)
class CsvFormat:
    columns: pa.Schema | None  # SINK_CSV_COLUMNS; required without a header
    header: bool = False
    delimiter: str = ","
    quote: str = '"'


def parse_raw(values: pa.Array) -> ParsedValues:
    """Every value as it came, in the column `value`."""
    return ParsedValues(pa.table({RAW_VALUE_COLUMN: values}), None, {})


def parse_csv(values: pa.Array, fmt: CsvFormat) -> ParsedValues:
    """Parse each value (binary, no nulls) as one CSV row; rows in order, bad values as failures."""
    failures: Failures = {row: ("value is empty", "empty_value")
                          for row in pc.indices_nonzero(pc.match_substring_regex(values, r"^\s*$")).to_pylist()}
    groups = _by_header(values, failures, fmt) if fmt.header else _headerless(values, failures)
    tables, rows = [], []
    for names, (members, bodies) in groups.items():
        for start, end, parsed in _bisect(bodies, _schema(names, fmt), fmt):
            if isinstance(parsed, pa.Table):
                tables.append(parsed)
                rows.extend(members[start:end])
            else:
                failures[members[start]] = parsed
    return ParsedValues.gathered(tables, rows, len(values), failures)


Groups = dict[tuple[str, ...] | None, tuple[list[int], pa.Array]]  # header -> (rows, their bodies)


def _headerless(values: pa.Array, failures: Failures) -> Groups:
    """One group: every value that is not empty, as it is (no Python loop over the values)."""
    rows = np.setdiff1d(np.arange(len(values)), np.fromiter(failures, int, len(failures)))
    return {None: (rows.tolist(), values.take(pa.array(rows, pa.int64())) if failures else values)}


def _by_header(values: pa.Array, failures: Failures, fmt: CsvFormat) -> Groups:
    """Values grouped by their header line, each without it."""
    groups: dict[tuple[str, ...], tuple[list[int], list[bytes]]] = {}
    for row, value in enumerate(values.to_pylist()):
        if row in failures:
            continue
        head, newline, body = value.partition(b"\n")
        if not newline or not body.strip():
            failures[row] = ("CSV value has a header line but no row after it (SINK_CSV_HEADER=true)", "invalid_csv")
            continue
        rows, bodies = groups.setdefault(_header(head, fmt), ([], []))
        rows.append(row)
        bodies.append(body)
    return {names: (rows, pa.array(bodies, pa.binary())) for names, (rows, bodies) in groups.items()}


def _header(line: bytes, fmt: CsvFormat) -> tuple[str, ...]:
    text = line.decode("utf-8", "replace").rstrip("\r")
    return tuple(next(csv.reader([text], delimiter=fmt.delimiter, quotechar=fmt.quote)))


def _schema(names: tuple[str, ...] | None, fmt: CsvFormat) -> pa.Schema:
    """The columns one group of values is read with: declared, or named by their header."""
    if names is None:
        return fmt.columns
    declared = fmt.columns
    return pa.schema([(name, declared.field(name).type if declared is not None and name in declared.names
                       else pa.string()) for name in names])


# (start, end, table) per parsed run, (i, i + 1, (reason, kind)) per bad value
Parts = list[tuple[int, int, pa.Table | tuple[str, str]]]


def _bisect(values: pa.Array, schema: pa.Schema, fmt: CsvFormat) -> Parts:
    try:
        return [(0, len(values), _read(values, schema, fmt))]
    except pa.ArrowInvalid as exc:
        if len(values) == 1:
            return [(0, 1, (_reason(str(exc)), "invalid_csv"))]
    mid = len(values) // 2
    right = _bisect(values.slice(mid), schema, fmt)
    return _bisect(values.slice(0, mid), schema, fmt) + [(s + mid, e + mid, t) for s, e, t in right]


def _read(values: pa.Array, schema: pa.Schema, fmt: CsvFormat) -> pa.Table:
    """One row per value, or ArrowInvalid."""
    payload = _payload(pc.binary_join_element_wise(values, pa.scalar(b"", pa.binary()), b"\n"))
    table = pv.read_csv(
        pa.BufferReader(payload),
        read_options=pv.ReadOptions(column_names=schema.names, use_threads=False,
                                    block_size=max(len(payload) + 1, 1 << 16)),
        parse_options=pv.ParseOptions(delimiter=fmt.delimiter, quote_char=fmt.quote, newlines_in_values=True,
                                      ignore_empty_lines=False),
        convert_options=pv.ConvertOptions(column_types={f.name: f.type for f in schema}),
    )
    if table.num_rows != len(values):
        raise pa.ArrowInvalid(f"value holds {table.num_rows} CSV rows, not one" if len(values) == 1
                              else "row count differs from value count")
    return table


def _payload(joined: pa.Array) -> pa.Buffer:
    """The joined values as one buffer (each followed by a newline), without a copy."""
    _, offsets_buffer, data = joined.buffers()
    offsets = pa.Array.from_buffers(pa.int32(), len(joined) + 1, [None, offsets_buffer], offset=joined.offset)
    return data[offsets[0].as_py():offsets[-1].as_py()]


def _reason(message: str) -> str:
    """One readable line: Arrow's errors name a row of the chunk, which means nothing here."""
    first = re.sub(r"Row #\d+: ", "", message.split("\n")[0].strip())
    return "invalid CSV: " + re.sub(r"^In CSV column #(\d+): ", r"column \1: ", first.removeprefix("CSV parse error: "))
