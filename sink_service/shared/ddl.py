"""Spark DDL (`id STRING, amount DECIMAL(10,2), tags ARRAY<STRING>`) to an Arrow schema.

Spark's own parser lives in the JVM; parsing here lets configuration validation report a bad
`SINK_VALUE_SCHEMA` together with every other problem, before Spark starts.
"""

from __future__ import annotations

import re

import pyarrow as pa

_TOKEN = re.compile(r"\s*(?:(`(?:[^`]|``)*`)|([A-Za-z_][A-Za-z0-9_]*)|(\d+)|([<>(),:]))")

_SIMPLE_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(), "varchar": pa.string(), "char": pa.string(),
    "boolean": pa.bool_(), "bool": pa.bool_(),
    "tinyint": pa.int8(), "byte": pa.int8(), "smallint": pa.int16(), "short": pa.int16(),
    "int": pa.int32(), "integer": pa.int32(), "bigint": pa.int64(), "long": pa.int64(),
    "float": pa.float32(), "real": pa.float32(), "double": pa.float64(),
    "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"), "binary": pa.binary(),
}


class DdlError(ValueError):
    pass


class _Parser:
    def __init__(self, text: str):
        self.tokens: list[str] = []
        pos = 0
        text = text.strip()
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if not match or match.end() == pos:
                raise DdlError(f"unexpected character {text[pos]!r} at position {pos}")
            quoted, word, number, punct = match.groups()
            self.tokens.append(quoted[1:-1].replace("``", "`") if quoted else (word or number or punct))
            pos = match.end()
            while pos < len(text) and text[pos].isspace():
                pos += 1
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None:
            raise DdlError(f"unexpected end of schema{f', expected {expected!r}' if expected else ''}")
        if expected is not None and token.lower() != expected:
            raise DdlError(f"expected {expected!r} but found {token!r}")
        self.pos += 1
        return token

    def number(self, what: str) -> int:
        token = self.take()
        if not token.isdigit():
            raise DdlError(f"{what} must be a number, found {token!r}")
        return int(token)

    def fields(self, closing: str | None) -> list[pa.Field]:
        fields = []
        while True:
            name = self.take()
            if name in "<>(),:":
                raise DdlError(f"expected a field name but found {name!r}")
            if self.peek() == ":":
                self.take(":")
            data_type = self.data_type()
            nullable = True
            if self.peek() and self.peek().lower() == "not":
                self.take("not")
                self.take("null")
                nullable = False
            if self.peek() and self.peek().lower() == "comment":
                raise DdlError("COMMENT clauses are not supported")
            fields.append(pa.field(name, data_type, nullable=nullable))
            if self.peek() == ",":
                self.take(",")
                continue
            if self.peek() == closing:
                return fields
            raise DdlError(f"expected ',' after field {name!r} but found {self.peek()!r}")

    def data_type(self) -> pa.DataType:
        name = self.take().lower()
        if name in ("decimal", "numeric", "dec"):
            precision, scale = 10, 0
            if self.peek() == "(":
                self.take("(")
                precision = self.number("decimal precision")
                if self.peek() == ",":
                    self.take(",")
                    scale = self.number("decimal scale")
                self.take(")")
            if not 1 <= precision <= 38 or not 0 <= scale <= precision:
                raise DdlError(f"DECIMAL({precision},{scale}) needs 1 <= precision <= 38 and 0 <= scale <= precision")
            return pa.decimal128(precision, scale)
        if name in ("varchar", "char") and self.peek() == "(":
            self.take("(")
            self.take()
            self.take(")")
        if name == "array":
            self.take("<")
            item = self.data_type()
            self.take(">")
            return pa.list_(item)
        if name == "map":
            raise DdlError("MAP is not supported for JSON values: declare the object as STRUCT<...> or "
                           "leave SINK_VALUE_SCHEMA unset to infer it")
        if name == "struct":
            self.take("<")
            fields = self.fields(">")
            self.take(">")
            return pa.struct(fields)
        if name in _SIMPLE_TYPES:
            return _SIMPLE_TYPES[name]
        raise DdlError(f"unknown type {name!r}")


def parse_ddl(ddl: str) -> pa.Schema:
    """Parse a Spark DDL field list into an Arrow schema, or raise `DdlError` saying where."""
    parser = _Parser(ddl)
    if parser.peek() is None:
        raise DdlError("the schema is empty")
    fields = parser.fields(None)
    if parser.peek() is not None:
        raise DdlError(f"unexpected {parser.peek()!r} after the last field")
    names = [f.name for f in fields]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise DdlError(f"field(s) declared twice: {', '.join(duplicates)}")
    return pa.schema(fields)
