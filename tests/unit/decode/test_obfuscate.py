"""Obfuscation (SINK_OBFUSCATE_FIELDS): masks and salted hashes of every value, known vectors."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pytest

from sink_service.config import load_config
from sink_service.decode.obfuscate import MASK, obfuscate
from tests.support.config_helpers import config_problems, ems_env

SALT = b"pepper-0123"


def sha512(text: str) -> str:
    return hashlib.sha512(SALT + text.encode()).hexdigest()


def sha1(text: str) -> str:
    return hashlib.sha1(SALT + text.encode()).hexdigest()


def test_known_vectors_of_both_hashes():
    # Computed apart from the module: hashlib over the salt's bytes, then the value's UTF-8.
    table = pa.table({"email": ["ann@example.com"], "n": [42]})
    assert obfuscate(table, ["email", "n"], "sha1", SALT).to_pylist() == [{
        "email": "232ee136cf3b842f48d9b36be94e3ad36329fc66", "n": "2cd69a52efc0407a90046879f97a1c22561ae9c9"}]
    assert obfuscate(table, ["email"], "sha512", SALT).column("email")[0].as_py() == (
        "849f3363fc2d36139402820ef5ffdd12de84a9cae85c3d51c1d27bde0903bda5"
        "d30830d42aa0105f803367fa3a761fb5ee1f9cb6e83bece9e63a8a2efd4d72ac")


def test_every_value_is_hashed_and_nulls_stay_null():
    table = pa.table({"email": ["ann@example.com", "bob@example.com", None]})
    assert obfuscate(table, ["email"], "sha512", SALT).column("email").to_pylist() == [
        sha512("ann@example.com"), sha512("bob@example.com"), None]
    assert obfuscate(table, ["email"], "sha1", SALT).column("email").to_pylist() == [
        sha1("ann@example.com"), sha1("bob@example.com"), None]


def test_the_salt_applies_to_every_value_not_only_the_first():
    # The reference connector's SHA-512 salted only the first value a task hashed.
    values = ["first", "second", "first", "third"]
    hashed = obfuscate(pa.table({"v": values}), ["v"], "sha512", SALT).column("v").to_pylist()
    assert hashed == [sha512(v) for v in values]
    assert hashed[1] != hashlib.sha512(b"second").hexdigest()


def test_hashes_do_not_depend_on_the_chunk():
    first = obfuscate(pa.table({"v": ["a", "b"]}), ["v"], "sha1", SALT).column("v").to_pylist()
    second = obfuscate(pa.table({"v": ["b", "c", "a"]}), ["v"], "sha1", SALT).column("v").to_pylist()
    assert first == [second[2], second[0]]


@pytest.mark.parametrize(("values", "type_", "texts"), [
    ([42, -7], pa.int64(), ["42", "-7"]),
    ([1.5, 1e16], pa.float64(), ["1.5", "1e+16"]),
    ([True, False], pa.bool_(), ["true", "false"]),
    ([{"b": 1, "a": None}], pa.struct([("b", pa.int64()), ("a", pa.string())]), ['{"b":1}']),
    ([["x", "y"]], pa.list_(pa.string()), ['["x","y"]']),
])
def test_a_value_that_is_not_a_string_is_hashed_as_its_text(values, type_, texts):
    table = pa.table({"v": pa.array(values, type_)})
    assert obfuscate(table, ["v"], "sha512", SALT).column("v").to_pylist() == [sha512(t) for t in texts]


def test_a_number_and_its_digits_as_a_string_hash_alike():
    numbers = obfuscate(pa.table({"v": [42]}), ["v"], "sha1", SALT).column("v")
    strings = obfuscate(pa.table({"v": ["42"]}), ["v"], "sha1", SALT).column("v")
    assert numbers.equals(strings)


def test_fix_masks_every_value_and_keeps_nulls():
    table = pa.table({"card": ["4111", None, "5500"], "n": [1, 2, None]})
    result = obfuscate(table, ["card", "n"], "fix", b"")
    assert result.to_pylist() == [
        {"card": MASK, "n": MASK}, {"card": None, "n": MASK}, {"card": MASK, "n": None}]


def test_paths_address_nested_fields_and_go_through_arrays():
    rows = [
        {"id": 1, "customer": {"email": "a@x", "name": "Ann"}, "items": [{"card": "1"}, {"card": None}]},
        {"id": 2, "customer": None, "items": None},
        {"id": 3, "customer": {"email": None, "name": "Cy"}, "items": []},
    ]
    result = obfuscate(pa.Table.from_pylist(rows), ["customer.email", "items.card"], "sha512", SALT)
    assert result.to_pylist() == [
        {"id": 1, "customer": {"email": sha512("a@x"), "name": "Ann"},
         "items": [{"card": sha512("1")}, {"card": None}]},
        {"id": 2, "customer": None, "items": None},
        {"id": 3, "customer": {"email": None, "name": "Cy"}, "items": []},
    ]


def test_a_path_naming_an_object_replaces_it_whole():
    table = pa.Table.from_pylist([{"customer": {"email": "a@x"}}, {"customer": None}])
    assert obfuscate(table, ["customer"], "fix", b"").column("customer").to_pylist() == [MASK, None]


def test_a_path_absent_from_the_chunk_changes_nothing():
    table = pa.Table.from_pylist([{"id": 1, "customer": {"name": "Ann"}, "tags": ["a"]}])
    assert obfuscate(table, ["email", "customer.email", "id.deeper", "tags.x"], "sha1", SALT).equals(table)


def test_a_sliced_chunked_table_is_obfuscated_row_for_row():
    column = pa.chunked_array([pa.array([{"e": "a"}, {"e": "b"}]), pa.array([{"e": "c"}])])
    table = pa.table({"c": column}).slice(1)
    assert obfuscate(table, ["c.e"], "sha1", SALT).column("c").to_pylist() == [{"e": sha1("b")}, {"e": sha1("c")}]


def test_an_unknown_method_is_an_error():
    with pytest.raises(ValueError, match="md5"):
        obfuscate(pa.table({"v": ["a"]}), ["v"], "md5", SALT)


def test_obfuscation_settings_load():
    config = load_config(ems_env(SINK_OBFUSCATE_FIELDS="customer.email, _key", SINK_OBFUSCATION_METHOD="sha512",
                              SINK_OBFUSCATION_SALT="s3cr3t-salt"))
    assert config.obfuscate_fields == ("customer.email", "_key")
    assert config.masked()["SINK_OBFUSCATION_SALT"] == "*****"
    assert load_config(ems_env()).obfuscation_method == "fix"


def test_a_hashed_primary_key_is_allowed_a_masked_one_is_not():
    hashed = ems_env(SINK_PRIMARY_KEYS="customer_id", SINK_OBFUSCATE_FIELDS="customer.id",
                  SINK_OBFUSCATION_METHOD="sha1", SINK_OBFUSCATION_SALT="s")
    load_config(hashed)
    problems = config_problems({**hashed, "SINK_OBFUSCATION_METHOD": "fix", "SINK_OBFUSCATION_SALT": ""})
    assert problems == [
        "SINK_OBFUSCATE_FIELDS names `customer.id`, a primary key (SINK_PRIMARY_KEYS): `fix` would give every "
        "record the same key. Use SINK_OBFUSCATION_METHOD=sha512, which hashes keys consistently, or leave the "
        "key out."]


def test_every_obfuscation_problem_is_listed():
    problems = config_problems(ems_env(
        SINK_OBFUSCATE_FIELDS="a..b,version,_offset,email,email", SINK_ORDER_FIELD="version",
        SINK_OBFUSCATION_METHOD="sha512"))
    assert len(problems) == 5
    assert any("SINK_OBFUSCATION_SALT is required" in p for p in problems)
    assert any("`a..b`" in p for p in problems)
    assert any("`version`, the order field" in p for p in problems)
    assert any("`_offset`" in p for p in problems)
    assert any("lists a path twice" in p for p in problems)


def test_a_salt_for_the_fixed_mask_is_a_problem_and_never_shown():
    problems = config_problems(ems_env(SINK_OBFUSCATE_FIELDS="email", SINK_OBFUSCATION_SALT="top-secret-salt"))
    assert any("SINK_OBFUSCATION_METHOD=fix uses no salt" in p for p in problems)
    assert not any("top-secret-salt" in p for p in problems)
