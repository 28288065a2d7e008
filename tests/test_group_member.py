"""The driver's group member against a real broker: it holds partitions and never reads them."""

from __future__ import annotations

import json
import time
import uuid

from devkit.kafka_data import Workload, create_topics, produce_orders, reset_offsets
from sink_service.kafka_source.membership import GroupMembership


def test_the_member_fetches_no_records_from_the_partitions_it_holds(bootstrap):
    # Executors read; the member only holds the partitions, from the group's committed positions
    # (the service commits its start positions first). A fetch would bring records nobody reads:
    # noida-db sends a partition's whole backlog in one answer, a real broker up to fetch.max.bytes.
    topic = f"member-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, {topic: 4})
    produce_orders(bootstrap, topic, keys=2000, updates=5, workload=Workload())
    reset_offsets(bootstrap, f"group-{topic}", {(topic, p): 0 for p in range(4)})
    received: list[int] = []

    def stats(text: str) -> None:
        received.append(json.loads(text)["rxmsg_bytes"])  # record bytes fetched from any broker

    member = GroupMembership({"bootstrap.servers": bootstrap, "statistics.interval.ms": 100, "stats_cb": stats},
                             f"group-{topic}", [topic], 30_000, lambda: True, 10, f"instance-{topic}")
    member.start()
    try:
        assert member.wait_assignment(30) is not None
        time.sleep(2)  # a fetch in flight at the assignment would have been answered by now
        assert received, "no statistics from the member's consumer"
        assert received[-1] == 0, f"the member fetched {received[-1]:,} bytes of records it never reads"
    finally:
        member.close()
