"""From configuration to an upload target: the only place the service knows target types."""

from __future__ import annotations

from collections.abc import Hashable

from sink_service.config import SinkConfig
from uploader.ems import EmsSettings, EmsTarget
from uploader.retry import RetryPolicy
from uploader.target import UploadTarget


def target_settings(config: SinkConfig) -> Hashable:
    """Picklable, hashable settings; executors build the target from them."""
    retry = RetryPolicy(max_elapsed_s=config.upload_retry_budget_ms / 1000)
    return EmsSettings(
        endpoint=config.ems_endpoint,
        authorization=config.ems_authorization,
        client_id=config.ems_client_id,
        connection_id=config.ems_connection_id,
        fallback_varchar_length=config.ems_fallback_varchar_length,
        proxy_url=config.ems_proxy_url,
        proxy_username=config.ems_proxy_username,
        proxy_password=config.ems_proxy_password,
        request_timeout_s=config.upload_timeout_ms / 1000,
        retry=retry,
    )


def build_target(settings: Hashable) -> UploadTarget:
    if isinstance(settings, EmsSettings):
        return EmsTarget(settings)
    raise TypeError(f"no upload target for {type(settings).__name__}")
