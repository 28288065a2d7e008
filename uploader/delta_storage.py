"""How delta-rs reaches a table: the storage options for a directory or an s3:// table.

delta-rs does not read boto3's credential chain, so the credentials are resolved with boto3 (keys,
profile, role, web identity) and passed explicitly. The target that merges files and `sink-service
verify` that reads the table back open it the same way.

TLS. delta-rs (object_store over reqwest and rustls) reads none of boto3's or requests' CA settings.
SINK_TLS_CA_BUNDLE reaches it as the storage option `certificate_path` (delta-rs >= 1.5.1; measured with
1.6.6 in tests/component/uploader/test_delta_tls.py): every certificate in the PEM file is trusted, in
addition to the default roots (the system's, or SSL_CERT_FILE/SSL_CERT_DIR when set) - delta-rs offers no
way to drop those, so unlike the other clients the bundle does not replace them here. An explicit
`certificate_path` also wins over delta-rs's own fallback to SSL_CERT_FILE for that option. No
environment variable is set: SSL_CERT_FILE would reach every TLS client of the process (librdkafka's
default CA store in the executor when SINK_KAFKA_SSL_CA_LOCATION is empty, Python's ssl defaults).
`aws_ca_bundle`, `ca_bundle` and AWS_CA_BUNDLE are ignored by delta-rs (measured).
"""

from __future__ import annotations

import re

from uploader.delta_settings import DeltaSettings
from uploader.errors import FatalUploadError
from uploader.s3_settings import CREDENTIALS_SETTING

CERTIFICATE_PATH_OPTION = "certificate_path"
# How delta-rs words a certificate that does not verify (rustls: UnknownIssuer, NotValidForName, expired,
# ...), and a bundle it cannot load; object_store has retried the request by then (10 times, seconds).
_CERTIFICATE_FAILURE_WORDS = ("invalid peer certificate", "CERTIFICATE_VERIFY_FAILED")
_BUNDLE_FAILURE_WORDS = ("Failed to open certificate file", "Failed to read certificate file",
                         "Failed to parse PEM certificate")


def storage_options(settings: DeltaSettings) -> dict[str, str]:
    """Options for `DeltaTable(uri, storage_options=…)`; empty for a directory.

    Resolved on each call, so a refreshed role or web-identity token is picked up by the next handle."""
    if not settings.on_s3():
        return {}
    import boto3  # only for tables on S3

    session = boto3.session.Session()
    credentials = session.get_credentials()
    if credentials is None:
        raise FatalUploadError(
            f"Delta table {settings.table_uri}: boto3 found no credentials; this will not be retried. "
            f"Check {CREDENTIALS_SETTING}.", reason="no_credentials", setting=CREDENTIALS_SETTING)
    frozen = credentials.get_frozen_credentials()
    options = {
        "AWS_ACCESS_KEY_ID": frozen.access_key,
        "AWS_SECRET_ACCESS_KEY": frozen.secret_key,
        "AWS_REGION": settings.region or session.region_name or "us-east-1",
        "timeout": f"{max(1, round(settings.request_timeout_s))}s",
    }
    if frozen.token:
        options["AWS_SESSION_TOKEN"] = frozen.token
    if settings.endpoint_url:
        options["AWS_ENDPOINT_URL"] = settings.endpoint_url
        if settings.endpoint_url.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    if settings.ca_bundle:
        options[CERTIFICATE_PATH_OPTION] = settings.ca_bundle
    return options


def certificate_failure(exc: BaseException) -> bool:
    """The endpoint's certificate did not verify, or the CA bundle could not be loaded: retrying cannot
    help, a CA (SINK_TLS_CA_BUNDLE) or the endpoint URL must change."""
    text = str(exc)
    return any(word in text for word in (*_CERTIFICATE_FAILURE_WORDS, *_BUNDLE_FAILURE_WORDS))


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # delta-rs colours the arrows of its error chains


def error_text(exc: BaseException) -> str:
    """A delta-rs error as one plain line: without terminal colour codes, whitespace collapsed."""
    return " ".join(_ANSI.sub("", str(exc)).split())
