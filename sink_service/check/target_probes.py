"""What `sink-service check` asks the target, the parking place and the schema registry.

The target is built from the same settings the service builds it from (`target_settings`), and its
errors are classified by the target's own rules, so a line names the setting the service would name.

- S3: one small object written under the prefix (`<prefix>/_sink_check/<uuid>`) and deleted again;
  the S3 target itself never needs s3:DeleteObject, so a refused delete is a warning naming the object.
- dir: a hidden probe file created, fsynced and removed in the directory (or, for a directory the
  service would create, its nearest existing parent writable).
- EMS: one POST without a table or a file. The endpoint checks the credential before the request's
  shape (as `local_ems` does, in a gateway's order), so 401/403 mean the key, and 400 means the key
  was accepted and the empty request refused: nothing can be stored without a `file` part. Any other
  answer proves nothing about the key, which is said plainly rather than uploading data to find out.
- Delta: each table the named topics go to, opened as the target opens it (its version and
  partitioning said); where it exists or will be created, the same write probe as for a directory or
  an S3 prefix, so a read-only mount or bucket fails here rather than at the first merge. On S3 the
  probe object is deleted with DeleteObjects, as the service deletes its staged files (vacuum deletes
  through the same call): the service needs s3:DeleteObject under the table, so a refused delete fails.
- schema registry: `GET /subjects`, with the basic auth and CA bundle the decoders use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from sink_service.check.probe import FAIL, OK, SKIP, WARN, Probe
from uploader.errors import FatalUploadError, UploadError
from uploader.masking import mask_userinfo, redact

if TYPE_CHECKING:
    from sink_service.config import SinkConfig
    from uploader.delta_settings import DeltaSettings
    from uploader.directory import DirectorySettings
    from uploader.ems import EmsSettings
    from uploader.s3_settings import S3Settings

PROBE_DIR = "_sink_check"
PROBE_BODY = b"written by `sink-service check` to prove this prefix is writable; deleted at once, safe to delete\n"


def target_probes(config: SinkConfig, timeout_s: float) -> list[Probe]:
    """The configured target, then the parking place when rejected files are parked."""
    from sink_service.config.upload_targets import parked_settings, target_settings
    from uploader.delta_settings import DeltaSettings
    from uploader.directory import DirectorySettings
    from uploader.ems import EmsSettings
    from uploader.parking import ParkingSettings
    from uploader.s3_settings import S3Settings

    settings = target_settings(config)
    inner = settings.inner if isinstance(settings, ParkingSettings) else settings
    probes: list[Probe] = []
    if isinstance(inner, S3Settings):
        probes.append(s3_probe(inner, timeout_s, "S3 target"))
    elif isinstance(inner, DirectorySettings):
        probes.append(dir_probe(inner, "dir target", "SINK_DIR_PATH"))
    elif isinstance(inner, EmsSettings):
        probes.append(ems_probe(inner, timeout_s))
    elif isinstance(inner, DeltaSettings):
        probes += delta_probes(inner, config.topics, timeout_s)
    if isinstance(settings, ParkingSettings):
        parked = parked_settings(config, inner.retry)
        probes.append(s3_probe(parked, timeout_s, "parked files (SINK_PARKED_PATH)", "SINK_PARKED_PATH")
                      if isinstance(parked, S3Settings)
                      else dir_probe(parked, "parked files", "SINK_PARKED_PATH"))
    return probes


# --- S3 -------------------------------------------------------------------------------------------
def probe_key(prefix: str) -> str:
    return "/".join(part for part in (prefix.strip("/"), PROBE_DIR, uuid.uuid4().hex) if part)


def s3_probe(settings: S3Settings, timeout_s: float, label: str, bucket_setting: str | None = None,
             deletes: bool = False) -> Probe:
    """Put and delete a small object under the prefix, one attempt each, within the timeout.

    `deletes`: the service deletes under this prefix (a Delta table's staged files, vacuum), so the object
    is deleted as the service deletes (DeleteObjects, which S3 refuses key by key) and a refusal fails."""
    from uploader.delta_staging import DELETE_PERMISSION_HINT
    from uploader.s3 import S3Target, classify_error
    from uploader.s3_settings import CREDENTIALS_SETTING

    quick = dataclasses.replace(settings, request_timeout_s=timeout_s / 2, request_attempts=1)
    what = f"{label} {settings.uri(settings.prefix.strip('/'))}"
    key = probe_key(settings.prefix)
    try:
        target = S3Target(quick)
    except Exception as exc:  # botocore refuses a setting before any request (a region name, ...)
        error = classify_error(exc, what=f"S3 client for {settings.uri()}")
        return _upload_failure(what, error, bucket_setting)
    with target:
        try:
            target.put_object(key, PROBE_BODY, "text/plain")
        except UploadError as error:
            return _upload_failure(what, error, bucket_setting)
        try:
            if deletes:
                answer = target.client.delete_objects(Bucket=settings.bucket, Delete={
                    "Objects": [{"Key": key}], "Quiet": True})
                refused = answer.get("Errors", [])
                if refused:
                    return Probe(FAIL, what, f"writable, but deleting {settings.uri(key)} was refused "
                                 f"({refused[0].get('Code')}: {refused[0].get('Message')}); "
                                 f"{DELETE_PERMISSION_HINT} (then delete the probe object by hand)",
                                 CREDENTIALS_SETTING)
            else:
                target.client.delete_object(Bucket=settings.bucket, Key=key)
        except Exception as exc:
            error = classify_error(exc, what=f"S3 delete of {settings.uri(key)}")
            if deletes:
                return Probe(FAIL, what, f"writable, but deleting {settings.uri(key)} failed ({_reason(error)}); "
                             f"{DELETE_PERMISSION_HINT} (then delete the probe object by hand)",
                             error.setting if isinstance(error, FatalUploadError)
                             else "SINK_S3_ENDPOINT_URL (or the network to it)")
            return Probe(WARN, what, f"writable, but the probe object {settings.uri(key)} could not be deleted "
                         f"({_reason(error)}); the S3 target never deletes, so this is harmless: delete it by "
                         "hand", None)
    return Probe(OK, what, f"wrote and deleted {settings.uri(key)}")


def _upload_failure(what: str, error: UploadError, bucket_setting: str | None) -> Probe:
    setting = error.setting if isinstance(error, FatalUploadError) else None
    if bucket_setting and setting == "SINK_S3_BUCKET":
        setting = bucket_setting  # the parking bucket comes from SINK_PARKED_PATH
    if setting is None:
        setting = "SINK_S3_ENDPOINT_URL (or the network to it)" if error.status is None else None
    return Probe(FAIL, what, _reason(error), setting)


def _reason(error: BaseException) -> str:
    """An uploader error without its own "Check X." advice (the line's fix part says it)."""
    text = str(error)
    text = re.sub(r"\s*Check [^.]*\.(?=\s|$)", "", text)
    text = text.replace(" and will not be retried", "").replace("; this will not be retried", "")
    return " ".join(text.split())


# --- dir ------------------------------------------------------------------------------------------
def dir_probe(settings: DirectorySettings, label: str, setting: str) -> Probe:
    """Create, fsync and remove a hidden probe file; a missing directory needs a writable parent."""
    root = Path(settings.path)
    what = f"{label} {root}"
    if root.exists() and not root.is_dir():
        return Probe(FAIL, what, "is not a directory", setting)
    if not root.exists():
        parent = next((p for p in root.parents if p.exists()), None)
        if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            return Probe(FAIL, what, f"does not exist, and {parent} is not writable to create it", setting)
        return Probe(OK, what, f"does not exist yet; the service creates it in {parent} (writable, "
                     f"{_free(parent)} free)")
    probe = root / f".sink-check-{uuid.uuid4().hex}{'.tmp-probe'}"
    try:
        descriptor = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(descriptor, PROBE_BODY)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    except OSError as exc:
        return Probe(FAIL, what, f"not writable: {exc.strerror or exc}", setting)
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return Probe(OK, what, f"created and removed a probe file; {_free(root)} free")


# --- Delta ----------------------------------------------------------------------------------------
DELTA_SETTING = "SINK_DELTA_TABLE_URI"


def delta_probes(settings: DeltaSettings, topics: tuple[str, ...], timeout_s: float) -> list[Probe]:
    """One line per table the named topics go to (`{topic}`); under a pattern, tables are not known yet."""
    if "{topic}" not in settings.table_uri:
        return [delta_probe(settings, settings.table_uri, timeout_s)]
    if not topics:
        return [Probe(SKIP, f"Delta tables {settings.table_uri}", "one per topic of SINK_TOPIC_PATTERN: "
                      "each is probed by its first merge")]
    return [delta_probe(settings, settings.uri_for(topic), timeout_s) for topic in topics]


def delta_probe(settings: DeltaSettings, uri: str, timeout_s: float) -> Probe:
    """The write probe of the table's directory or S3 prefix (its errors name the setting), then the table
    opened as the target opens it."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    from uploader.delta_storage import certificate_failure, error_text, storage_options
    from uploader.directory import DirectorySettings
    from uploader.s3_settings import CREDENTIALS_SETTING, S3Settings

    what = f"Delta table {uri}"
    if settings.on_s3():
        bucket, _, prefix = uri[len("s3://"):].partition("/")
        written = s3_probe(S3Settings(bucket=bucket, prefix=prefix, endpoint_url=settings.endpoint_url,
                                      region=settings.region, ca_bundle=settings.ca_bundle),
                           timeout_s, what, DELTA_SETTING, deletes=True)
    else:
        written = dir_probe(DirectorySettings(path=uri), what, DELTA_SETTING)
    if written.failed:
        return written
    try:
        options = storage_options(settings)
    except UploadError as error:  # none, refused, or not obtainable for now (the service would retry)
        return Probe(FAIL, what, _reason(error), error.setting if isinstance(error, FatalUploadError)
                     else CREDENTIALS_SETTING)
    if options:  # an S3 table: the probe's own timeout
        options["timeout"] = f"{max(1, round(timeout_s))}s"
    try:
        table = DeltaTable(uri, storage_options=options or None)
        found = (f"version {table.version()}, partitioned by "
                 f"{', '.join(table.metadata().partition_columns) or 'nothing'}")
    except TableNotFoundError:
        found = "not created yet: the first merge creates it from the first file's schema"
    except Exception as exc:  # delta-rs reports store errors as its own exception types, or OSError
        plain = error_text(exc)
        if certificate_failure(exc):  # delta-rs's own HTTP client: SINK_TLS_CA_BUNDLE is its certificate_path
            return Probe(FAIL, what, f"the endpoint's TLS certificate could not be verified: {plain[:400]}",
                         "SINK_TLS_CA_BUNDLE")
        return Probe(FAIL, what, f"cannot be read: {plain[:400]}", DELTA_SETTING)
    return Probe(written.status, what, f"{found}; {written.reason}", written.fix)


def _free(path: Path) -> str:
    return f"{shutil.disk_usage(path).free / 2**30:.1f} GiB"


# --- EMS ------------------------------------------------------------------------------------------
def ems_probe(settings: EmsSettings, timeout_s: float) -> Probe:
    """The cheapest request that proves the key: a POST that cannot store anything (module doc)."""
    import requests

    from uploader.classify import body_excerpt, error_for_exception
    from uploader.ems import AUTHORIZATION_SETTING, ENDPOINT_SETTING
    from uploader.proxy import PROXY_SETTING, requests_proxies

    secrets = settings.secrets()
    what = f"EMS endpoint {mask_userinfo(settings.endpoint)}"
    proxy = settings.effective_proxy_url()
    params = {"clientId": settings.client_id} if settings.client_id else {}
    try:
        with requests.Session() as session:
            response = session.post(
                settings.endpoint, params=params, data=b"", headers={"Authorization": settings.authorization},
                timeout=timeout_s, proxies=requests_proxies(proxy) if proxy else None,
                verify=settings.ca_bundle or True, allow_redirects=False)
    except requests.RequestException as exc:
        error = error_for_exception(exc, what="EMS probe", url_setting=ENDPOINT_SETTING,
                                    header_setting=AUTHORIZATION_SETTING, proxy_setting=PROXY_SETTING,
                                    secrets=secrets)
        setting = error.setting if isinstance(error, FatalUploadError) else f"{ENDPOINT_SETTING} (or the network to it)"
        return Probe(FAIL, what, _reason(error), setting)
    status = response.status_code
    said = redact(body_excerpt(response.text, 160), secrets) or "(empty body)"
    if status == 400:
        return Probe(OK, what, "the key was accepted; the probe, a POST without a table or file, was refused "
                     "with HTTP 400 as intended: nothing uploaded")
    if status in (401, 403):
        meaning = "did not accept the key" if status == 401 else "accepted the key, but it may not push into " \
                                                                 "this data pool"
        return Probe(FAIL, what, f"HTTP {status}: EMS {meaning} ({said})", AUTHORIZATION_SETTING)
    if status == 407:
        return Probe(FAIL, what, "HTTP 407: the proxy refused our credentials", PROXY_SETTING)
    if status in (404, 405) or 300 <= status < 400:
        where = f" to {redact(response.headers.get('Location', '?'), secrets)}" if 300 <= status < 400 else ""
        return Probe(FAIL, what, f"HTTP {status}{where}: not an EMS items endpoint; it must look like "
                     "https://<team>.<realm>.celonis.cloud/continuous-batch-processing/api/v1/<pool-id>/items",
                     ENDPOINT_SETTING)
    if status in (408, 429) or status >= 500:
        return Probe(FAIL, what, f"HTTP {status}: the endpoint is unwell right now ({said}); the key could not be "
                     "proven: try again later", None)
    return Probe(SKIP, what, f"cannot probe the key without uploading: an empty request got HTTP {status} "
                 f"({said}), which says nothing about the key; the first upload will")


# --- schema registry ------------------------------------------------------------------------------
def registry_probe(config: SinkConfig, timeout_s: float) -> Probe:
    """`GET /subjects` with the decoders' auth and CA bundle: reachable and the credentials taken."""
    import requests

    from uploader.classify import body_excerpt, is_certificate_failure

    url = config.schema_registry_url or ""
    auth_text = config.schema_registry_basic_auth or ""
    secrets = [auth_text, auth_text.partition(":")[2]]
    what = f"schema registry {mask_userinfo(url)}"
    auth: Any = None
    if auth_text:
        user, _, password = auth_text.partition(":")
        auth = (user, password)
    try:
        response = requests.get(url.rstrip("/") + "/subjects", auth=auth, timeout=timeout_s,
                                verify=config.tls_ca_bundle or True)
    except requests.RequestException as exc:
        detail = redact(f"{type(exc).__name__}: {exc}", secrets)[:300]
        if is_certificate_failure(exc):
            return Probe(FAIL, what, f"its TLS certificate does not verify ({detail})", "SINK_TLS_CA_BUNDLE")
        return Probe(FAIL, what, f"not reachable ({detail})", "SINK_SCHEMA_REGISTRY_URL")
    said = redact(body_excerpt(response.text, 160), secrets) or "(empty body)"
    if response.status_code in (401, 403):
        return Probe(FAIL, what, f"HTTP {response.status_code}: the registry refused the credentials ({said})",
                     "SINK_SCHEMA_REGISTRY_BASIC_AUTH")
    if response.status_code != 200:
        return Probe(FAIL, what, f"HTTP {response.status_code} to GET /subjects: not a schema registry? ({said})",
                     "SINK_SCHEMA_REGISTRY_URL")
    try:
        subjects = len(response.json())
    except (ValueError, TypeError):
        return Probe(FAIL, what, f"GET /subjects did not answer JSON ({said})", "SINK_SCHEMA_REGISTRY_URL")
    scheme = urlsplit(url).scheme
    return Probe(OK, what, f"{subjects} subject(s) over {scheme}" + (", basic auth accepted" if auth else ""))
