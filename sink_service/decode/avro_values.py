"""Avro values (SINK_VALUE_FORMAT=avro, SINK_KEY_FORMAT=avro) to typed rows.

Each payload is read by `fastavro.schemaless_reader` with the writer's schema from the registry
(`registry.py`), and a chunk's dicts become one Arrow table in a single call, under an Arrow
schema derived from the Avro schema (never inferred):

    record                 struct (a top-level record's fields are the columns)
    other top-level type   one column `value`
    union with null        the other branch, nullable
    other unions           string: the value's JSON text (a string branch as it is)
    array                  list
    map                    string: the map as compact JSON text, as flattening writes objects it
                           cannot make columns of
    enum                   string (the symbol)
    fixed, bytes           binary
    int, long              int32, int64
    float, double          float32, float64
    decimal                decimal128(precision, scale) (precision above 38: string)
    date                   date32
    time-millis/micros     time32(ms) / time64(us)
    timestamp-millis/micros             timestamp(ms/us, UTC)
    local-timestamp-millis/micros       timestamp(ms/us) without time zone
    uuid                   string

    a record inside itself   string: its JSON text (a recursive schema, e.g. a tree)

A value that does not decode with its schema is a bad record (`invalid_avro`).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Hashable
from typing import Any

import fastavro
import pyarrow as pa

from sink_service.decode.json_values import ParsedValues
from sink_service.decode.registry import Decoder, RegistryClient, RegistrySettings, parse_framed
from uploader.column_types import json_text

Fix = Callable[[Any], Any]  # turns what fastavro returns into what the Arrow type holds
VALUE_COLUMN = "value"

_PRIMITIVES = {
    "null": pa.null(), "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
    "double": pa.float64(), "bytes": pa.binary(), "string": pa.string(),
}
_LOGICAL = {
    "date": pa.date32(), "time-millis": pa.time32("ms"), "time-micros": pa.time64("us"),
    "timestamp-millis": pa.timestamp("ms", tz="UTC"), "timestamp-micros": pa.timestamp("us", tz="UTC"),
    "local-timestamp-millis": pa.timestamp("ms"), "local-timestamp-micros": pa.timestamp("us"),
}


def parse_avro(values: pa.Array, registry: RegistrySettings) -> ParsedValues:
    """Decode Confluent-framed Avro values (binary, no nulls) into one table, rows in order."""
    return parse_framed(values, registry, _avro_decoder, "invalid_avro")


def _avro_decoder(_client: RegistryClient, answer: dict[str, Any], _variant: Hashable) -> AvroDecoder:
    schema_type = answer.get("schemaType", "AVRO")
    if schema_type != "AVRO":
        raise ValueError(f"the registry holds a {schema_type} schema under this id, not an Avro one")
    return AvroDecoder(json.loads(answer["schema"]))


class AvroDecoder(Decoder):
    def __init__(self, schema: Any):
        self.avro = fastavro.parse_schema(schema)
        type_, fix = _arrow(schema, {}, "")
        self.top_level_record = pa.types.is_struct(type_)
        self.schema = pa.schema(list(type_)) if self.top_level_record else pa.schema([(VALUE_COLUMN, type_)])
        self.fix = fix

    def decode(self, value: bytes, start: int) -> dict[str, Any]:
        buffer = io.BytesIO(value)
        buffer.seek(start)
        value = fastavro.schemaless_reader(buffer, self.avro)
        if buffer.tell() != len(buffer.getbuffer()):
            raise ValueError(f"{len(buffer.getbuffer()) - buffer.tell()} bytes left after the value")
        if self.fix is not None and value is not None:
            value = self.fix(value)
        return value if self.top_level_record else {VALUE_COLUMN: value}


def _arrow(schema: Any, names: dict[str, tuple[pa.DataType, Fix | None]], namespace: str
           ) -> tuple[pa.DataType, Fix | None]:
    """The Arrow type of an Avro schema, and the fix its decoded values need (None: none)."""
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema], None
        return names[schema] if schema in names else names[f"{namespace}.{schema}"]
    if isinstance(schema, list):
        return _union(schema, names, namespace)
    logical = _logical(schema)
    if logical is not None:
        return logical
    kind = schema["type"]
    if kind in ("record", "error"):
        return _record(schema, names, namespace)
    if kind in ("enum", "fixed"):
        found = (pa.string() if kind == "enum" else pa.binary(), None)
        _name(schema, names, namespace, found)
        return found
    if kind == "array":
        item, fix = _arrow(schema["items"], names, namespace)
        return pa.list_(item), None if fix is None else (lambda items: [None if v is None else fix(v) for v in items])
    if kind == "map":
        _arrow(schema["values"], names, namespace)  # registers the named types it defines
        return pa.string(), json_text
    return _arrow(kind, names, namespace)  # {"type": "long"}


def _logical(schema: dict[str, Any]) -> tuple[pa.DataType, Fix | None] | None:
    logical = schema.get("logicalType")
    if logical == "decimal":
        precision, scale = schema.get("precision", 0), schema.get("scale", 0)
        return (pa.decimal128(precision, scale), None) if 0 < precision <= 38 else (pa.string(), str)
    if logical == "uuid":
        return pa.string(), str
    if logical in _LOGICAL:
        return _LOGICAL[logical], None
    return None


def _record(schema: dict[str, Any], names: dict[str, tuple[pa.DataType, Fix | None]], namespace: str
            ) -> tuple[pa.DataType, Fix | None]:
    # Inside its own fields a record that holds itself (a tree) is JSON text: Arrow types are finite.
    _name(schema, names, namespace, (pa.string(), json_text))
    namespace = schema.get("namespace", namespace)
    fields, fixes = [], {}
    for f in schema["fields"]:
        type_, fix = _arrow(f["type"], names, namespace)
        fields.append(pa.field(f["name"], type_))
        if fix is not None:
            fixes[f["name"]] = fix
    found = (pa.struct(fields), _fix_fields(fixes) if fixes else None)
    _name(schema, names, namespace, found)
    return found


def _fix_fields(fixes: dict[str, Fix]) -> Fix:
    def fix(record: dict[str, Any]) -> dict[str, Any]:
        for name, fix_value in fixes.items():
            value = record.get(name)
            if value is not None:
                record[name] = fix_value(value)
        return record
    return fix


def _union(branches: list[Any], names: dict[str, tuple[pa.DataType, Fix | None]], namespace: str
           ) -> tuple[pa.DataType, Fix | None]:
    typed = [_arrow(branch, names, namespace) for branch in branches]
    present = [(t, fix) for t, fix in typed if not pa.types.is_null(t)]
    if not present:
        return pa.null(), None
    if len(present) == 1:
        return present[0]
    return pa.string(), _union_text


def _union_text(value: Any) -> str:
    return value if isinstance(value, str) else json_text(value)


def _name(schema: dict[str, Any], names: dict[str, tuple[pa.DataType, Fix | None]], namespace: str,
          found: tuple[pa.DataType, Fix | None]) -> None:
    """Register a named type under its name and full name, for later references to it."""
    name = schema["name"]
    names[name] = found
    space = schema.get("namespace", namespace)
    full = name if "." in name or not space else f"{space}.{name}"
    names[full] = found
