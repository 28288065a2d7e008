"""The README's configuration reference is generated from the declarations; keep them equal."""

from pathlib import Path

from sink_service.config import declared_fields, with_reference

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_configuration_reference_matches_declarations():
    text = README.read_text()
    assert with_reference(text) == text, "README is stale: run `.venv/bin/python scripts/config_reference.py`"


def test_every_declared_setting_is_documented():
    text = README.read_text()
    missing = [f.metadata["env"] for f in declared_fields() if f"`{f.metadata['env']}`" not in text]
    assert not missing
