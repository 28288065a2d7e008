"""FileMetadata naming, and the streamed multipart body that carries the file."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from werkzeug.formparser import parse_form_data

from uploader.multipart import MultipartFileBody, multipart_bytes
from uploader.target import FileMetadata, Receipt


def meta(**overrides) -> FileMetadata:
    values = dict(
        topic="orders.v1",
        partition=7,
        first_offset=42,
        last_offset=99,
        record_count=58,
        target_table="ORDERS",
        primary_keys=(),
        order_column=None,
        schema_fingerprint="0f0f",
    )
    values.update(overrides)
    return FileMetadata(**values)


def test_file_name_is_informative():
    assert meta().file_name() == "topic-orders.v1_partition-7_firstOffset-42_lastOffset-99.parquet"


def test_object_key_is_deterministic_and_sortable():
    assert meta().object_key() == "orders.v1/7/00000000000000000042-00000000000000000099.parquet"
    assert meta().object_key("raw") == "raw/orders.v1/7/00000000000000000042-00000000000000000099.parquet"
    assert meta().object_key("/raw/x/").startswith("raw/x/orders.v1/7/")
    keys = [meta(first_offset=f, last_offset=f + 1).object_key() for f in (9, 10, 100)]
    assert keys == sorted(keys)


def test_metadata_and_receipt_are_hashable_values():
    assert meta() == meta() and hash(meta()) == hash(meta())
    receipt = Receipt("ems", "id-1", "id-1", 10, 1, 0.1, details={"flushStatus": "NEW"})
    assert receipt == Receipt("ems", "id-1", "id-1", 10, 1, 0.1)
    assert hash(receipt)


@pytest.mark.parametrize("size", [0, 1, 65535, 65536, 200_001])
def test_multipart_body_round_trips(tmp_path, size):
    path = tmp_path / "f.parquet"
    data = bytes(i % 251 for i in range(size))
    path.write_bytes(data)
    with MultipartFileBody(path, field_name="file", file_name='a"b.parquet') as body:
        content_type = body.content_type
        length = len(body)
        chunks = []
        while chunk := body.read(4093):  # odd size, crossing the head/file/tail borders
            chunks.append(chunk)
    raw = b"".join(chunks)
    assert len(raw) == length
    environ = {
        "wsgi.input": io.BytesIO(raw),
        "CONTENT_LENGTH": str(len(raw)),
        "CONTENT_TYPE": content_type,
        "REQUEST_METHOD": "POST",
    }
    _, form, files = parse_form_data(environ)
    assert not form
    assert files["file"].filename == 'a"b.parquet'  # sent as a%22b.parquet, decoded per WHATWG
    assert files["file"].read() == data


def test_multipart_read_all_and_iteration_agree(tmp_path):
    path = tmp_path / "f.parquet"
    path.write_bytes(b"PAR1" * 50_000)
    bodies = []
    for read in (lambda b: b.read(), lambda b: b"".join(b)):
        with MultipartFileBody(path, field_name="file", file_name="f.parquet") as body:
            bodies.append(read(body).replace(body.boundary.encode(), b"B"))
    assert bodies[0] == bodies[1]


@pytest.mark.parametrize("size", [0, 1, 65537])
def test_multipart_bytes_are_the_streamed_body(tmp_path, size):
    # A small file is sent as one bytes object: the same wire format as the stream, byte for byte.
    path = tmp_path / "f.parquet"
    path.write_bytes(bytes(i % 251 for i in range(size)))
    names = {"field_name": "file", "file_name": 'a"b\r\n.parquet', "content_type": "application/octet-stream"}
    whole, content_type = multipart_bytes(path, **names)
    boundary = content_type.removeprefix("multipart/form-data; boundary=")
    with MultipartFileBody(path, **names) as body:
        streamed = b"".join(body).replace(body.boundary.encode(), boundary.encode())
        assert content_type == body.content_type.replace(body.boundary, boundary)
    assert whole == streamed


def test_multipart_detects_a_file_that_shrank(tmp_path):
    path = tmp_path / "f.parquet"
    path.write_bytes(b"x" * 1000)
    with MultipartFileBody(path, field_name="file", file_name="f") as body:
        path.write_bytes(b"x" * 10)
        with pytest.raises(OSError, match="shrank"):
            body.read()


def test_uploader_does_not_pull_in_spark_or_the_service():
    code = (
        "import sys, uploader, uploader.ems, uploader.retry; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('pyspark', 'sink_service')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
