"""The local EMS-compatible endpoint over real HTTP: contract, upsert semantics, faults, control API, CLI."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import requests

from local_ems import LocalEmsClient, LocalEmsServer
from local_ems.multipart import parse_form_data, single_file_part
from local_ems.routes import is_loopback

SECRET = "local-ems-test-secret-4711"
AUTH = f"AppKey {SECRET}"
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def ems(tmp_path: Path) -> Any:
    server = LocalEmsServer(tmp_path / "ems", AUTH).start()
    yield server
    server.stop()


def parquet_bytes(table: pa.Table | dict[str, list[Any]]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table if isinstance(table, pa.Table) else pa.table(table), sink)
    return sink.getvalue()


def push(
    url: str,
    table: pa.Table | dict[str, list[Any]] | bytes,
    target: str | None = "orders",
    keys: str | None = None,
    order: str | None = None,
    auth: str | None = AUTH,
    file_name: str = "topic-orders_partition-0_firstOffset-0_lastOffset-99.parquet",
    **extra: str,
) -> requests.Response:
    params = {"targetName": target, "clientId": "tests", "primaryKeys": keys, "duplicateRemovalOrderColumn": order,
              **extra}
    data = table if isinstance(table, bytes) else parquet_bytes(table)
    headers = {"Authorization": auth} if auth is not None else {}
    return requests.post(url, params={k: v for k, v in params.items() if v is not None}, headers=headers,
                         files={"file": (file_name, data, "application/octet-stream")}, timeout=30)


def by_id(ems: LocalEmsServer | LocalEmsClient, target: str = "orders") -> dict[str, dict[str, Any]]:
    return {row["id"]: row for row in ems.table(target)}


# Contract: authorization and request validation.


def test_missing_or_wrong_authorization_is_401_plain_text_and_stores_nothing(ems: LocalEmsServer) -> None:
    for auth in (None, "AppKey wrong", "Bearer " + SECRET, SECRET, AUTH + " "):
        response = push(ems.items_url(), {"id": ["a"]}, auth=auth)
        assert response.status_code == 401, auth
        assert response.headers["Content-Type"].startswith("text/plain")
        assert SECRET not in response.text
    assert ems.uploads() == []
    assert ems.table("orders") == []
    assert ems.stats()["requests"] == {"401": 5}


def test_bearer_token_is_accepted_verbatim(tmp_path: Path) -> None:
    with LocalEmsServer(tmp_path, "Bearer xyz.token") as server:
        assert push(server.items_url(), {"id": ["a"]}, auth="Bearer xyz.token").status_code == 200
        assert push(server.items_url(), {"id": ["a"]}, auth="AppKey xyz.token").status_code == 401


def test_missing_target_name_is_400(ems: LocalEmsServer) -> None:
    response = push(ems.items_url(), {"id": ["a"]}, target=None)
    assert response.status_code == 400
    assert "targetName" in response.text
    assert response.headers["Content-Type"].startswith("text/plain")


def test_bad_multipart_and_unreadable_parquet_are_400_saying_why(ems: LocalEmsServer) -> None:
    params = {"targetName": "orders"}
    headers = {"Authorization": AUTH}
    not_multipart = requests.post(ems.items_url(), params=params, headers=headers, data=b"PAR1", timeout=10)
    assert not_multipart.status_code == 400
    assert "multipart/form-data" in not_multipart.text
    wrong_field = requests.post(ems.items_url(), params=params, headers=headers,
                                files={"upload": ("x.parquet", parquet_bytes({"id": ["a"]}))}, timeout=10)
    assert wrong_field.status_code == 400
    assert "`file`" in wrong_field.text
    truncated = requests.post(ems.items_url(), params=params,
                              headers={**headers, "Content-Type": "multipart/form-data; boundary=xyz"},
                              data=b'--xyz\r\nContent-Disposition: form-data; name="file"\r\n\r\nPAR1', timeout=10)
    assert truncated.status_code == 400
    assert "truncated" in truncated.text
    garbage = push(ems.items_url(), b"this is not parquet", file_name="broken.parquet")
    assert garbage.status_code == 400
    assert "broken.parquet" in garbage.text
    assert "Parquet" in garbage.text
    assert ems.uploads() == []


def test_primary_key_or_order_column_missing_from_the_file_is_400_naming_it(ems: LocalEmsServer) -> None:
    response = push(ems.items_url(), {"id": ["a"], "v": [1]}, keys="id,tenant", order="v")
    assert response.status_code == 400
    assert "tenant" in response.text
    response = push(ems.items_url(), {"id": ["a"], "v": [1]}, keys="id", order="_offset")
    assert response.status_code == 400
    assert "_offset" in response.text
    response = push(ems.items_url(), {"id": ["a", None], "v": [1, 2]}, keys="id", order="v")
    assert response.status_code == 400
    assert "null" in response.text


def test_changing_the_primary_keys_of_a_table_is_400(ems: LocalEmsServer) -> None:
    assert push(ems.items_url(), {"id": ["a"], "v": [1]}, keys="id", order="v").status_code == 200
    response = push(ems.items_url(), {"id": ["a"], "v": [1]}, keys="v", order="v")
    assert response.status_code == 400
    assert "primary key" in response.text
    assert push(ems.items_url(), {"id": ["a"], "v": [1]}).status_code == 400  # append into a keyed table


def test_multipart_parser_handles_preamble_quoted_boundary_and_encoded_names() -> None:
    body = (b"preamble\r\n--a'b\r\n"
            b"Content-Disposition: form-data; name=\"note\"\r\n\r\nhello\r\n--a'b\r\n"
            b"Content-Disposition: form-data; name=\"file\"; filename*=UTF-8''K%C3%B6ln.parquet\r\n"
            b"Content-Type: application/octet-stream\r\n\r\n\r\n--a'\r\nPAR1\r\n--a'b--\r\nepilogue")
    parts = parse_form_data(body, 'multipart/form-data; boundary="a\'b"')
    assert [(p.name, p.filename, bytes(p.data)) for p in parts] == [
        ("note", None, b"hello"), ("file", "Köln.parquet", b"\r\n--a'\r\nPAR1")]
    assert single_file_part(parts).filename == "Köln.parquet"


def test_chunked_request_bodies_are_accepted(ems: LocalEmsServer) -> None:
    boundary = "chunky"
    data = parquet_bytes({"id": ["a"], "_offset": [1]})
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"c.parquet\"\r\n"
            "\r\n").encode()
    pieces = [head, data[:100], data[100:], f"\r\n--{boundary}--\r\n".encode()]
    headers = {"Authorization": AUTH, "Content-Type": f"multipart/form-data; boundary={boundary}"}
    response = requests.post(ems.items_url(), params={"targetName": "orders", "primaryKeys": "id"},
                             headers=headers, data=iter(pieces), timeout=10)
    assert response.status_code == 200, response.text
    assert ems.table("orders") == [{"id": "a", "_offset": 1}]


def test_body_larger_than_the_limit_is_413(tmp_path: Path) -> None:
    with LocalEmsServer(tmp_path, AUTH, max_body_bytes=20_000) as server:
        big = {"id": [uuid.uuid4().hex for _ in range(2000)]}
        response = push(server.items_url(), big)
        assert response.status_code == 413
        assert "20000" in response.text
        assert push(server.items_url(), {"id": ["small"]}).status_code == 200


def test_control_api_is_for_loopback_clients_only() -> None:
    assert is_loopback("127.0.0.1")
    assert is_loopback("::1")
    assert is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("192.0.2.2")
    assert not is_loopback("fd00::2")


def test_unknown_paths_and_methods(ems: LocalEmsServer) -> None:
    assert requests.get(ems.url + "/healthz", timeout=5).status_code == 200
    assert requests.get(ems.url + "/nope", timeout=5).status_code == 404
    response = requests.get(ems.items_url(), timeout=5)
    assert response.status_code == 405
    assert response.headers["Allow"] == "POST"


# Success response, stored file and upload log.


def test_success_response_stored_file_and_upload_log(ems: LocalEmsServer) -> None:
    name = "topic-orders_partition-0_firstOffset-0_lastOffset-1.parquet"
    data = parquet_bytes({"id": ["a", "b"], "_offset": [0, 1]})
    before = time.time()
    response = push(ems.items_url("pool-7"), data, keys="id", order="_offset", file_name=name, connectionId="c-1",
                    fallbackVarcharLength="80")
    assert response.status_code == 200
    receipt = response.json()
    assert receipt == {"id": receipt["id"], "fileName": name, "bucketId": "pool-7", "flushStatus": "NEW", "rows": 2}
    uuid.UUID(receipt["id"])
    [entry] = ems.uploads("orders")
    assert entry["id"] == receipt["id"]
    assert (entry["pool"], entry["targetName"], entry["fileName"]) == ("pool-7", "orders", name)
    assert entry["params"] == {"targetName": "orders", "clientId": "tests", "primaryKeys": "id",
                               "duplicateRemovalOrderColumn": "_offset", "connectionId": "c-1",
                               "fallbackVarcharLength": "80"}
    assert (entry["rows"], entry["bytes"]) == (2, len(data))
    assert before <= entry["received_at"] <= time.time()
    stored = ems.data_dir / "uploads" / "orders" / f"{receipt['id']}__{name}"
    assert Path(entry["path"]) == stored
    assert stored.read_bytes() == data
    assert ems.uploads("other") == []


def test_file_names_cannot_escape_the_upload_directory(ems: LocalEmsServer) -> None:
    response = push(ems.items_url(), {"id": ["a"]}, target="../evil", file_name="../../x.parquet")
    assert response.status_code == 200
    assert response.json()["fileName"] == "../../x.parquet"
    path = Path(ems.uploads()[0]["path"]).resolve()
    assert path.is_relative_to((ems.data_dir / "uploads").resolve())


# Upsert semantics.


def test_upsert_keeps_the_highest_order_value_within_and_across_files(ems: LocalEmsServer) -> None:
    first = {"id": ["a", "b", "a", "c", "a"], "v": ["a5", "b1", "a7", "c2", "a6"], "_offset": [5, 1, 7, 2, 6]}
    assert push(ems.items_url(), first, keys="id", order="_offset").status_code == 200
    assert {k: r["v"] for k, r in by_id(ems).items()} == {"a": "a7", "b": "b1", "c": "c2"}
    second = {"id": ["b", "a", "d", "b"], "v": ["b9", "a8", "d0", "b3"], "_offset": [9, 8, 0, 3]}
    assert push(ems.items_url(), second, keys="id", order="_offset").status_code == 200
    assert {k: r["v"] for k, r in by_id(ems).items()} == {"a": "a8", "b": "b9", "c": "c2", "d": "d0"}
    assert ems.count("orders") == 4


def test_a_later_upload_with_a_lower_order_value_does_not_overwrite(ems: LocalEmsServer) -> None:
    assert push(ems.items_url(), {"id": ["a", "b"], "v": ["new", "new"], "_offset": [10, 10]},
                keys="id", order="_offset").status_code == 200
    replay = {"id": ["a", "b"], "v": ["old", "same"], "_offset": [3, 10]}  # equal order: first one stays
    assert push(ems.items_url(), replay, keys="id", order="_offset").status_code == 200
    assert {k: (r["v"], r["_offset"]) for k, r in by_id(ems).items()} == {"a": ("new", 10), "b": ("new", 10)}


def _push_new_then_older(url: str) -> None:
    """A file with offset 10 for key a, then a later file (a replay) with offset 3 for a, 11 for b."""
    assert push(url, {"id": ["a", "b"], "v": ["new", "b0"], "_offset": [10, 0]},
                keys="id", order="_offset").status_code == 200
    replay = {"id": ["a", "b", "a", "b"], "v": ["old", "b2", "older", "b1"], "_offset": [3, 11, 2, 1]}
    assert push(url, replay, keys="id", order="_offset").status_code == 200


def test_order_mode_keeps_the_higher_order_value_across_files(ems: LocalEmsServer) -> None:
    assert ems.upsert_mode == "order"
    _push_new_then_older(ems.items_url())
    assert {k: (r["v"], r["_offset"]) for k, r in by_id(ems).items()} == {"a": ("new", 10), "b": ("b2", 11)}


def test_last_upload_mode_lets_a_later_file_replace_a_higher_order_value(tmp_path: Path) -> None:
    with LocalEmsServer(tmp_path, AUTH, upsert_mode="last-upload") as server:
        _push_new_then_older(server.items_url())
        # Across files the later one wins; inside the later file the highest order value still does.
        assert {k: (r["v"], r["_offset"]) for k, r in by_id(server).items()} == {"a": ("old", 3), "b": ("b2", 11)}
        assert server.stats()["upsert_mode"] == "last-upload"
        # NULL order values: the later file's row replaces the stored one too.
        assert push(server.items_url(), {"id": ["a"], "v": ["null"], "_offset": pa.array([None], pa.int64())},
                    keys="id", order="_offset").status_code == 200
        assert by_id(server)["a"]["v"] == "null"


def test_an_unknown_upsert_mode_is_refused_naming_the_modes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'newest' is not one of order, last-upload"):
        LocalEmsServer(tmp_path, AUTH, upsert_mode="newest")


def test_composite_keys_and_null_order_values_lose(ems: LocalEmsServer) -> None:
    rows = {"tenant": ["t1", "t1", "t2", "t1"], "id": ["a", "a", "a", "b"], "v": [1, 2, 3, 4], "o": [1, None, 1, None]}
    assert push(ems.items_url(), rows, keys="tenant,id", order="o").status_code == 200
    got = {(r["tenant"], r["id"]): r["v"] for r in ems.table("orders")}
    assert got == {("t1", "a"): 1, ("t2", "a"): 3, ("t1", "b"): 4}
    assert push(ems.items_url(), {"tenant": ["t1"], "id": ["b"], "v": [5], "o": [0]},
                keys="tenant,id", order="o").status_code == 200
    assert {(r["tenant"], r["id"]): r["v"] for r in ems.table("orders")}[("t1", "b")] == 5


def test_primary_keys_without_order_column_let_the_last_row_win(ems: LocalEmsServer) -> None:
    assert push(ems.items_url(), {"id": ["a", "a", "b"], "v": [1, 2, 3]}, keys="id").status_code == 200
    assert push(ems.items_url(), {"id": ["b"], "v": [0]}, keys="id").status_code == 200
    assert {k: r["v"] for k, r in by_id(ems).items()} == {"a": 2, "b": 0}


def test_without_primary_keys_every_row_is_appended(ems: LocalEmsServer) -> None:
    for _ in range(2):
        response = push(ems.items_url(), {"id": ["a", "a"], "v": [1, 2]}, target="events", order="v")
        assert response.status_code == 200
    assert [(r["id"], r["v"]) for r in ems.table("events")] == [("a", 1), ("a", 2)] * 2


def test_a_later_file_with_more_columns_adds_them(ems: LocalEmsServer) -> None:
    assert push(ems.items_url(), {"id": ["a", "b"], "_offset": [0, 1]}, keys="id", order="_offset").status_code == 200
    wider = {"id": ["b", "c"], "_offset": [2, 3], "status": ["PAID", "NEW"], "weird \"name\"": [1.5, 2.5]}
    assert push(ems.items_url(), wider, keys="id", order="_offset").status_code == 200
    rows = by_id(ems)
    assert rows["a"] == {"id": "a", "_offset": 0, "status": None, "weird \"name\"": None}
    assert rows["b"] == {"id": "b", "_offset": 2, "status": "PAID", "weird \"name\"": 1.5}
    # A narrower file replaces the whole row: the columns it lacks become NULL.
    assert push(ems.items_url(), {"id": ["c"], "_offset": [4]}, keys="id", order="_offset").status_code == 200
    assert by_id(ems)["c"]["status"] is None


def test_value_types_are_stored_as_documented(ems: LocalEmsServer) -> None:
    table = pa.table({
        "id": pa.array(["a"]),
        "flag": pa.array([True]),
        "count": pa.array([7], pa.int32()),
        "price": pa.array([1.25]),
        "at": pa.array([dt.datetime(2024, 5, 1, 12, 0, 0, 123000)], pa.timestamp("ms")),
        "at_utc": pa.array([dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)], pa.timestamp("us", "Europe/Berlin")),
        "day": pa.array([dt.date(2024, 5, 1)]),
        "tags": pa.array([["x", "y"]]),
        "address": pa.array([{"city": "Köln", "zip": 50667}]),
        "kind": pa.array(["retail"]).dictionary_encode(),
        "raw": pa.array([b"\x00\x01"]),
    })
    assert push(ems.items_url(), table, keys="id", order="at").status_code == 200
    [row] = ems.table("orders")
    assert row == {
        "id": "a", "flag": True, "count": 7, "price": 1.25, "at": "2024-05-01T12:00:00.123",
        "at_utc": "2024-05-01T12:00:00.000000Z", "day": "2024-05-01", "tags": '["x","y"]',
        "address": '{"city":"Köln","zip":50667}', "kind": "retail", "raw": b"\x00\x01",
    }
    later = table.set_column(4, "at", pa.array([dt.datetime(2024, 5, 1, 12, 0, 1)], pa.timestamp("ms")))
    later = later.set_column(3, "price", pa.array([9.0]))
    assert push(ems.items_url(), later, keys="id", order="at").status_code == 200
    assert ems.table("orders")[0]["price"] == 9.0


def test_concurrent_uploads_into_one_table_are_all_applied(ems: LocalEmsServer) -> None:
    def upload(worker: int) -> None:
        for batch in range(3):
            offsets = [worker * 1000 + batch * 100 + n for n in range(100)]
            rows = {"id": [f"k{n % 50}" for n in range(100)], "worker": [worker] * 100, "_offset": offsets}
            assert push(ems.items_url(), rows, keys="id", order="_offset").status_code == 200

    threads = [threading.Thread(target=upload, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ems.uploads("orders")) == 18
    rows = ems.table("orders")
    assert len(rows) == 50
    assert {row["worker"] for row in rows} == {5}  # the highest offsets come from worker 5
    assert ems.stats()["rows"] == 1800


# Fault injection.


def test_fault_by_count_with_retry_after_is_not_stored(ems: LocalEmsServer) -> None:
    ems.inject_fault(503, count=2, retry_after=2)
    for _ in range(2):
        response = push(ems.items_url(), {"id": ["a"]}, keys="id")
        assert response.status_code == 503
        assert response.headers["Retry-After"] == "2"
        body = response.json()
        uuid.UUID(body["reference"])
        assert "injected" in body["message"]
    assert ems.table("orders") == []
    assert push(ems.items_url(), {"id": ["a"]}, keys="id").status_code == 200
    assert len(ems.uploads()) == 1
    stats = ems.stats()
    assert stats["requests"] == {"200": 1, "503": 2}
    assert stats["fault"] is None
    assert stats["upsert_mode"] == "order"


def test_fault_by_seconds_ends_by_itself(ems: LocalEmsServer) -> None:
    ems.inject_fault(429, seconds=0.6)
    response = push(ems.items_url(), {"id": ["a"]})
    assert response.status_code == 429
    assert "Retry-After" not in response.headers
    assert push(ems.items_url(), {"id": ["a"]}).status_code == 429
    time.sleep(0.7)
    assert push(ems.items_url(), {"id": ["a"]}).status_code == 200


def test_delay_and_clearing_faults(ems: LocalEmsServer) -> None:
    ems.inject_fault(delay_ms=300)
    started = time.monotonic()
    assert push(ems.items_url(), {"id": ["a"]}).status_code == 200
    assert time.monotonic() - started >= 0.3
    ems.inject_fault(500)  # no count, no seconds: until cleared
    assert push(ems.items_url(), {"id": ["a"]}).status_code == 500
    assert push(ems.items_url(), {"id": ["a"]}).status_code == 500
    ems.clear_faults()
    assert push(ems.items_url(), {"id": ["a"]}).status_code == 200


def test_control_api_over_http(ems: LocalEmsServer) -> None:
    client = LocalEmsClient(ems.url)
    client.wait_healthy()
    assert client.table("orders") == []
    assert client.count("orders") == 0
    state = client.inject_fault(502, count=1, retry_after=1, delay_ms=10)
    assert state["status"] == 502
    assert state["remaining"] == 1
    assert push(client.items_url(), {"id": ["a"]}, keys="id").status_code == 502
    assert push(client.items_url(), {"id": ["a", "b"], "v": [1, 2]}, keys="id").status_code == 200
    assert by_id(client) == {"a": {"id": "a", "v": 1}, "b": {"id": "b", "v": 2}}
    assert client.count("orders") == 2
    assert [u["rows"] for u in client.uploads("orders")] == [2]
    assert client.uploads("nothing") == []
    assert client.stats()["requests"] == {"200": 1, "502": 1}
    client.inject_fault(503)
    client.clear_faults()
    assert client.stats()["fault"] is None
    raw = requests.get(f"{ems.url}/_control/tables/orders", timeout=5).json()
    assert raw == {"columns": ["id", "v"], "rows": [["a", 1], ["b", 2]]}
    assert requests.get(f"{ems.url}/_control/tables/orders/count", timeout=5).json() == {"count": 2}
    assert requests.get(f"{ems.url}/_control/tables/missing", timeout=5).status_code == 404
    bad = requests.post(f"{ems.url}/_control/faults", json={"status": 503, "cuont": 1}, timeout=5)
    assert bad.status_code == 400
    assert "cuont" in bad.text


def test_the_log_never_contains_the_authorization_value(ems: LocalEmsServer,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="local_ems")
    push(ems.items_url(), {"id": ["a"]})
    push(ems.items_url(), {"id": ["a"]}, auth="AppKey other-" + SECRET)
    push(ems.items_url(), b"garbage")
    assert "-> 200" in caplog.text
    assert "-> 401" in caplog.text
    assert SECRET not in caplog.text


# The CLI, as a separate process.


def _first_line(process: subprocess.Popen[str], timeout_s: float) -> str:
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            raise TimeoutError("the CLI printed no URL")
    return process.stdout.readline().strip()


def test_cli_serves_an_upload_and_stops_on_sigterm(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "local_ems", "--host", "127.0.0.1", "--port", "0",
               "--data-dir", str(tmp_path / "data"), "--authorization", AUTH, "--pool-id", "pool-cli",
               "--upsert-mode", "last-upload"]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        url = _first_line(process, 20)
        assert url.startswith("http://127.0.0.1:")
        assert url.endswith("/continuous-batch-processing/api/v1/pool-cli/items")
        response = push(url, {"id": ["a", "a"], "_offset": [1, 2]}, keys="id", order="_offset")
        assert response.status_code == 200, response.text
        assert push(url, {"id": ["a"]}, auth="AppKey nope").status_code == 401
        client = LocalEmsClient(url)
        assert client.table("orders") == [{"id": "a", "_offset": 2}]
        assert push(url, {"id": ["a"], "_offset": [1]}, keys="id", order="_offset").status_code == 200
        assert client.table("orders") == [{"id": "a", "_offset": 1}]  # last-upload mode: the later file wins
        assert client.stats()["upsert_mode"] == "last-upload"
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
    _, stderr = process.communicate(timeout=5)
    assert "-> 200" in stderr
    assert "-> 401" in stderr
    assert SECRET not in stderr
    assert "stopped" in stderr
    assert json.dumps(AUTH) not in stderr


def test_decimal_keys_beyond_int64_stay_distinct_and_exact(tmp_path):
    """A decimal(38,0) id must not collapse through a float: 12345678901234567890 and ...891 are two rows."""
    server = LocalEmsServer(tmp_path / "ems-decimal", "AppKey k")
    server.start()
    try:
        ids = pa.array([decimal.Decimal("12345678901234567890"), decimal.Decimal("12345678901234567891")],
                       pa.decimal128(38, 0))
        table = pa.table({"id": ids, "amount": pa.array([decimal.Decimal("12.50")] * 2, pa.decimal128(10, 2)),
                          "_offset": pa.array([0, 1], pa.int64())})
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        response = requests.post(server.items_url(), params={"targetName": "big", "primaryKeys": "id",
                                 "duplicateRemovalOrderColumn": "_offset"}, headers={"Authorization": "AppKey k"},
                                 files={"file": ("big.parquet", sink.getvalue().to_pybytes())}, timeout=10)
        assert response.status_code == 200, response.text
        rows = sorted(server.table("big"), key=lambda r: r["id"])
        assert [(r["id"], r["amount"]) for r in rows] == [
            ("12345678901234567890", "12.50"), ("12345678901234567891", "12.50")]
    finally:
        server.stop()
