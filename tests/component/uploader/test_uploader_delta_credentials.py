# ruff: noqa: F811  (the place/parquet fixtures are imported from test_uploader_delta)
"""The Delta target's temporary credentials from real sources, on moto's S3 server (issue #37 item 10):

- web identity through moto's STS (AssumeRoleWithWebIdentity gives new keys at each call): the storage
  options stay identical between merges and the opened table is kept, not reloaded;
- a container credentials endpoint (the protocol of ECS and EKS Pod Identity, served here on loopback)
  that answers 500 for a while: the merge is retried within its budget and succeeds, instead of ending
  the service; later merges reuse the keys without asking the endpoint again.
"""

from __future__ import annotations

import datetime
import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from tests.component.uploader.test_uploader_delta import (  # noqa: F401 (fixtures)
    Place,
    parquet,
    place,
    row,
    span,
)
from uploader.delta_storage import storage_options
from uploader.retry import RetryPolicy

pytestmark = pytest.mark.usefixtures("aws_env")


def without_keys(monkeypatch) -> None:
    """No keys in the environment: the chain goes on to the role sources."""
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")


@pytest.mark.parametrize("place", ["s3"], indirect=True)
def test_web_identity_keys_are_reused_between_merges_and_the_table_is_not_reloaded(place: Place, parquet,
                                                                                   monkeypatch, tmp_path):
    without_keys(monkeypatch)
    token = tmp_path / "web-identity-token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzaW5rIn0.c2lnbmF0dXJl")
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/sink")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", place.settings.endpoint_url)

    options = storage_options(place.settings)
    assert options["AWS_ACCESS_KEY_ID"] != "testing-key-id" and options["AWS_SESSION_TOKEN"]  # from STS
    assert storage_options(place.settings) == options

    target = place.target()
    opened = []
    for k in range(4):
        target.upload(parquet([row(k, k)]), span([row(k, k)]))
        opened.append(target._tables[place.uri.replace("{topic}", "orders")])
    assert all(table is opened[0][0] and key == opened[0][1] for table, key in opened)
    assert set(place.rows()) == {0, 1, 2, 3}


class CredentialsEndpoint:
    """A container credentials endpoint on loopback: the first `failures` requests answer 500."""

    def __init__(self, failures: int) -> None:
        self.failures, self.requests = failures, 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.requests += 1
                if owner.requests <= owner.failures:
                    self.send_response(500)
                    self.end_headers()
                    return
                expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
                body = json.dumps({"AccessKeyId": f"ASIACONTAINER{owner.requests}", "SecretAccessKey": "secret",
                                   "Token": f"token-{owner.requests}",
                                   "Expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v2/credentials"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def endpoint() -> Iterator[CredentialsEndpoint]:
    served = CredentialsEndpoint(failures=3)  # botocore asks 3 times (1 s apart) before it gives up
    yield served
    served.server.shutdown()
    served.server.server_close()


@pytest.mark.parametrize("place", ["s3"], indirect=True)
def test_a_credentials_endpoint_that_fails_for_a_while_is_retried_within_the_upload_budget(
        place: Place, parquet, monkeypatch, endpoint: CredentialsEndpoint):
    without_keys(monkeypatch)
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", endpoint.url)
    target = place.target(retry=RetryPolicy(max_elapsed_s=30.0, initial_backoff_s=0.05, max_backoff_s=0.2))
    retried: list[str] = []

    receipt = target.upload(parquet([row(1, 0)]), span([row(1, 0)]), on_retry=lambda e, n, w: retried.append(e.reason))
    assert receipt.attempts == 2 and retried == ["credentials"]
    assert endpoint.requests == 4  # three 500s in the first attempt, keys in the second
    for k in range(2, 5):
        target.upload(parquet([row(k, k)]), span([row(k, k)]))
    assert endpoint.requests == 4  # reused: valid for an hour
    assert set(place.rows()) == {1, 2, 3, 4}
