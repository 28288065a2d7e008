"""Regenerate README.md's configuration reference from the declarations (a development step).

Run from a checkout: `.venv/bin/python scripts/config_reference.py`. `tests/unit/test_docs.py` fails
while the README disagrees with the declarations. Not part of the installed package: there the
README is not beside the code.
"""

from __future__ import annotations

from pathlib import Path

from sink_service.config.reference import with_reference

if __name__ == "__main__":
    readme = Path(__file__).resolve().parents[1] / "README.md"
    readme.write_text(with_reference(readme.read_text()))
