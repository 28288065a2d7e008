"""Secrets are scrubbed from every log record: message, args and exception text."""

from __future__ import annotations

import io
import json
import logging

import pytest

from sink_service.config import MASK
from sink_service.logs import JsonFormatter, SecretScrubber

APP_KEY = "AppKey k3y-0123456789abcdef"
TOKEN = "Bearer eyJhbGciOi.payload.signature"
KAFKA_PASSWORD = "kafka-pa55word"


@pytest.fixture()
def capture():
    """A logger whose only handler scrubs secrets and writes to a buffer."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(SecretScrubber([APP_KEY, TOKEN, KAFKA_PASSWORD, None, ""]))
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("test_logs.capture")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    yield logger, stream
    logger.handlers[:] = []


def _assert_clean(text: str) -> None:
    for leaked in (APP_KEY, "k3y-0123456789abcdef", TOKEN, "eyJhbGciOi.payload.signature", KAFKA_PASSWORD):
        assert leaked not in text


def test_secret_in_message_is_masked(capture):
    logger, stream = capture
    logger.info(f"sending Authorization: {APP_KEY} to the endpoint")
    output = stream.getvalue()
    _assert_clean(output)
    assert f"Authorization: {MASK} to the endpoint" in output


def test_credential_part_alone_is_masked(capture):
    logger, stream = capture
    logger.info("key=k3y-0123456789abcdef token=eyJhbGciOi.payload.signature")
    output = stream.getvalue()
    _assert_clean(output)
    assert output.count(MASK) == 2


def test_secret_in_args_is_masked(capture):
    logger, stream = capture
    logger.warning("config %s, password %r", {"auth": APP_KEY}, KAFKA_PASSWORD)
    output = stream.getvalue()
    _assert_clean(output)
    assert "password" in output


def test_secret_in_exception_text_is_masked(capture):
    logger, stream = capture
    try:
        raise RuntimeError(f"401 for {TOKEN} (password {KAFKA_PASSWORD})")
    except RuntimeError:
        logger.exception("upload failed")
    output = stream.getvalue()
    _assert_clean(output)
    assert "Traceback" in output
    assert "RuntimeError: 401 for" in output
    assert "upload failed" in output


def test_chained_exception_text_is_masked(capture):
    logger, stream = capture
    try:
        try:
            raise ValueError(KAFKA_PASSWORD)
        except ValueError as inner:
            raise RuntimeError("wrapper") from inner
    except RuntimeError:
        logger.error("failed", exc_info=True)
    output = stream.getvalue()
    _assert_clean(output)
    assert "wrapper" in output


def test_messages_without_secrets_are_unchanged(capture):
    logger, stream = capture
    logger.info("uploaded %s rows=%d", "orders-0-000.parquet", 12)
    assert stream.getvalue() == "INFO uploaded orders-0-000.parquet rows=12\n"


def test_short_values_are_not_treated_as_secrets():
    # A 1-3 character "secret" would mask innocent text everywhere.
    scrubber = SecretScrubber(["ab", "AppKey xy"])
    assert scrubber.scrub("abc xy") == "abc xy"
    assert scrubber.scrub("AppKey xy") == MASK


def test_longer_secret_is_replaced_before_its_substring():
    scrubber = SecretScrubber(["secret-1", "secret-1-and-more"])
    assert scrubber.scrub("x secret-1-and-more y") == f"x {MASK} y"


def test_json_formatter_output_is_scrubbed():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(SecretScrubber([APP_KEY]))
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("test_logs.json")
    logger.handlers[:] = [handler]
    logger.propagate = False
    try:
        raise RuntimeError(APP_KEY)
    except RuntimeError:
        logger.exception("auth %s", APP_KEY)
    logger.handlers[:] = []
    event = json.loads(stream.getvalue())
    assert event["message"] == f"auth {MASK}"
    assert "RuntimeError" in event["exception"]
    _assert_clean(stream.getvalue())


def test_a_bad_format_call_does_not_raise_into_the_caller(capture):
    # logging never lets a formatting mistake escape into application code (it reports it via
    # Handler.handleError). The scrubbing filter must not change that: a mismatched %d in some
    # log call must not crash an upload or a micro-batch.
    logger, _stream = capture
    logger.info("rows=%d", "not-a-number")


class _Shown:
    """A value json.dumps can only print through str(), as the formatter's default=str does."""

    def __str__(self) -> str:
        return f"client with password {KAFKA_PASSWORD}"


def _json_events(fields: dict) -> tuple[dict, str]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(SecretScrubber([APP_KEY, TOKEN, KAFKA_PASSWORD]))
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("test_logs.fields")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.info("event with fields", extra={"fields": fields})
    logger.handlers[:] = []
    return json.loads(stream.getvalue()), stream.getvalue()


def test_json_extra_fields_pass_the_scrubber():
    event, text = _json_events({
        "event": "config",
        "authorization": APP_KEY,
        "config": {"SINK_EMS_AUTHORIZATION": f"header {TOKEN}", "hosts": ["a", f"b {KAFKA_PASSWORD}"]},
        "client": _Shown(),
        APP_KEY: "secret used as a field name",
    })
    _assert_clean(text)
    assert event["authorization"] == MASK
    assert event["config"]["SINK_EMS_AUTHORIZATION"] == f"header {MASK}"
    assert event["config"]["hosts"] == ["a", f"b {MASK}"]
    assert event["client"] == f"client with password {MASK}"


def test_json_extra_fields_keep_their_types():
    event, _ = _json_events({"rows": 12, "duration_s": 0.5, "ok": True, "id": None, "offsets": (1, 2)})
    shown = (event["rows"], event["duration_s"], event["ok"], event["id"], event["offsets"])
    assert shown == (12, 0.5, True, None, [1, 2])


def test_credentials_written_into_a_url_are_masked(capture):
    # A proxy or endpoint URL with user:password@ is credential material even when the password is
    # not one of the configured secrets (SINK_EMS_PROXY_URL=http://user:pass@proxy:3128).
    logger, stream = capture
    logger.info("proxy http://bob:hunter2-pw@proxy.local:3128 refused; endpoint https://token-xyz@s3.local/b")
    output = stream.getvalue()
    assert "hunter2-pw" not in output and "bob" not in output and "token-xyz" not in output
    assert f"http://{MASK}@proxy.local:3128 refused; endpoint https://{MASK}@s3.local/b" in output


# --- Spark's Python workers: the driver's format and scrubber, not Python's last-resort handler ---

WORKER_SECRET = "w0rker-s3cret-value"
WORKER_SCRIPT = r'''
import dataclasses, json, sys
from pathlib import Path
import pyarrow as pa
from sink_service.decode import RAW_SCHEMA
from sink_service.task.ranges import Range
from sink_service.logs import WorkerLogging
from sink_service.task.partition_task import process_range
from tests.unit.task.test_partition_task import spec

secret = sys.argv[2]
task = dataclasses.replace(spec(Path(sys.argv[1]), "skip"), logging=WorkerLogging("INFO", True, (secret,)))
topic = "orders-" + secret  # reaches the "skipped bad record" warning, as a leaked credential would

def read(rng):
    yield pa.RecordBatch.from_pylist([{"topic": topic, "partition": 0, "offset": 0, "timestamp_ms": 0,
        "key": None, "value": b"{not json", "headers": None}], schema=RAW_SCHEMA)

print(process_range(task, Range(topic, 0, 0, 1), read).to_pylist()[0]["status"])
'''


def test_a_worker_logs_as_the_driver_does_json_and_scrubbed(tmp_path):
    """A fresh interpreter stands for a Spark Python worker: nothing configured its logging."""
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-c", WORKER_SCRIPT, str(tmp_path), WORKER_SECRET],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2])
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines, "the bad record is logged"
    events = [json.loads(line) for line in lines]  # every line JSON: none bare through the last-resort handler
    assert any(e["logger"] == "sink_service.task" and "skipped bad record" in e["message"] for e in events), events
    assert WORKER_SECRET not in done.stderr and MASK in done.stderr


def test_the_task_spec_carries_the_drivers_logging_and_never_shows_its_secrets():
    from sink_service import logs
    from sink_service.config.upload_targets import build_target
    from sink_service.decode import DecodeSpec
    from sink_service.task.partition_task import TaskSpec

    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    try:
        logs.configure("INFO", [WORKER_SECRET], json_format=True)
        task = TaskSpec(DecodeSpec(None, ("id",), "_offset"), None, build_target, "{topic}", "/tmp", 1, 1,
                        "snappy", "skip")
    finally:
        root.handlers[:], _ = before[0], root.setLevel(before[1])
    assert task.logging == logs.WorkerLogging("INFO", True, (WORKER_SECRET,))
    assert WORKER_SECRET not in repr(task)
