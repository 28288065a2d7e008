"""`sink-service verify`: compare the target with the topics up to the group's committed offsets.

Exit 0 when every key is equal, 1 when not, 2 on a usage or configuration error (including an EMS
that cannot be read back without `--target-export`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--examples", type=int, default=10, metavar="N",
                        help="show the first N keys of each kind of difference (default 10)")
    parser.add_argument("--target-export", type=Path, metavar="PATH",
                        help="compare with these Parquet files (a file or a directory) instead of reading the "
                             "target: for the real EMS, which has no read-back API")
    parser.add_argument("--memory-limit", default="512MB",
                        help="duckdb's memory limit; beyond it the work spills to the temporary directory. The "
                             "process peaks at about this plus 150-250 MB (default 512MB)")
    parser.add_argument("--temp-dir", type=Path, help="where the spill files go (default: the system's)")


def main(args: argparse.Namespace) -> int:
    from sink_service.config import ConfigError, load_config

    if args.examples < 0:
        print("sink-service verify: --examples must be 0 or more", file=sys.stderr)
        return 2
    try:
        config = load_config(os.environ)
    except ConfigError as exc:
        print(f"sink-service verify: {exc}", file=sys.stderr)
        print("See the configuration reference in README.md.", file=sys.stderr)
        return 2
    from confluent_kafka import KafkaException

    from sink_service.shared.kafka_access import KafkaAccessRefused
    from sink_service.verify.run import VerifyOptions, verify
    from sink_service.verify.target import CannotVerify

    options = VerifyOptions(args.examples, args.target_export, args.memory_limit, args.temp_dir,
                            progress=lambda line: print(f"verify: {line}", file=sys.stderr, flush=True))
    try:
        report = verify(config, options)
    except (CannotVerify, LookupError) as exc:
        print(f"sink-service verify: {exc}", file=sys.stderr)
        return 2
    except (KafkaException, KafkaAccessRefused) as exc:
        print(f"sink-service verify: Kafka at {config.kafka_bootstrap_servers}: {exc}", file=sys.stderr)
        return 2
    print(report.to_json() if args.json else report.to_text())
    return 0 if report.equal else 1
