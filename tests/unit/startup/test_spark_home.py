"""How the service points Spark at its prepared home and class archive; preparing them runs in bootstrap."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sink_service.startup import spark_home


@pytest.fixture
def environ(monkeypatch):
    monkeypatch.delenv("SPARK_HOME", raising=False)
    return monkeypatch


def test_the_prepared_directory_is_inside_the_installation_and_named_after_spark():
    directory = spark_home.prepared_dir()
    assert directory.is_relative_to(Path(sys.prefix))
    assert directory.name.startswith("spark-")
    assert spark_home.archive_path("auto") == directory / spark_home.ARCHIVE_NAME


def test_off_and_empty_mean_no_archive(environ):
    assert spark_home.archive_path("off") is None
    assert spark_home.archive_path("") is None
    assert spark_home.activate("off") == []


def test_a_missing_archive_adds_no_options(environ, tmp_path):
    assert spark_home.activate(str(tmp_path / "absent.jsa")) == []


def test_an_existing_archive_is_used_and_a_bad_one_cannot_stop_the_jvm(environ, tmp_path):
    archive = tmp_path / "classes.jsa"
    archive.write_bytes(b"not really an archive")
    options = spark_home.activate(str(archive))
    assert f"-XX:SharedArchiveFile={archive}" in options
    assert "-Xshare:auto" in options  # an unusable archive is ignored, never fatal


def test_a_spark_home_set_by_the_user_is_kept(environ, tmp_path):
    environ.setenv("SPARK_HOME", str(tmp_path))
    spark_home.activate("off")
    assert os.environ["SPARK_HOME"] == str(tmp_path)


def test_the_prepared_home_has_spark_submit_and_jars_but_no_zipped_python(environ):
    """Prepared by scripts/bootstrap.sh; without the zips, workers import the compiled package."""
    home = spark_home.prepared_dir() / "home"
    spark_home.activate("off")
    assert os.environ["SPARK_HOME"] == str(home)
    assert (home / "bin" / "spark-submit").is_file()
    assert any((home / "jars").glob("spark-core_*.jar"))
    assert not (home / "python").exists()
    # MLlib's session extension cost every session ~0.4 s of JVM start-up; the service uses none of it.
    left_out = [jar.name for pattern in spark_home.LEFT_OUT_JARS for jar in (home / "jars").glob(pattern)]
    assert not left_out
    assert len(list((home / "jars").iterdir())) == len(list(Path(spark_home._pyspark_home(), "jars").glob("*.jar"))) - 2
