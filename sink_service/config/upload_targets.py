"""From configuration to an upload target: the only place the service knows target types.

Spark-free on purpose: the uploader CLI (through the `uploader.config` entry point)
uses it to build the same targets from SINK_* settings.
"""

from __future__ import annotations

from sink_service.config.settings import SinkConfig
from sink_service.config.target import S3_URL_SCHEME
from uploader.delta_settings import DeltaSettings
from uploader.delta_staging import DeltaStagingSettings, DeltaStagingTarget
from uploader.directory import DirectorySettings, DirectoryTarget
from uploader.ems import EmsSettings, EmsTarget
from uploader.parking import ParkingSettings, ParkingTarget
from uploader.retry import RetryPolicy
from uploader.s3_settings import S3Settings
from uploader.target import UploadTarget

TargetSettings = EmsSettings | S3Settings | DirectorySettings | DeltaSettings | DeltaStagingSettings | ParkingSettings


def target_settings(config: SinkConfig) -> TargetSettings:
    """Picklable, hashable settings for `config.target`; executors build the target from them."""
    inner = _plain_settings(config)
    if config.rejected_file_policy != "park":
        return inner
    return ParkingSettings(inner=inner, parked=parked_settings(config, inner.retry))


def task_target_settings(config: SinkConfig) -> TargetSettings:
    """What the tasks upload to. A Delta target's tasks stage their files and the driver merges a
    micro-batch's files in one commit, parking refused ones itself (sink_service.driver.delta_batches)."""
    if config.target == "delta":
        return DeltaStagingSettings(delta=_plain_settings(config))
    return target_settings(config)


def parked_settings(config: SinkConfig, retry: RetryPolicy) -> DirectorySettings | S3Settings:
    """Where rejected files are parked: a directory, or `s3://bucket/prefix` reached with the S3
    target's endpoint, region and CA settings."""
    path = config.parked_path or ""
    if path.startswith(S3_URL_SCHEME):
        bucket, _, prefix = path[len(S3_URL_SCHEME):].partition("/")
        return s3_settings(config, bucket, prefix, retry)
    return DirectorySettings(path=path, retry=retry)


def s3_settings(config: SinkConfig, bucket: str, prefix: str, retry: RetryPolicy) -> S3Settings:
    """A bucket and prefix reached the way the S3 target reaches its own (SINK_S3_*, SINK_TLS_CA_BUNDLE)."""
    return S3Settings(
        bucket=bucket,
        prefix=prefix,
        endpoint_url=config.s3_endpoint_url,
        region=config.s3_region,
        part_size=config.s3_multipart_part_size,
        ca_bundle=config.tls_ca_bundle,
        request_timeout_s=config.upload_timeout_ms / 1000,
        retry=retry,
    )


def _plain_settings(config: SinkConfig) -> EmsSettings | S3Settings | DirectorySettings | DeltaSettings:
    retry = RetryPolicy(max_elapsed_s=config.upload_retry_budget_ms / 1000)
    timeout_s = config.upload_timeout_ms / 1000
    if config.target == "s3":
        return s3_settings(config, config.s3_bucket, config.s3_prefix or "", retry)
    if config.target == "dir":
        return DirectorySettings(path=config.dir_path, retry=retry)
    if config.target == "delta":
        return DeltaSettings(
            table_uri=config.delta_table_uri or "", group_id=config.group_id,
            partition_by=tuple(config.delta_partition_by), hard_deletes=config.delta_hard_deletes,
            endpoint_url=config.s3_endpoint_url, region=config.s3_region, ca_bundle=config.tls_ca_bundle,
            request_timeout_s=timeout_s,
            compact_every_commits=config.delta_compact_every_commits,
            vacuum_every_commits=config.delta_vacuum_every_commits,
            vacuum_retention_hours=config.delta_vacuum_retention_hours,
            widen_to_string=config.delta_widen_to_string, change_log=config.delta_change_log,
            buckets=config.delta_buckets, compact_at_ratio=config.delta_compact_at_changes_percent / 100,
            compact_max_interval_s=config.delta_compact_max_interval_s, retry=retry)
    if config.target != "ems":
        raise ValueError(f"unknown SINK_TARGET {config.target!r}")
    return EmsSettings(
        endpoint=config.ems_endpoint,
        authorization=config.ems_authorization,
        client_id=config.ems_client_id,
        connection_id=config.ems_connection_id,
        fallback_varchar_length=config.ems_fallback_varchar_length,
        proxy_url=config.ems_proxy_url,
        proxy_username=config.ems_proxy_username,
        proxy_password=config.ems_proxy_password,
        ca_bundle=config.tls_ca_bundle,
        request_timeout_s=timeout_s,
        retry=retry,
    )


def build_target(settings: TargetSettings) -> UploadTarget:
    """The target matching the settings' type; runs in every executor that uploads."""
    if isinstance(settings, ParkingSettings):
        return ParkingTarget(build_target(settings.inner), settings.parked)
    if isinstance(settings, EmsSettings):
        return EmsTarget(settings)
    if isinstance(settings, S3Settings):
        from uploader.s3 import S3Target  # boto3 only for an S3 target

        return S3Target(settings)
    if isinstance(settings, DirectorySettings):
        return DirectoryTarget(settings)
    if isinstance(settings, DeltaStagingSettings):
        return DeltaStagingTarget(settings)
    if isinstance(settings, DeltaSettings):
        from uploader.delta_changes import delta_target  # deltalake only for a Delta target

        return delta_target(settings)
    raise TypeError(f"no upload target for {type(settings).__name__}")
