"""How delta-rs reaches a table: the storage options for a directory or an s3:// table.

delta-rs does not read boto3's credential chain, so the credentials are resolved with boto3 (keys,
profile, role, web identity) and passed explicitly. The target that merges files and `sink-service
verify` that reads the table back open it the same way.
"""

from __future__ import annotations

from uploader.delta_settings import DeltaSettings
from uploader.errors import FatalUploadError
from uploader.s3_settings import CREDENTIALS_SETTING


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
    return options
