"""Which JVM options the class-data archive setting turns into; building it is exercised by bootstrap."""

from __future__ import annotations

import sys
from pathlib import Path

from sink_service import jvm_class_archive


def test_auto_is_a_file_inside_the_installation_named_after_the_jvm_and_spark():
    path = jvm_class_archive.resolve("auto")
    assert path == jvm_class_archive.default_path()
    assert path.is_relative_to(Path(sys.prefix))
    assert path.name.startswith("spark-classes-") and path.suffix == ".jsa"


def test_off_and_empty_mean_no_archive():
    assert jvm_class_archive.resolve("off") is None
    assert jvm_class_archive.resolve("") is None
    assert jvm_class_archive.java_options("off") == []


def test_a_missing_archive_adds_no_options(tmp_path):
    assert jvm_class_archive.java_options(str(tmp_path / "absent.jsa")) == []


def test_an_existing_archive_is_used_and_a_bad_one_cannot_stop_the_jvm(tmp_path):
    archive = tmp_path / "classes.jsa"
    archive.write_bytes(b"not really an archive")
    options = jvm_class_archive.java_options(str(archive))
    assert f"-XX:SharedArchiveFile={archive}" in options
    assert "-Xshare:auto" in options  # an unusable archive is ignored, never fatal
