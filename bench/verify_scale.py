"""Time and peak RSS of `sink-service verify` at 1M and 4M records (the issue's memory bound).

    .venv/bin/python -m bench.verify_scale --records 1000000 4000000 [--memory-limit 512MB]

For each size: a fresh topic on a local broker (4 partitions, half as many keys as records, so every
key has two versions), a `dir` target written by the real task code (`process_range`, no Spark) and
committed, then `python -m sink_service verify --json` as a child process, sampled every 0.2 s for
the RSS of its whole process tree. Prints one JSON line per size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.measure import ProcessTreeSampler
from bench.workload import WorkloadSpec, build_records, produce
from devkit.brokers import running_broker
from devkit.kafka_data import create_topics, reset_offsets
from sink_service.config import load_config
from sink_service.config.upload_targets import build_target, target_settings
from sink_service.driver.pipeline import decode_spec
from sink_service.kafka_source.offsets import KafkaOffsets
from sink_service.task.partition_task import TaskSpec, process_range
from sink_service.task.range_reader import consumer_config, read_range
from sink_service.task.ranges import Range

PARTITIONS = 4
ROOT = Path(__file__).resolve().parents[1]


def _sink(env: dict[str, str], topic: str, ends: dict[int, int]) -> float:
    """Write the target as the service's tasks do; returns seconds."""
    config = load_config(env)
    spec = TaskSpec(decode=decode_spec(config), target_settings=target_settings(config), build_target=build_target,
                    table_template="{topic}", scratch_dir=config.scratch_dir, flush_bytes=config.flush_bytes,
                    flush_records=config.flush_records, compression=config.parquet_compression,
                    error_policy=config.error_policy)
    client = consumer_config(config.kafka_client_config(), config.group_id)
    started = time.monotonic()
    for partition, end in ends.items():
        outcome = process_range(spec, Range(topic, partition, 0, end),
                                lambda rng: read_range(rng, client, config.read_batch_max_bytes)).to_pylist()[0]
        if outcome["status"] != "ok":
            raise RuntimeError(outcome["error"])
    return time.monotonic() - started


def measure(bootstrap: str, records: int, work: Path, memory_limit: str) -> dict:
    topic, group = f"verify-scale-{records}", f"verify-scale-{records}"
    create_topics(bootstrap, {topic: PARTITIONS})
    keys, values = build_records(WorkloadSpec(records=records, partitions=PARTITIONS, keys=records // 2))
    produce_s = produce(bootstrap, topic, keys, values)
    del keys, values
    tps = [(topic, p) for p in range(PARTITIONS)]
    ends = {p: o for (_, p), o in KafkaOffsets({"bootstrap.servers": bootstrap}, group).latest(tps).items()}
    env = {"SINK_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "SINK_TOPICS": topic, "SINK_GROUP_ID": group,
           "SINK_PRIMARY_KEYS": "id", "SINK_TARGET": "dir", "SINK_DIR_PATH": str(work / f"out-{records}"),
           "SINK_SCRATCH_DIR": str(work / "scratch"), "SINK_FLUSH_RECORDS": "250000"}
    sink_s = _sink(env, topic, ends)
    reset_offsets(bootstrap, group, {(topic, p): o for p, o in ends.items()})
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SINK_")}
    command = [sys.executable, "-m", "sink_service", "verify", "--json", "--memory-limit", memory_limit,
               "--temp-dir", str(work)]
    started = time.monotonic()
    child = subprocess.Popen(command, env={**clean, **env}, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with ProcessTreeSampler(child.pid, interval_s=0.2) as sampler:
        out, err = child.communicate()
    wall_s = time.monotonic() - started
    if child.returncode != 0:
        raise RuntimeError(f"verify exited {child.returncode}: {err.decode()[-2000:]}")
    found = json.loads(out)
    shutil.rmtree(work / f"out-{records}", ignore_errors=True)
    return {"records": records, "keys": found["keys_checked"], "equal": found["equal"],
            "verify_wall_s": round(wall_s, 1), "verify_peak_rss_mib": round(sampler.peak_rss / 2**20),
            "memory_limit": memory_limit, "produce_s": round(produce_s, 1), "sink_s": round(sink_s, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--memory-limit", default="512MB", help="passed to verify (duckdb's limit)")
    args = parser.parse_args()
    with running_broker() as bootstrap, tempfile.TemporaryDirectory(prefix="verify-scale-") as scratch:
        for records in args.records:
            print(json.dumps(measure(bootstrap, records, Path(scratch), args.memory_limit)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
