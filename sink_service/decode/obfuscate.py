"""Obfuscation of sensitive fields (SINK_OBFUSCATE_FIELDS), before they leave the company.

A path is dotted, `customer.email`, and addresses a field inside objects; it goes through arrays
too (`items.email` obfuscates the field in every element of `items`). Paths apply before
flattening, so they name fields as the producer wrote them; a field whose name holds a `.` cannot
be addressed. A path absent from a chunk changes nothing. Null stays null. The whole value at the
path is replaced, so a path naming an object or an array replaces it with one string.

Methods (SINK_OBFUSCATION_METHOD):
- `fix`: every value becomes `*****`.
- `sha1`, `sha512`: every value becomes the lowercase hex digest of the salt's bytes followed
  by the value's bytes: `sha512(salt + value).hexdigest()`. The salt (SINK_OBFUSCATION_SALT,
  UTF-8) is applied to every value: the reference connector's SHA-512 applied it only to the
  first value hashed by a task (`MessageDigest.digest()` resets the salted state), so its hashes
  depended on what came first. A value's bytes are the UTF-8 of its text as the widening lattice
  writes it when a field becomes a string (`column_types.convert`): a string as it is, an integer
  as its digits, a double as Arrow writes it (`1.5`, `1e+16`), `true`/`false`, objects and arrays
  as compact JSON without null fields. So `42` and `"42"` hash alike, and a field whose type
  flips between chunks keeps the same hash for the same value.

Primary keys: hashing is deterministic per salt and value, so an obfuscated primary key still
tells its rows apart and upserts match as before: the key is hashed consistently (the same salt
must then be kept, or every key changes). `fix` would make every key equal, and a hash does not
order versions, so the configuration rejects at startup a `fix`-masked primary key and any
obfuscated order field (and `_offset`, whose values name the files).

Speed: a hash is computed per distinct value of a chunk, not per record: the text column is
dictionary-encoded, its distinct values are hashed in one tight `hashlib` loop from a
pre-salted state, and the digests are mapped back onto the rows with `take`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from uploader.column_types import _map_list, _rebuild_struct, convert

METHODS = ("fix", "sha1", "sha512")
MASK = "*****"
_TEXT = pa.string()


def obfuscate(table: pa.Table, paths: Sequence[str], method: str, salt: bytes) -> pa.Table:
    """`table` with the value at every dotted path in `paths` obfuscated by `method`."""
    if method not in METHODS:
        raise ValueError(f"unknown obfuscation method {method!r}; one of {', '.join(METHODS)}")
    replace = _masked if method == "fix" else _hasher(method, salt)
    for path in paths:
        head, *rest = path.split(".")
        index = table.schema.get_field_index(head)
        if index >= 0:
            column = table.column(index).combine_chunks()
            table = table.set_column(index, head, _at(column, rest, replace))
    return table


def _at(values: pa.Array, path: list[str], replace: Callable[[pa.Array], pa.Array]) -> pa.Array:
    """`values` with `replace` applied to what `path` addresses in them (unchanged if nothing)."""
    if not path:
        return replace(values)
    if pa.types.is_list(values.type):
        return _map_list(values, lambda items: _at(items, path, replace))
    if not pa.types.is_struct(values.type):
        return values
    index = values.type.get_field_index(path[0])
    if index < 0:
        return values
    children = [values.field(i) for i in range(values.type.num_fields)]
    children[index] = _at(children[index], path[1:], replace)
    return _rebuild_struct(values, list(values.type), children)


def _masked(values: pa.Array) -> pa.Array:
    return pc.if_else(values.is_valid(), pa.scalar(MASK, _TEXT), pa.scalar(None, _TEXT))


def _hasher(method: str, salt: bytes) -> Callable[[pa.Array], pa.Array]:
    salted = hashlib.new(method, salt)

    def hashed(values: pa.Array) -> pa.Array:
        encoded = convert(values, _TEXT).dictionary_encode()
        digests = []
        for value in encoded.dictionary.cast(pa.binary()).to_pylist():
            digest = salted.copy()
            digest.update(value)
            digests.append(digest.hexdigest())
        return pc.take(pa.array(digests, _TEXT), encoded.indices)

    return hashed
