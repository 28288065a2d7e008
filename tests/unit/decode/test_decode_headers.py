"""`_headers`: Kafka record headers as one JSON object per record, built for a whole batch at once."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest

from sink_service.decode import headers as module
from sink_service.decode.headers import HEADERS, headers_json


def column(*records: list[tuple[str, bytes | None]] | None) -> pa.Array:
    return pa.array(list(records), HEADERS)


def test_headers_become_a_json_object_and_records_without_headers_null():
    got = headers_json(column([("trace", b"abc"), ("retry", b"2")], None, [("empty", None)]))
    assert got.to_pylist() == ['{"trace":"abc","retry":"2"}', None, '{"empty":null}']


def test_no_headers_at_all_is_all_null():
    assert headers_json(column(None, None)).to_pylist() == [None, None]


@pytest.mark.parametrize("headers, expected", [
    ([("a", b"1"), ("a", b"2")], {"a": "2"}),  # the last value of a repeated name wins
    ([("bin", b"\xff\x00")], {"bin": "\\xff\x00"}),  # not UTF-8: escaped bytes
    ([("q", b'say "hi"\\ \n\t')], {"q": 'say "hi"\\ \n\t'}),
    ([("caf\u00e9", "\u20ac".encode())], {"caf\u00e9": "\u20ac"}),
])
def test_awkward_headers_are_valid_json_holding_what_was_sent(headers, expected):
    [text] = headers_json(column(headers)).to_pylist()
    assert json.loads(text) == expected


def test_the_batch_path_gives_exactly_the_record_by_record_text():
    rng = random.Random(7)
    alphabet = ['a', 'Z', '"', '\\', '/', '\u00e9', '\u20ac', ' ', '\x7f', '\U0001f600']
    records = []
    for _ in range(300):
        if rng.random() < 0.2:
            records.append(None)
            continue
        names = rng.sample(["id", "trace", "x\"y", "a\\b", "\u00fc"], rng.randint(0, 4))
        text = ["".join(rng.choices(alphabet, k=rng.randint(0, 6))) for _ in names]
        records.append([(n, None if rng.random() < 0.1 else t.encode()) for n, t in zip(names, text, strict=True)])
    headers = column(*records)
    fast = headers_json(headers)
    assert fast.to_pylist() == module._each(headers).to_pylist()
    assert headers_json(headers.slice(17, 100)).to_pylist() == fast.slice(17, 100).to_pylist()
