"""Partitions started without a committed offset are said in one WARNING per topic and reason, with every
partition's offset: a new group over 96 partitions used to write 96 lines of the same sentence."""

from __future__ import annotations

import logging

from sink_service.kafka_source.offsets import FreshStart, KafkaOffsets

LOGGER = "sink_service.kafka_source.offsets"


def _said(starts: list[FreshStart], caplog) -> list[str]:
    offsets = KafkaOffsets({"bootstrap.servers": "127.0.0.1:1"}, "orders-sink")  # never asked: no request made
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        offsets._say_fresh(starts, "latest", None)
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_new_group_over_96_partitions_is_one_line_per_topic_naming_each_offset(caplog):
    starts = [FreshStart(("orders", p), 0 if p < 90 else 1000 + p, "first_start") for p in range(96)]
    starts.append(FreshStart(("refunds", 3), 7, "first_start"))
    lines = _said(starts, caplog)
    assert len(lines) == 2, lines
    orders = next(line for line in lines if line.startswith("topic=orders "))
    assert orders.startswith("topic=orders partitions=0-95 (96): no committed offset in consumer group "
                             "orders-sink: a new group"), orders
    assert orders.endswith("offsets (partition:offset) 0-89:0 90:1090 91:1091 92:1092 93:1093 94:1094 95:1095")
    refunds = next(line for line in lines if line.startswith("topic=refunds "))
    assert refunds.startswith("topic=refunds partition=3: no committed offset in consumer group orders-sink"), refunds
    assert refunds.endswith("offset 7"), refunds


def test_partitions_that_start_for_different_reasons_are_said_apart(caplog):
    starts = [FreshStart(("orders", 0), 60, "table"), FreshStart(("orders", 1), 0, "found_later"),
              FreshStart(("orders", 2), 0, "found_later"), FreshStart(("orders", 5), 0, "found_later"),
              FreshStart(("orders", 6), 40, "first_start", "no record at or after the time")]
    lines = _said(starts, caplog)
    assert len(lines) == 3, lines
    assert any("partition=0:" in line and "Delta table's position" in line and line.endswith("offset 60")
               for line in lines), lines
    assert any("partitions=1-2,5 (3):" in line and "created or first matched" in line
               and line.endswith("offsets (partition:offset) 1-2:0 5:0") for line in lines), lines
    assert any("partition=6:" in line and line.endswith("offset 40 (no record at or after the time)")
               for line in lines), lines


def test_each_partition_is_said_once_per_process(caplog):
    offsets = KafkaOffsets({"bootstrap.servers": "127.0.0.1:1"}, "g")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        offsets._say_fresh([FreshStart(("t", p), 0, "first_start") for p in range(3)], "earliest", None)
        offsets._say_fresh([FreshStart(("t", p), 0, "first_start") for p in range(5)], "earliest", None)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [line.split(":")[0] for line in lines] == ["topic=t partitions=0-2 (3)", "topic=t partitions=3-4 (2)"]
