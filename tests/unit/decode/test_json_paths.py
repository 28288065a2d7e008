"""JSON values rewritten so that pyarrow.json can type them: numbers keep their text."""

from __future__ import annotations

import json

from sink_service.decode.json_paths import ITEM, big_integer_digits, quote_at, quote_mixed


def test_quote_mixed_leaves_values_alone_when_no_path_mixes_kinds():
    assert quote_mixed([b'{"a": 1}', b'{"a": 2.5, "b": null}', b'{"a": null}']) is None


def test_quote_mixed_turns_every_value_at_a_mixed_path_into_its_text():
    values = [b'{"a": 1.50, "n": 12345678901234567890123}', b'{"a": "x", "n": 1}', b'{"a": {"k": [1, null]}}', b"{bad"]
    quoted = quote_mixed(values)
    assert [json.loads(v) for v in quoted[:3]] == [
        {"a": "1.50", "n": 12345678901234567890123}, {"a": "x", "n": 1}, {"a": '{"k":[1,null]}'}]
    assert quoted[3] == b"{bad"  # not JSON: left for the parser to report


def test_quote_mixed_inside_arrays_and_only_at_the_outermost_mixed_path():
    [quoted] = quote_mixed([b'{"x": [1, {"c": [true, "t"]}], "ok": [1, 2]}'])
    assert json.loads(quoted) == {"x": ["1", '{"c":[true,"t"]}'], "ok": [1, 2]}


def test_a_key_twice_in_one_object_is_not_rewritten():
    assert quote_mixed([b'{"x": [1, "a"], "y": 1, "y": 2}']) is None


def test_big_integer_digits_finds_integers_beyond_int64_only():
    values = [b'{"a": 9223372036854775807, "b": -9223372036854775808, "c": 9223372036854775808}',
              b'{"d": [{"e": -123456789012345678901}], "f": 1e30, "g": "12345678901234567890"}']
    assert big_integer_digits(values) == {("c",): 19, ("d", ITEM, "e"): 21}


def test_quote_at_keeps_the_digits():
    [quoted] = quote_at([b'{"a": 123456789012345678901234567890123456789012, "b": 0.1}'], {("a",)})
    assert json.loads(quoted) == {"a": "123456789012345678901234567890123456789012", "b": 0.1}
