"""TLS verification against a real local HTTPS server with a self-signed certificate.

A certificate that does not verify is a configuration problem, not an outage: it must stop at once
with a message naming SINK_TLS_CA_BUNDLE, and succeed once that setting names the CA.
"""

from __future__ import annotations

import datetime
import http.server
import io
import ipaddress
import json
import ssl
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sink_service.config import ConfigError, load_config
from sink_service.config.upload_targets import target_settings
from tests.support.uploader_fixtures import metadata_builder
from uploader import cli
from uploader.classify import CA_BUNDLE_SETTING, error_for_exception
from uploader.ems import EmsSettings, EmsTarget
from uploader.errors import FatalUploadError, RetryableUploadError
from uploader.retry import RetryPolicy
from uploader.s3 import S3Target
from uploader.s3_settings import S3Settings

AUTH = "AppKey tls-test-key-0123456789"
# A generous budget: an error that were retried would show up as many connections and seconds.
BUDGET = RetryPolicy(max_elapsed_s=5.0, initial_backoff_s=0.05, max_backoff_s=0.2)
metadata = metadata_builder()


def self_signed(directory: Path, common_name: str) -> tuple[Path, Path]:
    """A self-signed CA certificate valid for 127.0.0.1 and localhost: (certificate PEM, key PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{common_name}.pem", directory / f"{common_name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"), "endpoint-ca")


class HttpsEndpoint:
    """Answers POST like EMS (a JSON receipt) and PUT like S3 (200 with an ETag); counts connections."""

    def __init__(self, certificate: tuple[Path, Path]) -> None:
        self.connections = 0
        self.requests: list[str] = []
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self._answer({"Content-Type": "application/json"}, json.dumps({"id": "tls-receipt-1"}).encode())

            def do_PUT(self) -> None:
                self._answer({"ETag": '"0123456789abcdef"'}, b"")

            def do_GET(self) -> None:  # a schema registry's schema by id
                self._answer({"Content-Type": "application/json"}, json.dumps({"schema": '"string"'}).encode())

            def do_CONNECT(self) -> None:  # asked to act as a forward proxy: record, refuse to tunnel
                endpoint.requests.append(f"{self.command} {self.path}")
                self.send_error(502)

            def _answer(self, headers: dict[str, str], body: bytes) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                endpoint.requests.append(f"{self.command} {self.path}")
                self.send_response(200)
                for name, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            def get_request(self):  # every TCP connection, whether its handshake succeeds or not
                endpoint.connections += 1
                return super().get_request()

            def handle_error(self, request, client_address) -> None:
                pass  # the client rejecting our certificate is what these tests provoke

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*certificate)
        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def https(certificate):
    server = HttpsEndpoint(certificate)
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """No proxy or CA bundle from the machine; dummy AWS credentials through boto3's chain."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "AWS_CA_BUNDLE", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret-key")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def parquet_file(tmp_path) -> Path:
    path = tmp_path / "topic-orders_partition-3_firstOffset-10_lastOffset-12.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "_offset": [10, 11, 12]}), path)
    return path


def ems_target(https: HttpsEndpoint, ca_bundle: Path | None) -> EmsTarget:
    return EmsTarget(EmsSettings(
        endpoint=f"{https.url}/continuous-batch-processing/api/v1/pool/items", authorization=AUTH,
        ca_bundle=None if ca_bundle is None else str(ca_bundle), retry=BUDGET, request_timeout_s=5.0,
    ))


def s3_target(https: HttpsEndpoint, ca_bundle: Path | None) -> S3Target:
    return S3Target(S3Settings(
        bucket="lake", endpoint_url=https.url, region="us-east-1",
        ca_bundle=None if ca_bundle is None else str(ca_bundle),
        retry=BUDGET, request_timeout_s=5.0, request_attempts=1,
    ))


def assert_fatal_naming_the_ca_setting(upload, https: HttpsEndpoint) -> None:
    started = time.monotonic()
    with pytest.raises(FatalUploadError) as caught:
        upload()
    assert caught.value.setting == CA_BUNDLE_SETTING == "SINK_TLS_CA_BUNDLE"
    assert "SINK_TLS_CA_BUNDLE" in str(caught.value) and "certificate" in str(caught.value)
    assert https.connections == 1 and https.requests == []  # one handshake, no retry, nothing sent
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("make_target", [ems_target, s3_target], ids=["ems", "s3"])
def test_unverifiable_certificate_is_fatal_at_once_and_names_the_ca_setting(https, parquet_file, make_target):
    with make_target(https, None) as target:
        assert_fatal_naming_the_ca_setting(lambda: target.upload(parquet_file, metadata()), https)


@pytest.mark.parametrize("make_target", [ems_target, s3_target], ids=["ems", "s3"])
def test_the_ca_bundle_makes_the_upload_succeed(https, parquet_file, certificate, make_target):
    with make_target(https, certificate[0]) as target:
        receipt = target.upload(parquet_file, metadata())
    assert receipt.attempts == 1
    assert len(https.requests) == 1


@pytest.mark.parametrize("make_target", [ems_target, s3_target], ids=["ems", "s3"])
def test_a_ca_bundle_without_the_endpoint_ca_is_fatal_too(https, parquet_file, tmp_path, make_target):
    unrelated, _ = self_signed(tmp_path, "unrelated-ca")
    with make_target(https, unrelated) as target:
        assert_fatal_naming_the_ca_setting(lambda: target.upload(parquet_file, metadata()), https)


def test_other_tls_failures_stay_retryable():
    # A handshake cut short by the network is an outage, not a configuration problem.
    error = error_for_exception(
        requests.exceptions.SSLError("EOF occurred in violation of protocol"),
        what="w", url_setting="URL", header_setting="HDR", proxy_setting="PROXY",
    )
    assert isinstance(error, RetryableUploadError) and error.reason == "tls"


# --- configuration and the uploader CLI ---------------------------------------------------------------


def test_config_plumbs_the_ca_bundle_into_ems_and_s3_settings(certificate):
    base = {"SINK_KAFKA_BOOTSTRAP_SERVERS": "k:9092", "SINK_TOPICS": "orders",
            "SINK_TLS_CA_BUNDLE": str(certificate[0])}
    ems = load_config({**base, "SINK_EMS_ENDPOINT": "https://t.r.celonis.cloud/items", "SINK_EMS_AUTHORIZATION": AUTH,
                       "SINK_EMS_TARGET_TABLE": "t"})
    assert target_settings(ems).ca_bundle == str(certificate[0])
    s3 = load_config({**base, "SINK_TARGET": "s3", "SINK_S3_BUCKET": "lake"})
    assert target_settings(s3).ca_bundle == str(certificate[0])


@pytest.mark.parametrize("content", [None, "not a certificate\n", ""])
def test_a_ca_bundle_that_is_missing_or_not_pem_is_a_config_problem(tmp_path, content):
    path = tmp_path / "ca.pem"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        load_config({"SINK_TARGET": "dir", "SINK_DIR_PATH": str(tmp_path), "SINK_TLS_CA_BUNDLE": str(path)},
                    scope="target")
    assert len(caught.value.problems) == 1 and "SINK_TLS_CA_BUNDLE" in caught.value.problems[0]


def run_cli(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return cli.main(list(args), environ=env, stdout=out, stderr=err), out.getvalue(), err.getvalue()


@pytest.mark.parametrize("target", ["ems", "s3"])
def test_cli_push_without_then_with_the_ca_bundle(https, parquet_file, certificate, target):
    env = {
        "SINK_TARGET": target, "SINK_UPLOAD_RETRY_BUDGET_MS": "5000",
        "SINK_EMS_ENDPOINT": f"{https.url}/items", "SINK_EMS_AUTHORIZATION": AUTH, "SINK_EMS_TARGET_TABLE": "{topic}",
        "SINK_S3_BUCKET": "lake", "SINK_S3_ENDPOINT_URL": https.url, "SINK_S3_REGION": "us-east-1",
    }
    code, _, err = run_cli("push", str(parquet_file), env=env)
    assert code == cli.EXIT_FATAL, err
    assert "SINK_TLS_CA_BUNDLE" in err and https.requests == []
    code, out, err = run_cli("push", str(parquet_file), env={**env, "SINK_TLS_CA_BUNDLE": str(certificate[0])})
    assert code == cli.EXIT_OK, err
    assert json.loads(out)["attempts"] == 1 and len(https.requests) == 1



def test_an_https_proxy_is_verified_against_the_ca_bundle_too(https, parquet_file, certificate):
    def through_proxy(ca_bundle: Path | None) -> EmsTarget:
        return EmsTarget(EmsSettings(
            endpoint="https://localhost:1/continuous-batch-processing/api/v1/pool/items", authorization=AUTH,
            proxy_url=https.url, ca_bundle=None if ca_bundle is None else str(ca_bundle),
            retry=RetryPolicy(max_elapsed_s=0.2, initial_backoff_s=0.01, max_backoff_s=0.02),
        ))

    with through_proxy(None) as target:
        assert_fatal_naming_the_ca_setting(lambda: target.upload(parquet_file, metadata()), https)
    with through_proxy(certificate[0]) as target, pytest.raises(RetryableUploadError):
        target.upload(parquet_file, metadata())  # the stub refuses to tunnel: an ordinary proxy error
    assert https.requests[0] == "CONNECT localhost:1"  # TLS to the proxy was verified and went through


def test_the_schema_registry_is_verified_against_the_ca_bundle(https, certificate):
    from sink_service.decode.registry import RegistryClient, RegistryRefused, RegistrySettings

    with pytest.raises(RegistryRefused, match="SINK_TLS_CA_BUNDLE") as refused:
        RegistryClient(RegistrySettings(https.url)).schema(1)
    assert https.connections == 1, "a certificate that does not verify must not be retried"
    assert "will not be retried" in str(refused.value)
    trusted = RegistryClient(RegistrySettings(https.url, ca_bundle=str(certificate[0])))
    assert trusted.schema(1) == {"schema": '"string"'}
    assert https.requests[-1].startswith("GET /schemas/ids/1")


@pytest.mark.parametrize("variable", ["REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"])
def test_the_registry_ca_bundle_wins_over_the_environment(https, certificate, tmp_path, monkeypatch, variable):
    """requests lets REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE replace a session's `verify`; SINK_TLS_CA_BUNDLE must not
    be replaced: verified against it whatever those say, in both directions."""
    from sink_service.decode.registry import RegistryClient, RegistryRefused, RegistrySettings

    unrelated, _ = self_signed(tmp_path, "unrelated-ca")
    monkeypatch.setenv(variable, str(unrelated))
    trusted = RegistryClient(RegistrySettings(https.url, ca_bundle=str(certificate[0])))
    assert trusted.schema(1) == {"schema": '"string"'}

    monkeypatch.setenv(variable, str(certificate[0]))  # the environment trusts the registry, the setting does not
    with pytest.raises(RegistryRefused, match="SINK_TLS_CA_BUNDLE"):
        RegistryClient(RegistrySettings(https.url, ca_bundle=str(unrelated))).schema(2)


@pytest.mark.parametrize("make_target", [ems_target, s3_target], ids=["ems", "s3"])
def test_the_upload_ca_bundle_wins_over_the_environment(https, parquet_file, certificate, tmp_path, monkeypatch,
                                                        make_target):
    unrelated, _ = self_signed(tmp_path, "unrelated-ca")
    for variable in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "AWS_CA_BUNDLE"):
        monkeypatch.setenv(variable, str(unrelated))
    with make_target(https, certificate[0]) as target:
        assert target.upload(parquet_file, metadata()).attempts == 1
