"""Quix Streams' FileSink with Parquet format, as it comes: consume a topic, write local Parquet files.

    bench/.venv-quix/bin/python bench/systems/quix_filesink.py --bootstrap HOST:PORT --topic T --group G \
        --out DIR [--commit-interval 10] [--commit-every N]

Runs in its own virtualenv (bench/.venv-quix): quixstreams pins confluent-kafka below the project's version.
Values are deserialized as JSON; `LocalFileSink(format=ParquetFormat())` writes one file per topic-partition
per checkpoint (`<out>/<topic>/<partition>/<first offset>.parquet`, columns `_timestamp` (ms), `_key` and the
value's fields) and the checkpoint commits the offsets after the files are written. A checkpoint closes every
--commit-interval seconds or after --commit-every records. Nothing is pushed anywhere: files stay local.
SIGTERM stops the application cleanly.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from quixstreams import Application
from quixstreams.sinks.community.file.formats import ParquetFormat
from quixstreams.sinks.community.file.local import LocalFileSink


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--out", required=True, help="directory for the Parquet files (created)")
    parser.add_argument("--commit-interval", type=float, default=10.0, help="seconds between checkpoints")
    parser.add_argument("--commit-every", type=int, default=0, help="records per checkpoint (0: time only)")
    args = parser.parse_args()

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # FileSink accepts only [a-zA-Z0-9 ._/] in its directory; work relative to the output directory.
    os.chdir(out)
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        commit_interval=args.commit_interval,
        commit_every=args.commit_every,
        state_dir=str(out / ".state"),
        loglevel=logging.WARNING,
        auto_create_topics=False,
        use_changelog_topics=False,
        # Some Kafka-protocol brokers (noida-db) answer a fetch with more than fetch.max.bytes (the service and
        # the hand-written pipeline set the same).
        consumer_extra_config={"receive.message.max.bytes": 1_000_000_000},
    )
    topic = app.topic(args.topic, value_deserializer="json")
    sdf = app.dataframe(topic)
    sdf.sink(LocalFileSink(directory="files", format=ParquetFormat(compression="snappy")))
    app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
