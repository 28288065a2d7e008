"""DirectoryTarget: deterministic paths, atomic writes, crashes that leave no partial file, errors."""

from __future__ import annotations

import errno
import os
import pickle
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sink_service.config import ConfigError, load_config
from sink_service.config.upload_targets import build_target, target_settings
from tests.support.uploader_fixtures import metadata_builder
from uploader import directory
from uploader.directory import DirectorySettings, DirectoryTarget, is_temp_name
from uploader.errors import FatalUploadError, RetriesExhaustedError, RetryableUploadError
from uploader.reader import latest_rows, parquet_files
from uploader.retry import RetryPolicy
from uploader.target import UploadTarget

FAST = RetryPolicy(max_elapsed_s=0.3, initial_backoff_s=0.01, max_backoff_s=0.02)
REL = "orders/3/00000000000000000010-00000000000000000012.parquet"
ROOT = Path(__file__).resolve().parents[3]


metadata = metadata_builder()


@pytest.fixture
def parquet_file(tmp_path) -> Path:
    path = tmp_path / "scratch" / "f.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"id": ["a", "b", "a"], "v": [1, 2, 3], "_offset": [10, 11, 12]}), path)
    return path


def target(root: Path, retry: RetryPolicy = FAST) -> DirectoryTarget:
    return DirectoryTarget(DirectorySettings(str(root), retry=retry))


def all_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_writes_the_deterministic_path(tmp_path, parquet_file):
    out = tmp_path / "out"
    t = target(out)
    assert isinstance(t, UploadTarget) and t.name == "dir"
    receipt = t.upload(parquet_file, metadata())
    assert all_files(out) == [REL]
    assert (out / REL).read_bytes() == parquet_file.read_bytes()
    assert receipt.location == str(out / REL)
    assert receipt.target == "dir"
    assert receipt.bytes == parquet_file.stat().st_size
    assert receipt.attempts == 1
    assert metadata().object_key() == REL  # the same relative path as the S3 key


def test_rewrite_replaces_the_file(tmp_path, parquet_file):
    out = tmp_path / "out"
    target(out).upload(parquet_file, metadata())
    pq.write_table(pa.table({"id": ["z"], "v": [9], "_offset": [12]}), parquet_file)
    target(out).upload(parquet_file, metadata())
    assert all_files(out) == [REL]
    assert pq.read_table(out / REL).column("id").to_pylist() == ["z"]


def test_write_goes_through_a_temp_file_that_is_fsynced_then_renamed(tmp_path, parquet_file, monkeypatch):
    calls: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        calls.append(("replace", f"{Path(src).name} -> {Path(dst).name}"))
        real_replace(src, dst)

    monkeypatch.setattr(directory.os, "fsync", fsync)
    monkeypatch.setattr(directory.os, "replace", replace)
    out = tmp_path / "out"
    target(out).upload(parquet_file, metadata())
    final = out / REL
    kinds = [kind for kind, _ in calls]
    # fsync of the new directories, then of the temp file, the rename, and the directory.
    replace_at = kinds.index("replace")
    temp_fsync = calls[replace_at - 1]
    assert temp_fsync[0] == "fsync" and is_temp_name(Path(temp_fsync[1]).name)
    assert Path(temp_fsync[1]).parent == final.parent
    assert calls[replace_at][1].endswith(f"-> {final.name}")
    assert calls[replace_at + 1] == ("fsync", str(final.parent))


def test_failed_rename_leaves_no_file_under_the_final_name(tmp_path, parquet_file, monkeypatch):
    def broken_replace(src, dst):
        raise OSError(errno.EIO, "simulated I/O error", str(dst))

    monkeypatch.setattr(directory.os, "replace", broken_replace)
    out = tmp_path / "out"
    with pytest.raises(RetriesExhaustedError) as caught:
        target(out).upload(parquet_file, metadata())
    assert caught.value.reason == "io"
    assert all_files(out) == []  # neither a final file nor a leftover temp file


def test_sigkill_mid_write_leaves_only_a_temp_file_that_readers_ignore(tmp_path, parquet_file):
    out = tmp_path / "out"
    # An earlier, complete version of another range is already there.
    target(out).upload(parquet_file, metadata(first_offset=0, last_offset=9))
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from uploader import directory
        from uploader.target import FileMetadata

        def slow_copy(src, out):
            out.write(src.read(100))
            out.flush()
            print("writing", flush=True)
            time.sleep(60)

        directory._copy = slow_copy
        meta = FileMetadata("orders", 3, 10, 12, 3, "orders", ("id",), "_offset", "abc123")
        directory.DirectoryTarget(directory.DirectorySettings({str(out)!r})).upload(Path({str(parquet_file)!r}), meta)
    """)
    writer = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "writing"
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(timeout=10)
        writer.stdout.close()
    assert writer.returncode == -signal.SIGKILL
    files = all_files(out)
    assert not (out / REL).exists()
    leftovers = [Path(f) for f in files if is_temp_name(Path(f).name)]
    assert len(leftovers) == 1 and leftovers[0].name.startswith(f".{Path(REL).name}.tmp-")
    assert (out / leftovers[0]).stat().st_size == 100
    # The reader sees only the complete file.
    assert parquet_files(out) == [str(out / "orders/3/00000000000000000000-00000000000000000009.parquet")]
    assert latest_rows(out, ["id"], "_offset").to_pylist() == [
        {"id": "a", "v": 3, "_offset": 12},
        {"id": "b", "v": 2, "_offset": 11},
    ]
    # A replay of the range then completes it.
    target(out).upload(parquet_file, metadata())
    assert (out / REL).read_bytes() == parquet_file.read_bytes()


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM, errno.EROFS])
def test_permission_and_read_only_errors_are_fatal(tmp_path, parquet_file, monkeypatch, code):
    def refuse(*args, **kwargs):
        raise OSError(code, os.strerror(code), str(tmp_path / "out"))

    monkeypatch.setattr(directory, "_make_dirs", refuse)
    with pytest.raises(FatalUploadError) as caught:
        target(tmp_path / "out").upload(parquet_file, metadata())
    assert caught.value.setting == "SINK_DIR_PATH"
    assert "SINK_DIR_PATH" in str(caught.value)
    assert errno.errorcode[code] in str(caught.value)


def test_a_file_where_the_directory_should_be_is_fatal(tmp_path, parquet_file):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(FatalUploadError) as caught:
        target(blocker).upload(parquet_file, metadata())
    assert caught.value.setting == "SINK_DIR_PATH"


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_directory_is_fatal(tmp_path, parquet_file):
    out = tmp_path / "out"
    out.mkdir(mode=0o500)
    try:
        with pytest.raises(FatalUploadError):
            target(out).upload(parquet_file, metadata())
    finally:
        out.chmod(0o700)


def test_disk_full_is_retryable_and_recovers(tmp_path, parquet_file, monkeypatch):
    real_copy = directory._copy
    failures = [errno.ENOSPC, errno.ENOSPC]

    def copy(src, out):
        if failures:
            raise OSError(failures.pop(), "No space left on device")
        real_copy(src, out)

    monkeypatch.setattr(directory, "_copy", copy)
    out = tmp_path / "out"
    receipt = target(out, RetryPolicy(max_elapsed_s=5, initial_backoff_s=0.01, max_backoff_s=0.02)).upload(
        parquet_file, metadata()
    )
    assert receipt.attempts == 3
    assert all_files(out) == [REL]


def test_disk_full_until_the_budget_runs_out(tmp_path, parquet_file, monkeypatch):
    def full(src, out):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(directory, "_copy", full)
    with pytest.raises(RetryableUploadError) as caught:
        target(tmp_path / "out").upload(parquet_file, metadata())
    assert caught.value.reason == "disk_full"
    assert all_files(tmp_path / "out") == []


def test_missing_source_is_not_an_upload_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        target(tmp_path / "out").upload(tmp_path / "nope.parquet", metadata())


def test_describe_request_names_the_final_path(tmp_path, parquet_file):
    described = target(tmp_path / "out").describe_request(parquet_file, metadata())
    assert described["final_path"] == str(tmp_path / "out" / REL)
    assert described["file_size"] == parquet_file.stat().st_size
    assert not (tmp_path / "out").exists()


def test_settings_and_config(tmp_path):
    s = DirectorySettings(str(tmp_path))
    assert pickle.loads(pickle.dumps(s)) == s and hash(s)
    env = {"SINK_TARGET": "dir", "SINK_KAFKA_BOOTSTRAP_SERVERS": "k:9092", "SINK_TOPICS": "orders"}
    with pytest.raises(ConfigError) as caught:
        load_config(env)
    assert caught.value.problems == ["SINK_DIR_PATH is required when SINK_TARGET=dir."]
    config = load_config({**env, "SINK_DIR_PATH": str(tmp_path), "SINK_UPLOAD_RETRY_BUDGET_MS": "2500"})
    settings = target_settings(config)
    assert settings == DirectorySettings(str(tmp_path), retry=RetryPolicy(max_elapsed_s=2.5))
    assert isinstance(build_target(settings), DirectoryTarget)


def test_target_scope_does_not_need_kafka_settings(tmp_path):
    config = load_config({"SINK_TARGET": "dir", "SINK_DIR_PATH": str(tmp_path)}, scope="target")
    assert config.dir_path == str(tmp_path)
    with pytest.raises(ConfigError) as caught:
        load_config({"SINK_TARGET": "dir", "SINK_DIR_PATH": str(tmp_path)})
    assert any("SINK_KAFKA_BOOTSTRAP_SERVERS" in p for p in caught.value.problems)
