"""The EMS items endpoint: `POST /continuous-batch-processing/api/v1/<pool-id>/items`.

Checks run in the order a real gateway applies them: injected faults, the Authorization header,
the query, the body size, the multipart body, the Parquet file, and finally the upsert.
"""

from __future__ import annotations

import hmac
import logging
import re
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from local_ems.faults import FaultDecision, FaultInjector
from local_ems.multipart import parse_form_data, single_file_part
from local_ems.params import PushParams
from local_ems.prepare import prepare
from local_ems.request import Request
from local_ems.responses import HttpError, Response, as_json, server_error, text
from local_ems.stats import RequestStats
from local_ems.store import UploadEntry, UpsertStore

log = logging.getLogger(__name__)

PATH_PREFIX = ("continuous-batch-processing", "api", "v1")
DEFAULT_FILE_NAME = "file.parquet"
_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]")


def items_pool(segments: tuple[str, ...]) -> str | None:
    """The pool id when the path is an items path, else None."""
    if len(segments) == 5 and segments[:3] == PATH_PREFIX and segments[4] == "items" and segments[3]:
        return segments[3]
    return None


class ItemsEndpoint:
    def __init__(self, authorization: str, store: UpsertStore, uploads_dir: Path, faults: FaultInjector,
                 stats: RequestStats, max_body_bytes: int) -> None:
        self._authorization = authorization.encode()
        self._store = store
        self._uploads_dir = uploads_dir
        self._faults = faults
        self._stats = stats
        self._max_body_bytes = max_body_bytes

    def handle(self, request: Request, pool_id: str) -> Response:
        """Never raises: client errors become 4xx text, anything else a 500 with a reference."""
        rows = size = 0
        try:
            response, rows, size = self._handle(request, pool_id)
        except HttpError as error:
            response = text(error.status, error.message)
        except Exception:
            response, reference = server_error("the upload could not be applied; see the server log")
            log.exception("items POST failed (reference %s)", reference)
        self._stats.record(response.status, rows, size)
        return response

    def _handle(self, request: Request, pool_id: str) -> tuple[Response, int, int]:
        received_at = time.time()
        fault = self._faults.next_request()
        if fault is not None:
            time.sleep(fault.delay_s)
            if fault.status is not None:
                return _fault_response(fault), 0, 0
        self._check_authorization(request)
        params = PushParams.from_query(request.query)
        body = request.body.read(self._max_body_bytes)
        part = single_file_part(parse_form_data(body, request.headers.get("Content-Type")))
        file_name = part.filename or DEFAULT_FILE_NAME
        try:
            table = pq.read_table(pa.BufferReader(pa.py_buffer(part.data)))
        except (pa.ArrowException, OSError, ValueError) as error:
            raise HttpError(400, f"part `file` ({file_name}) is not a readable Parquet file: {error}") from error
        prepared = prepare(table, params)
        upload_id = str(uuid.uuid4())
        path = self._save(params.target_name, upload_id, file_name, part.data)
        entry = UploadEntry(upload_id, pool_id, params.target_name, file_name, dict(params.raw), table.num_rows,
                            len(part.data), received_at, str(path))
        try:
            self._store.apply(prepared, entry)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        receipt = {"id": upload_id, "fileName": file_name, "bucketId": pool_id, "flushStatus": "NEW",
                   "rows": table.num_rows}
        response = as_json(200, receipt)
        response.note = f"target={params.target_name} file={file_name} rows={table.num_rows}"
        return response, table.num_rows, len(part.data)

    def _check_authorization(self, request: Request) -> None:
        presented = request.headers.get("Authorization")
        if presented is None:
            raise HttpError(401, "Authorization header is missing; send `AppKey <key>` or `Bearer <token>`")
        # Constant-time comparison; the presented value is never echoed or logged.
        if not hmac.compare_digest(presented.encode("utf-8", "surrogateescape"), self._authorization):
            raise HttpError(401, "Authorization header was not accepted")

    def _save(self, target_name: str, upload_id: str, file_name: str, data: memoryview) -> Path:
        directory = self._uploads_dir / _safe_name(target_name)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{upload_id}__{_safe_name(file_name.replace(chr(92), '/').rsplit('/', 1)[-1])}"
        path.write_bytes(data)
        return path


def _safe_name(name: str) -> str:
    """A single path component: no separators, no `..`, only portable characters."""
    cleaned = _UNSAFE.sub("_", name).strip(".") or "_"
    return cleaned[:200]


def _fault_response(fault: FaultDecision) -> Response:
    assert fault.status is not None
    headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
    message = f"injected fault: HTTP {fault.status}"
    if fault.status >= 500:
        response, _ = server_error(message, fault.status, **headers)
    else:
        response = text(fault.status, message, **headers)
    response.note = "injected fault"
    return response
