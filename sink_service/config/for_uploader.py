"""What `python -m uploader` reads of the SINK_* configuration: registered in pyproject.toml under the
`uploader.config` entry point, so the uploader's CLI finds it without importing the service."""

from sink_service.config.declare import ConfigError
from sink_service.config.load import load_config
from sink_service.config.settings import declared_fields
from sink_service.config.target import S3_URL_SCHEME
from sink_service.config.upload_targets import build_target, s3_settings, target_settings

__all__ = ["S3_URL_SCHEME", "ConfigError", "build_target", "declared_fields", "load_config", "s3_settings",
           "target_settings"]
