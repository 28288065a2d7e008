"""JSON values as Python trees, for the few chunks `pyarrow.json` cannot type by itself.

A path names a place in a JSON object: field names, and `ITEM` for "each element of this array"
(`("items", ITEM, "qty")`). Numbers are kept as their own text (`Number`), so a value rewritten
here keeps every digit, and an integer of any size can be told from a double.

Two rewrites feed a chunk back to `pyarrow.json`, both following the widening lattice of
`uploader.column_types`, where values of different kinds in one field join to string:
- `quote_mixed`: where one path holds values of more than one kind (a number and a string, an
  object and a number, ...), every value there becomes a string holding its JSON text.
- `quote_at`: the numbers at given paths become strings of their digits (integers beyond int64
  that no decimal(38,0) holds).
Every other value is written back unchanged (numbers as the same number, objects compact).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from uploader.column_types import json_text

Path = tuple[str | None, ...]
ITEM = None  # path step into an array's elements (field names are strings)


class Number(str):
    """A JSON number's own text, as `json.loads` hands it over."""

    def beyond_int64(self) -> bool:
        digits = self.lstrip("-")
        if digits.isdigit() and len(digits) >= 19:
            return len(digits) > 19 or not -(2**63) <= int(self) < 2**63
        return False

    def restored(self) -> int | float:
        return int(self) if self.lstrip("-").isdigit() else float(self)


def loads(value: bytes) -> object:
    """The JSON value with every number as a `Number`; a key twice in one object is an error."""
    return json.loads(value, parse_int=Number, parse_float=Number, object_pairs_hook=_unique_keys)


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    node = dict(pairs)
    if len(node) != len(pairs):
        raise ValueError("a key appears twice in one object")
    return node


def _walk(node: object, path: Path = ()) -> Iterable[tuple[object, Path]]:
    """Every value in the tree with its path, the node itself first."""
    yield node, path
    if isinstance(node, dict):
        for key, child in node.items():
            yield from _walk(child, (*path, key))
    elif isinstance(node, list):
        for child in node:
            yield from _walk(child, (*path, ITEM))


def big_integer_digits(values: Iterable[bytes]) -> dict[Path, int]:
    """Paths of the integers beyond int64 in these JSON values, with the most digits at each."""
    found: dict[Path, int] = {}
    for value in values:
        for node, path in _walk(loads(value)):
            if isinstance(node, Number) and node.beyond_int64():
                found[path] = max(found.get(path, 0), len(node.lstrip("-")))
    return found


def _mixed_paths(trees: Iterable[object]) -> set[Path]:
    """Outermost paths holding values of more than one JSON kind (null mixes with anything)."""
    kinds: dict[Path, set[type]] = {}
    for tree in trees:
        for node, path in _walk(tree):
            if node is not None:
                kinds.setdefault(path, set()).add(type(node))
    mixed = {path for path, found in kinds.items() if len(found) > 1}
    return {path for path in mixed if not any(path[:i] in mixed for i in range(len(path)))}


def quote_mixed(values: list[bytes]) -> list[bytes] | None:
    """The values with every mixed-kind path as text; None when no path mixes kinds.

    A value that is not a JSON object (or not JSON) is left as it is: it stays a bad record.
    """
    trees: list[object] = []
    for value in values:
        try:
            trees.append(loads(value))
        except ValueError:
            trees.append(None)
    paths = _mixed_paths(tree for tree in trees if isinstance(tree, dict))
    if not paths:
        return None
    return [_dumps(_with_text_at(tree, paths)) if isinstance(tree, dict) else value
            for value, tree in zip(values, trees, strict=True)]


def quote_at(values: list[bytes], paths: set[Path]) -> list[bytes]:
    """The values with the values at `paths` as strings of their JSON text."""
    return [_dumps(_with_text_at(loads(value), paths)) for value in values]


def _with_text_at(node: object, paths: set[Path], path: Path = ()) -> object:
    if path in paths and node is not None:
        return _text(node)
    if isinstance(node, dict):
        return {key: _with_text_at(child, paths, (*path, key)) for key, child in node.items()}
    if isinstance(node, list):
        return [_with_text_at(child, paths, (*path, ITEM)) for child in node]
    return node.restored() if isinstance(node, Number) else node


def _text(node: object) -> str:
    """A value as the lattice's string: strings as they are, numbers as written, else JSON text."""
    if isinstance(node, str):  # a Number is its own text
        return str(node)
    return json_text(_restored(node))


def _restored(node: object) -> object:
    if isinstance(node, Number):
        return node.restored()
    if isinstance(node, dict):
        return {key: _restored(child) for key, child in node.items()}
    if isinstance(node, list):
        return [_restored(child) for child in node]
    return node


def _dumps(tree: object) -> bytes:
    """Compact JSON of a rewritten value; unlike `json_text`, nulls are kept as they came."""
    return json.dumps(tree, ensure_ascii=False, separators=(",", ":")).encode()
