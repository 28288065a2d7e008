"""Offsets as Kafka knows them: topics, watermarks and the consumer group's committed offsets.

The consumer group's committed offsets are the service's only record of progress: this module
reads them (and where to start); the group member (`membership.py`) commits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import TypeVar

from confluent_kafka import ConsumerGroupTopicPartitions, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from sink_service.kafka_source.positions import TP, OffsetGapError
from sink_service.shared.kafka_access import AccessWatch

log = logging.getLogger(__name__)

_TIMEOUT_S = 30.0
T = TypeVar("T")


class KafkaOffsets:
    """Thin, explicit wrapper over the admin API; every call is a round trip to the brokers."""

    def __init__(self, client_config: Mapping[str, str], group_id: str):
        self._access = AccessWatch()
        self._config = {**client_config, "error_cb": self._access}
        self._admin = AdminClient(self._config)
        self._group_id = group_id

    def _answer(self, future: Future[T]) -> T:
        """A request's result; a client that timed out is replaced before the error goes up.

        After a broker restart an AdminClient can keep timing out on the group coordinator
        (list_consumer_group_offsets, seen with noida-db) while a new client is answered at once.
        A refused login or certificate raises `KafkaAccessRefused` as soon as librdkafka reports it
        (polling serves the error callback), not after the request's timeout.
        """
        while not future.done():
            self._admin.poll(0.1)
            self._access.check()
        try:
            return future.result()
        except KafkaException as exc:
            self._access.check()
            if exc.args and exc.args[0].code() in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT):
                self._admin = AdminClient(self._config)
            raise

    def _refresh_metadata(self) -> None:
        """In steps of a second, so that a refused login is reported at once rather than after 30 s."""
        deadline = time.monotonic() + _TIMEOUT_S
        while True:
            try:
                self._admin.list_topics(timeout=1.0)
                return
            except KafkaException:
                self._admin.poll(0)
                self._access.check()
                if time.monotonic() >= deadline:
                    raise

    def _list_offsets(self, tps: Iterable[TP], spec: OffsetSpec) -> dict[TP, int]:
        request = {TopicPartition(t, p): spec for t, p in tps}
        if not request:
            return {}
        futures = self._admin.list_offsets(
            request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=_TIMEOUT_S
        )
        return {(tp.topic, tp.partition): self._answer(f).offset for tp, f in futures.items()}

    def earliest(self, tps: Iterable[TP]) -> dict[TP, int]:
        return self._list_offsets(tps, OffsetSpec.earliest())

    def latest(self, tps: Iterable[TP]) -> dict[TP, int]:
        """Last stable offset: records of open transactions are not readable yet."""
        return self._list_offsets(tps, OffsetSpec.latest())

    def committed(self, tps: Iterable[TP] | None) -> dict[TP, int]:
        """Committed offsets of the group (of every partition it committed, for None); others absent."""
        request = None if tps is None else [TopicPartition(t, p) for t, p in tps]
        if request == []:
            return {}
        futures = self._admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(self._group_id, request)], request_timeout=_TIMEOUT_S
        )
        result = self._answer(next(iter(futures.values())))
        return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions or () if tp.offset >= 0}

    def resolve_start(self, tps: list[TP], starting: str, gap_policy: str,
                      commit: Callable[[Mapping[TP, int]], None]) -> dict[TP, int]:
        """Where each partition starts: its committed offset, else `starting`; checks the log's bounds.

        `starting` applies only to the group's first start, while it has no committed offset at
        all. Once it has one, a partition without a commit was created (or first matched) later and
        starts at its earliest offset. This is decided from Kafka, never from the process's memory:
        a topic found while running whose uploads have not succeeded yet must not be taken for one
        present at the first start by the next process (a restart, a rolling update, another
        replica) and skipped to its end.
        A `latest` position is committed as soon as it is resolved: otherwise the next query (a
        replay, a restart) would resolve it again to a newer end and skip what arrived meanwhile.
        A committed offset outside [earliest, end] is a gap: `fail` raises `OffsetGapError` and
        commits nothing; `skip` restarts the partition at its earliest available offset, commits
        that and logs `RECORDS LOST`.
        """
        # The group may assign partitions newer than this client's cached metadata, and offset
        # lookups for those fail (unknown partition) until it is refreshed.
        self._refresh_metadata()
        everything_committed = self.committed(None)
        committed = {tp: everything_committed[tp] for tp in tps if tp in everything_committed}
        new = [f"{t}:{p}" for t, p in tps if (t, p) not in committed]
        if everything_committed and starting != "earliest" and new:
            log.info("%s: no committed offset, but the group %s has committed before, so they were created or "
                     "matched after its first start: starting them at their earliest offset, not at "
                     "SINK_STARTING_OFFSETS=%s", ", ".join(new), self._group_id, starting)
            starting = "earliest"
        low = self.earliest(tps)
        high = self.latest(tps)
        start: dict[TP, int] = {}
        resolved: dict[TP, int] = {}
        gaps: list[str] = []
        for tp in tps:
            topic, partition = tp
            if tp not in committed:
                start[tp] = high[tp] if starting == "latest" else low[tp]
                if starting == "latest":
                    resolved[tp] = start[tp]
                continue
            was = committed[tp]
            if low[tp] <= was <= high[tp]:
                start[tp] = was
                continue
            where = f"topic={topic} partition={partition}: committed offset {was} but "
            if was < low[tp]:
                where += f"the earliest available is {low[tp]}; {low[tp] - was} record(s) were deleted by retention"
            else:
                where += (f"the log ends at {high[tp]}; the log was truncated or the topic deleted and "
                          "recreated, and records past the end may have been lost")
            gaps.append(where)
            start[tp] = resolved[tp] = low[tp]
        if gaps and gap_policy == "fail":
            raise OffsetGapError(
                "; ".join(gaps) + ". Nothing was skipped or committed. To accept the loss and continue from "
                "the earliest available offset, set SINK_RETENTION_GAP_POLICY=skip."
            )
        for where in gaps:
            log.error("RECORDS LOST: %s. Restarting from the earliest available offset because "
                      "SINK_RETENTION_GAP_POLICY=skip.", where)
        if resolved:
            commit(resolved)  # through the group member: a broker refuses others while it is active
        return start
