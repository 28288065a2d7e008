"""SINK_TLS_CA_BUNDLE for Delta tables on S3: moto's S3 server behind a TLS-terminating relay whose
certificate is signed by a private CA (devkit.secured_broker.make_pki).

delta-rs builds its own HTTP client (object_store, reqwest with rustls) and reads no boto3 or requests
setting. Measured with deltalake 1.6.6: the storage option `certificate_path` (a PEM file; every
certificate in it is trusted) is honoured and is added to the default roots; `aws_ca_bundle`,
`ca_bundle`, `AWS_CA_BUNDLE` and `root_certificates` are ignored. A certificate that does not verify is
retried 10 times inside object_store (~2-4 s), then raised as an OSError saying "invalid peer certificate".
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from devkit.secured_broker import Pki, make_pki
from sink_service.check.probe import FAIL, OK
from sink_service.check.target_probes import delta_probe
from sink_service.config import load_config
from sink_service.config.upload_targets import target_settings
from tests.support.uploader_fixtures import metadata_builder
from uploader.classify import CA_BUNDLE_SETTING
from uploader.delta import DeltaFile, DeltaTarget
from uploader.delta_settings import DeltaSettings
from uploader.delta_storage import storage_options
from uploader.errors import FatalUploadError
from uploader.retry import RetryPolicy

pytestmark = pytest.mark.usefixtures("aws_env")

# A budget far longer than object_store's own retries: a certificate failure that were retried by us
# would take it all (and end in RetriesExhaustedError, not a FatalUploadError).
BUDGET = RetryPolicy(max_elapsed_s=20.0, initial_backoff_s=0.05, max_backoff_s=0.5)
metadata = metadata_builder(topic="orders", partition=0, primary_keys=("id",), order_column="_offset")


class TlsRelay:
    """Terminates TLS with the private CA's server certificate and relays the bytes to a plain port.

    On an asyncio loop in a daemon thread (as devkit.secured_broker's front): one SSL object must not be
    read and written from two threads at once, which a thread per direction would do."""

    def __init__(self, pki: Pki, target_port: int) -> None:
        self.handshakes = 0  # TLS handshakes our certificate passed
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki.cert_file, pki.key_file)
        self._target_port = target_port
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="tls-relay", daemon=True).start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=context), self._loop).result(10)
        self.url = f"https://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def stop(self) -> None:
        # On the loop's thread: closing from the test's thread raced the loop (seen once: a teardown
        # TypeError inside asyncio's Server._wakeup).
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.handshakes += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    except (OSError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(OSError, ssl.SSLError, RuntimeError):
            sink.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("delta-tls"))


@pytest.fixture(scope="module")
def relay(pki, moto_url) -> Iterator[TlsRelay]:
    server = TlsRelay(pki, int(moto_url.rsplit(":", 1)[1]))
    yield server
    server.stop()


@pytest.fixture
def bucket(relay, pki) -> str:
    name = f"delta-tls-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=relay.url, region_name="us-east-1", verify=str(pki.ca_file)).create_bucket(
        Bucket=name)
    return name


def settings(relay: TlsRelay, bucket: str, ca_bundle: Path | None) -> DeltaSettings:
    return DeltaSettings(table_uri=f"s3://{bucket}/lake/{{topic}}", group_id="g1", endpoint_url=relay.url,
                         region="us-east-1", ca_bundle=None if ca_bundle is None else str(ca_bundle),
                         request_timeout_s=10.0, retry=BUDGET)


def parquet(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / f"{uuid.uuid4().hex}.parquet"
    pq.write_table(pa.Table.from_pylist(rows, pa.schema([("id", pa.int64()), ("status", pa.string()),
                                                          ("_offset", pa.int64())])), path)
    return path


def span(rows: list[dict]):
    offsets = [r["_offset"] for r in rows]
    return metadata(first_offset=min(offsets), last_offset=max(offsets), record_count=len(rows))


def assert_fatal_naming_the_ca_setting(upload) -> None:
    """`upload(on_retry)` fails at once: fatal, naming the setting, never retried by us. (delta-rs's own
    object_store retries take 2-18 s here, with jitter and load, so time alone cannot tell one attempt of
    ours from several.)"""
    retries: list[str] = []
    started = time.monotonic()
    with pytest.raises(FatalUploadError) as caught:
        upload(lambda error, attempt, wait_s: retries.append(error.reason))
    assert caught.value.setting == CA_BUNDLE_SETTING == "SINK_TLS_CA_BUNDLE"
    assert caught.value.reason == "tls_verify"
    assert "SINK_TLS_CA_BUNDLE" in str(caught.value) and "certificate" in str(caught.value)
    assert "\x1b" not in str(caught.value)  # delta-rs colours its error chains; a log line must not carry that
    assert retries == []  # one attempt of ours: a certificate that does not verify is not worth another
    assert time.monotonic() - started < BUDGET.max_elapsed_s  # and never the whole retry budget


def test_without_the_bundle_a_merge_is_a_fatal_certificate_failure_naming_the_setting(relay, bucket, tmp_path):
    rows = [{"id": 1, "status": "NEW", "_offset": 0}]
    handshakes = relay.handshakes
    with DeltaTarget(settings(relay, bucket, None)) as target:
        assert_fatal_naming_the_ca_setting(lambda on_retry: target.upload(parquet(tmp_path, rows), span(rows),
                                                                            on_retry))
    assert relay.handshakes == handshakes  # delta-rs refused every handshake: nothing reached the store


def test_a_bundle_without_the_endpoint_ca_is_fatal_too(relay, bucket, pki, tmp_path):
    rows = [{"id": 1, "status": "NEW", "_offset": 0}]
    with DeltaTarget(settings(relay, bucket, pki.other_ca_file)) as target:
        assert_fatal_naming_the_ca_setting(lambda on_retry: target.upload(parquet(tmp_path, rows), span(rows),
                                                                            on_retry))


def test_with_the_bundle_the_merge_succeeds_and_the_table_reads_back(relay, bucket, pki, tmp_path):
    # A bundle of several CAs, the endpoint's not first: every certificate in the file counts.
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(pki.other_ca_file.read_bytes() + pki.ca_file.read_bytes())
    first = [{"id": 1, "status": "NEW", "_offset": 0}, {"id": 2, "status": "NEW", "_offset": 1}]
    second = [{"id": 1, "status": "PAID", "_offset": 2}]
    with DeltaTarget(settings(relay, bucket, bundle)) as target:
        assert target.merge([DeltaFile(parquet(tmp_path, first), span(first))])[1] == 1
        details, attempts = target.merge([DeltaFile(parquet(tmp_path, second), span(second))])
        assert attempts == 1 and not details["skipped"]
    options = storage_options(settings(relay, bucket, bundle))
    assert options["certificate_path"] == str(bundle)
    table = DeltaTable(f"s3://{bucket}/lake/orders", storage_options=options)
    assert {r["id"]: r["status"] for r in table.to_pyarrow_table().to_pylist()} == {1: "PAID", 2: "NEW"}
    assert table.transaction_version("kafka-parquet-sink/g1/orders/0") == 3


def test_the_configuration_passes_the_bundle_to_a_delta_table(pki, monkeypatch):
    config = load_config({"SINK_KAFKA_BOOTSTRAP_SERVERS": "k:9092", "SINK_TOPICS": "orders", "SINK_TARGET": "delta",
                          "SINK_DELTA_TABLE_URI": "s3://lake/{topic}", "SINK_S3_ENDPOINT_URL": "https://s3.internal",
                          "SINK_TLS_CA_BUNDLE": str(pki.ca_file)})
    delta = target_settings(config)
    assert isinstance(delta, DeltaSettings) and delta.ca_bundle == str(pki.ca_file)
    assert storage_options(delta)["certificate_path"] == str(pki.ca_file)
    # A directory table has no HTTP client to give it to.
    assert storage_options(DeltaSettings(table_uri="/tables/t", group_id="g", ca_bundle=str(pki.ca_file))) == {}


def test_check_probes_the_table_over_the_private_ca(relay, bucket, pki):
    uri = f"s3://{bucket}/lake/orders"
    refused = delta_probe(settings(relay, bucket, None), uri, timeout_s=5.0)
    assert refused.status == FAIL and refused.fix == CA_BUNDLE_SETTING, refused.line()
    trusted = delta_probe(settings(relay, bucket, pki.ca_file), uri, timeout_s=5.0)
    assert trusted.status == OK and "not created yet" in trusted.reason, trusted.line()
