"""A minimal Kafka Produce request, written byte by byte, for records no Python client can make.

confluent-kafka takes header names as `str` only (a `bytes` name is sent as its `repr`, a name
with surrogates crashes the interpreter), but the protocol carries names as raw bytes and clients
in other languages (Go's sarama and franz-go, librdkafka from C) write any bytes there. This
module sends one Produce request (v3, record batch v2, CRC-32C) to a single-broker cluster, so a
test can put a header name that is not UTF-8 on a real broker.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Sequence

_CRC32C_TABLE: list[int] = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC32C_TABLE.append(_c)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _varint(value: int) -> bytes:
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = zigzag & 0x7F
        zigzag >>= 7
        if zigzag:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _bytes_field(data: bytes | None) -> bytes:
    return _varint(-1) if data is None else _varint(len(data)) + data


Header = tuple[bytes, bytes | None]
Record = tuple[bytes | None, bytes | None, Sequence[Header]]  # key, value, headers (names as raw bytes)


def record_batch(records: Sequence[Record], timestamp_ms: int) -> bytes:
    body = bytearray()
    for delta, (key, value, headers) in enumerate(records):
        record = (b"\x00" + _varint(0) + _varint(delta) + _bytes_field(key) + _bytes_field(value)
                  + _varint(len(headers)) + b"".join(_bytes_field(n) + _bytes_field(v) for n, v in headers))
        body += _varint(len(record)) + record
    after_crc = (struct.pack(">hiqqqhii", 0, len(records) - 1, timestamp_ms, timestamp_ms, -1, -1, -1, len(records))
                 + bytes(body))
    after_length = struct.pack(">ibI", -1, 2, crc32c(after_crc)) + after_crc
    return struct.pack(">qi", 0, len(after_length)) + after_length


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def produce(bootstrap: str, topic: str, partition: int, records: Sequence[Record], timeout_s: float = 10.0) -> int:
    """Produce `records` as one batch with acks=all; return the base offset, raise on a broker error."""
    batch = record_batch(records, int(time.time() * 1000))
    request = (struct.pack(">hhi", 0, 3, 1) + _string("kafka-wire-test")  # Produce v3, correlation id 1
               + struct.pack(">hhi", -1, -1, int(timeout_s * 1000))  # no transactional id, acks=all
               + struct.pack(">i", 1) + _string(topic)
               + struct.pack(">i", 1) + struct.pack(">ii", partition, len(batch)) + batch)
    host, _, port = bootstrap.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        size = struct.unpack(">i", _read(sock, 4))[0]
        response = _read(sock, size)
    # correlation id, [topic count, name, [partition count, index, error, base offset, ...]]
    pos = 4 + 4
    name_len = struct.unpack_from(">h", response, pos)[0]
    pos += 2 + name_len + 4
    _index, error, base_offset = struct.unpack_from(">ihq", response, pos)
    if error:
        raise RuntimeError(f"produce to {topic}/{partition} failed with Kafka error code {error}")
    return base_offset


def _read(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        data += chunk
    return bytes(data)
