"""Protobuf values (SINK_VALUE_FORMAT=protobuf, SINK_KEY_FORMAT=protobuf) to typed rows.

After the registry's magic byte and schema id, a payload names its message type by indexes
(zigzag varints: a count, then the path through the file's messages; a lone 0 means the first
message). The schema is fetched as a serialized FileDescriptorProto (`format=serialized`, which
Confluent's registry and `local_registry` serve), its references (imports registered as their
own subjects) too; Google's well-known types come from the protobuf runtime. Each payload is parsed
by the protobuf runtime's message class, and a chunk becomes one Arrow table under a schema
derived from the message descriptor:

    message                      struct (the top-level message's fields are the columns)
    int32, sint32, sfixed32      int32
    int64, sint64, sfixed64      int64
    uint32, fixed32              int64
    uint64, fixed64              decimal128(20, 0)
    float, double, bool          float32, float64, bool
    string, bytes                string, binary
    enum                         string (the value's name; an unknown number as its digits)
    repeated                     list
    map                          string: the map as compact JSON text
    google.protobuf.Timestamp    timestamp(us, UTC)
    google.protobuf.*Value       the wrapped scalar, nullable (Struct, Value, ListValue: JSON text)

Scalars without presence (proto3 fields not marked `optional`) hold their default when unset, as
the protobuf runtime reads them; fields with presence (messages, `optional`, oneof members) are
null when unset. A value that does not parse is a bad record (`invalid_protobuf`).
"""

from __future__ import annotations

import base64
import decimal
import importlib
from collections.abc import Callable, Hashable
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.descriptor_pb2 import FileDescriptorProto

from sink_service.decode.json_values import ParsedValues
from sink_service.decode.registry import Decoder, RegistryClient, RegistrySettings, parse_framed
from uploader.column_types import json_text

Convert = Callable[[Any], Any]
_FD = FieldDescriptor
_SCALARS = {
    _FD.TYPE_INT32: pa.int32(), _FD.TYPE_SINT32: pa.int32(), _FD.TYPE_SFIXED32: pa.int32(),
    _FD.TYPE_INT64: pa.int64(), _FD.TYPE_SINT64: pa.int64(), _FD.TYPE_SFIXED64: pa.int64(),
    _FD.TYPE_UINT32: pa.int64(), _FD.TYPE_FIXED32: pa.int64(),
    _FD.TYPE_UINT64: pa.decimal128(20, 0), _FD.TYPE_FIXED64: pa.decimal128(20, 0),
    _FD.TYPE_FLOAT: pa.float32(), _FD.TYPE_DOUBLE: pa.float64(), _FD.TYPE_BOOL: pa.bool_(),
    _FD.TYPE_STRING: pa.string(), _FD.TYPE_BYTES: pa.binary(),
}
_UNSIGNED_64 = (_FD.TYPE_UINT64, _FD.TYPE_FIXED64)
_WRAPPERS = {f"google.protobuf.{name}Value" for name in
             ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")}
_JSON_MESSAGES = {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"}
_MAX_DEPTH = 32  # a message that holds itself (a tree) is typed this deep, then as JSON text


def parse_protobuf(values: pa.Array, registry: RegistrySettings) -> ParsedValues:
    """Decode Confluent-framed Protobuf values (binary, no nulls) into one table, rows in order."""
    return parse_framed(values, registry, _protobuf_decoder, "invalid_protobuf", message_indexes)


def message_indexes(value: bytes, start: int = 0) -> tuple[tuple[int, ...], int]:
    """The message-index path at `start` of a value, and where the message's bytes start."""
    if value[start:start + 1] == b"\x00":  # the usual case: the first message
        return (0,), start + 1
    count, at = _zigzag(value, start)
    if count < 0 or count > 64:
        raise ValueError(f"message-index count {count} is not valid")
    indexes = []
    for _ in range(count):
        index, at = _zigzag(value, at)
        indexes.append(index)
    return tuple(indexes), at


def _zigzag(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(data):
            raise ValueError("payload ends inside the message indexes")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), at
        shift += 7
        if shift > 63:
            raise ValueError("message index is not a valid varint")


def _protobuf_decoder(client: RegistryClient, answer: dict[str, Any], indexes: Hashable) -> ProtobufDecoder:
    schema_type = answer.get("schemaType", "AVRO")
    if schema_type != "PROTOBUF":
        raise ValueError(f"the registry holds a {schema_type} schema under this id, not a Protobuf one")
    pool = descriptor_pool.DescriptorPool()
    file = _add_file(pool, client, answer, "schema.proto")
    return ProtobufDecoder(_message(file, indexes))


def _add_file(pool: descriptor_pool.DescriptorPool, client: RegistryClient, answer: dict[str, Any], name: str):
    """Add a serialized file with its references (and well-known imports) to `pool`."""
    proto = FileDescriptorProto.FromString(base64.b64decode(answer["schema"], validate=True))
    if not proto.name:
        proto.name = name
    referenced = {}
    for reference in answer.get("references") or []:
        referenced[reference["name"]] = client.version(reference["subject"], reference["version"])
    for dependency in proto.dependency:
        try:
            pool.FindFileByName(dependency)
            continue
        except KeyError:
            pass
        if dependency in referenced:
            _add_file(pool, client, referenced[dependency], dependency)
        else:  # a well-known type (google/protobuf/*.proto): the runtime's own copy
            _add_well_known(pool, _well_known(dependency))
    return pool.Add(proto)


def _well_known(name: str):
    """The runtime's descriptor of a well-known file, loading its module (`google.protobuf.timestamp_pb2`)."""
    if not name.startswith("google/protobuf/"):
        raise KeyError(f"import {name} is neither a reference of the schema nor a well-known type")
    return importlib.import_module(name.removesuffix(".proto").replace("/", ".") + "_pb2").DESCRIPTOR


def _add_well_known(pool: descriptor_pool.DescriptorPool, file) -> None:
    for dependency in file.dependencies:
        _add_well_known(pool, dependency)
    try:
        pool.FindFileByName(file.name)
    except KeyError:
        proto = FileDescriptorProto()
        file.CopyToProto(proto)
        pool.Add(proto)


def _message(file, indexes: tuple[int, ...]) -> Descriptor:
    """The message type the indexes name: a top-level message, then nested ones."""
    proto = FileDescriptorProto()
    file.CopyToProto(proto)
    message = proto.message_type[indexes[0]]
    names = [message.name]
    for index in indexes[1:]:
        message = message.nested_type[index]
        names.append(message.name)
    return file.pool.FindMessageTypeByName(".".join([proto.package, *names] if proto.package else names))


class ProtobufDecoder(Decoder):
    def __init__(self, descriptor: Descriptor):
        self.message_class = message_factory.GetMessageClass(descriptor)
        fields = [_field(f, 0) for f in descriptor.fields]
        self.schema = pa.schema([pa.field(f.name, type_) for f, (type_, _) in zip(descriptor.fields, fields,
                                                                                   strict=True)])
        self._convert = _record([(f, convert) for f, (_, convert) in zip(descriptor.fields, fields, strict=True)])

    def decode(self, value: bytes, start: int) -> dict[str, Any]:
        message = self.message_class()
        message.ParseFromString(memoryview(value)[start:])
        return self._convert(message)


def _field(f: FieldDescriptor, depth: int) -> tuple[pa.DataType, Convert]:
    """The Arrow type of a field and how to read its value from a message (the field's own value)."""
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        return pa.string(), lambda value: json_text(_map_value(value))
    type_, convert = _single(f, depth)
    if f.is_repeated:
        return pa.list_(type_), lambda values: [convert(v) for v in values]
    return type_, convert


def _single(f: FieldDescriptor, depth: int) -> tuple[pa.DataType, Convert]:
    if f.type == _FD.TYPE_ENUM:
        names = {v.number: v.name for v in f.enum_type.values}
        return pa.string(), lambda number: names.get(number, str(number))
    if f.type in _UNSIGNED_64:
        return _SCALARS[f.type], decimal.Decimal
    if f.type != _FD.TYPE_MESSAGE and f.type != _FD.TYPE_GROUP:
        return _SCALARS[f.type], _same
    return _message_type(f.message_type, depth + 1)


def _message_type(descriptor: Descriptor, depth: int) -> tuple[pa.DataType, Convert]:
    name = descriptor.full_name
    if name == "google.protobuf.Timestamp":
        return pa.timestamp("us", tz="UTC"), lambda ts: ts.seconds * 1_000_000 + ts.nanos // 1000
    if name in _WRAPPERS:
        return _single(descriptor.fields_by_name["value"], depth)
    if name in _JSON_MESSAGES or depth > _MAX_DEPTH:
        return pa.string(), lambda message: json_text(json_format.MessageToDict(message))
    fields = [_field(f, depth) for f in descriptor.fields]
    struct = pa.struct([pa.field(f.name, type_) for f, (type_, _) in zip(descriptor.fields, fields, strict=True)])
    return struct, _record([(f, convert) for f, (_, convert) in zip(descriptor.fields, fields, strict=True)])


def _record(fields: list[tuple[FieldDescriptor, Convert]]) -> Convert:
    """A message's fields as a dict: null where a field with presence is unset."""
    plan = [(f.name, f.has_presence, convert) for f, convert in fields]

    def convert(message: Any) -> dict[str, Any]:
        return {name: convert(getattr(message, name)) if not present or message.HasField(name) else None
                for name, present, convert in plan}
    return convert


def _map_value(entries: Any) -> dict[str, Any]:
    return {str(k): json_format.MessageToDict(v) if hasattr(v, "DESCRIPTOR") else v for k, v in entries.items()}


def _same(value: Any) -> Any:
    return value
