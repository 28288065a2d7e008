"""Push closed Parquet files to an upsert endpoint, with classified retries.

Independent of Spark and of the service so it can run inside executors and from a shell by hand.
Modules, in the order a file meets them:
  target     FileMetadata, Receipt and the UploadTarget interface
  ems        the Celonis EMS continuous-push target (multipart.py builds its request body,
             proxy.py its proxy URL)
  delta      the Delta Lake target: files merged (latest row per key) with their offsets in the same
             commit, exactly once (delta_settings.py holds what it is told, without deltalake;
             delta_staging.py stages a task's files for the driver's merge of a micro-batch)
  retry      time-bounded retries with backoff, jitter and Retry-After
  classify   which HTTP outcomes retry and which need a person (errors.py holds the exceptions)
  masking    keeps credentials out of reprs, logs and messages
"""

from uploader.errors import FatalUploadError, RetriesExhaustedError, RetryableUploadError, UploadError
from uploader.retry import RetryPolicy, call_with_retries
from uploader.target import FileMetadata, Receipt, UploadTarget

__all__ = [
    "FatalUploadError",
    "FileMetadata",
    "Receipt",
    "RetriesExhaustedError",
    "RetryPolicy",
    "RetryableUploadError",
    "UploadError",
    "UploadTarget",
    "call_with_retries",
]
