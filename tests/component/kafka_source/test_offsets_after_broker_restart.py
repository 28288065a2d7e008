"""The offsets client across a broker restart on the same data: the group's commits, answered soon.

The broker fixture once killed noida-db while it saved its data on SIGTERM, so a restart came back
empty and this read `{}`: the broker-fault tests had been running against a wiped broker.
"""

from __future__ import annotations

import time

from devkit.kafka_data import Workload, create_topics, produce_orders, reset_offsets
from sink_service.kafka_source.offsets import KafkaOffsets

ANSWERED_WITHIN_S = 20.0  # one attempt (8 s) and a new client's answer, with room for a loaded machine


def test_offsets_are_answered_soon_after_the_broker_restarts(own_broker):
    bootstrap, topic, group = own_broker.bootstrap, "restarted-offsets", "restarted-offsets-group"
    create_topics(bootstrap, {topic: 2})
    produce_orders(bootstrap, topic, keys=40, updates=1, workload=Workload())
    reset_offsets(bootstrap, group, {(topic, 0): 7, (topic, 1): 9})
    offsets = KafkaOffsets({"bootstrap.servers": bootstrap}, group)
    tps = [(topic, 0), (topic, 1)]
    assert offsets.committed(tps) == {(topic, 0): 7, (topic, 1): 9}

    own_broker.stop()
    time.sleep(6)
    own_broker.start()

    for question, expected in ((lambda: offsets.committed(tps), {(topic, 0): 7, (topic, 1): 9}),
                               (lambda: offsets.earliest(tps), {(topic, 0): 0, (topic, 1): 0})):
        started = time.monotonic()
        answer = question()
        took = time.monotonic() - started
        assert answer == expected
        assert took < ANSWERED_WITHIN_S, f"answered after {took:.1f}s"
    assert sum(offsets.latest(tps).values()) == 40
