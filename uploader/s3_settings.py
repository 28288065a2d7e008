"""What an S3 target is told, without boto3: settings travel to every executor, and most
services (EMS, directory targets) never build an S3 client, so they do not import one (~9 MB and
~80 ms per Python worker)."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from uploader.masking import settings_repr
from uploader.retry import RetryPolicy
from uploader.target import FileMetadata

BUCKET_SETTING = "SINK_S3_BUCKET"
PREFIX_SETTING = "SINK_S3_PREFIX"
ENDPOINT_URL_SETTING = "SINK_S3_ENDPOINT_URL"
REGION_SETTING = "SINK_S3_REGION"
PART_SIZE_SETTING = "SINK_S3_MULTIPART_PART_SIZE"
FILE_SIZE_SETTING = "SINK_FLUSH_BYTES"
# Not a SINK_* variable on purpose: credentials come from boto3's chain, never from our settings.
CREDENTIALS_SETTING = "AWS credentials (AWS_ACCESS_KEY_ID/profile/role)"

MIB = 1024 * 1024
MIN_PART_SIZE = 5 * MIB  # S3's minimum for every part but the last
MAX_PART_SIZE = 5 * 1024 * MIB
DEFAULT_PART_SIZE = 16 * MIB


@dataclass(frozen=True)
class S3Settings:
    """Frozen, hashable and picklable: the driver ships it to executors, which build their own S3Target."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None  # an S3-compatible store that is not AWS; path-style addressing
    region: str | None = None  # None: boto3's default (AWS_REGION, AWS_DEFAULT_REGION, profile)
    part_size: int = DEFAULT_PART_SIZE  # multipart threshold and part size, bytes
    request_timeout_s: float = 60.0  # connect and read timeout of one HTTP request
    request_attempts: int = 3  # botocore's own attempts per HTTP request (see the module docstring)
    ca_bundle: str | None = None  # PEM file to verify the endpoint against; None: boto3's default CAs
    retry: RetryPolicy = field(default_factory=RetryPolicy)  # whole-file retries

    def __post_init__(self) -> None:
        if not self.bucket or "/" in self.bucket:
            raise ValueError(f"{BUCKET_SETTING} must be a bare bucket name, got {self.bucket!r}")
        if not MIN_PART_SIZE <= self.part_size <= MAX_PART_SIZE:
            raise ValueError(f"{PART_SIZE_SETTING} must be between 5 MiB ({MIN_PART_SIZE}) and 5 GiB bytes")
        if self.endpoint_url is not None:
            parts = urlsplit(self.endpoint_url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{ENDPOINT_URL_SETTING} must be an http(s) URL like https://minio.internal:9000")
        if self.request_timeout_s <= 0:
            raise ValueError("the S3 request timeout must be > 0 seconds")
        if self.request_attempts < 1:
            raise ValueError("S3 request_attempts must be >= 1")

    def object_key(self, metadata: FileMetadata) -> str:
        return metadata.object_key(self.prefix)

    def uri(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}"

    def __repr__(self) -> str:
        return settings_repr(self)
