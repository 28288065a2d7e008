"""Side-by-side benchmark of the sink service against Quix Streams FileSink and a hand-written pipeline.

Run `.venv/bin/python -m bench.run` (or `bash bench/run.sh`) from the repository root; see bench/README.md.
"""
