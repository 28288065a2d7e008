"""Offsets as Kafka knows them: topics, watermarks and the consumer group's committed offsets.

The consumer group's committed offsets are the service's only record of progress: this module
reads them (and where to start); the group member (`membership.py`) commits.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TypeVar

from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from sink_service.kafka_source.positions import TP, OffsetGapError
from sink_service.shared.instants import iso_ms, starting_time_ms
from sink_service.shared.kafka_access import AccessWatch, new_client

log = logging.getLogger(__name__)

_TIMEOUT_S = 30.0  # the whole budget of one question to the brokers
# One attempt's share of it. After a broker restart, a client can wait out its whole request timeout for
# an answer (the group coordinator's, seen with noida-db) that a new client gets at once: asked with one
# 30 s timeout, a restart held the query's restart for 30-100 s.
_ATTEMPT_S = 8.0
K = TypeVar("K")
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class TimedPosition:
    """Where a point in time falls in one partition's log, and why, in words for a log line."""

    offset: int
    why: str


class KafkaOffsets:
    """Thin, explicit wrapper over the admin API; every call is a round trip to the brokers.

    Committed offsets are read by a consumer of the group that never subscribes (so never joins it),
    not by the admin API: librdkafka 2.16's admin client aborts the whole process
    (`rd_kafka_enq_once_del_source_return: Assertion eonce->refcnt > 0`) when a request to the group
    coordinator fails to be sent, which a broker outage makes likely (librdkafka #4605; reproduced
    here in seconds, and once as a service exiting with SIGABRT during a broker restart). The
    consumer's own offset fetch goes another way and survived every reproduction.
    """

    def __init__(self, client_config: Mapping[str, str], group_id: str):
        self._access = AccessWatch()
        self._config = {**client_config, "error_cb": self._access}
        self._admin = new_client(AdminClient, self._config)
        self._group_id = group_id
        self._reader: Consumer | None = None  # made on first use: most callers never read commits

    def _ask(self, request: Callable[[AdminClient, float], Mapping[K, Future[T]]]) -> dict[K, T]:
        """`request(client, timeout_s)`'s answers; a client that timed out is replaced and asked again.

        A refused login or certificate raises `KafkaAccessRefused` as soon as librdkafka reports it
        (polling serves the error callback), not after the request's timeout.
        """
        def attempt(timeout_s: float) -> dict[K, T]:
            admin = self._admin
            futures = request(admin, timeout_s)
            return {key: self._answer(admin, future) for key, future in futures.items()}
        return self._within_budget(attempt)

    def _within_budget(self, attempt: Callable[[float], R]) -> R:
        """`attempt(timeout_s)`, asked again after a timeout until `_TIMEOUT_S` is spent.

        Every question here reads or sets absolute values, so asking it again is harmless.
        """
        deadline = time.monotonic() + _TIMEOUT_S
        while True:
            try:
                return attempt(min(_ATTEMPT_S, max(1.0, deadline - time.monotonic())))
            except KafkaException as exc:
                self._access.check()
                if not _timed_out(exc) or time.monotonic() >= deadline:
                    raise
                log.info("Kafka did not answer within %.0fs (%s); asking again", _ATTEMPT_S, exc)

    def _answer(self, admin: AdminClient, future: Future[T]) -> T:
        while not future.done():
            admin.poll(0.1)
            self._access.check()
        try:
            return future.result()
        except KafkaException as exc:
            self._access.check()
            if _timed_out(exc) and self._admin is admin:  # another thread may have replaced it already
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
        answers = self._ask(lambda admin, timeout_s: admin.list_offsets(
            request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout_s))
        return {(tp.topic, tp.partition): answer.offset for tp, answer in answers.items()}

    def earliest(self, tps: Iterable[TP]) -> dict[TP, int]:
        return self._list_offsets(tps, OffsetSpec.earliest())

    def latest(self, tps: Iterable[TP]) -> dict[TP, int]:
        """Last stable offset: records of open transactions are not readable yet."""
        return self._list_offsets(tps, OffsetSpec.latest())

    def at_time(self, tps: Iterable[TP], when_ms: int, low: Mapping[TP, int] | None = None,
                high: Mapping[TP, int] | None = None) -> dict[TP, TimedPosition]:
        """The first offset whose record timestamp is at or after `when_ms`, per partition.

        Kafka's offsets-for-times answers -1 for a time after the last record: that is the log end.
        A log that starts after the time (retention or delete-records removed its head, or the
        topic's first record is later) answers its earliest offset, which is said in `why`: records
        from that time, if any, are gone.
        """
        tps = list(tps)
        request = {TopicPartition(t, p): OffsetSpec.for_timestamp(when_ms) for t, p in tps}
        if not request:
            return {}
        low = low if low is not None else self.earliest(tps)
        high = high if high is not None else self.latest(tps)
        answers = self._ask(lambda admin, timeout_s: admin.list_offsets(
            request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout_s))
        at = iso_ms(when_ms)
        found: dict[TP, TimedPosition] = {}
        for tp, answer in answers.items():
            key = (tp.topic, tp.partition)
            if answer.offset < 0 or answer.offset >= high[key]:
                found[key] = TimedPosition(high[key], f"no record at or after {at}: starting at the log end, "
                                                      f"offset {high[key]}")
            elif answer.offset <= low[key] and answer.timestamp > when_ms:
                deleted = f" (offsets below {low[key]} were deleted)" if low[key] > 0 else ""
                found[key] = TimedPosition(low[key], f"the log starts after {at}{deleted}: starting at its "
                                                     f"earliest offset {low[key]}, "
                                                     f"a record of {iso_ms(answer.timestamp)}")
            else:
                found[key] = TimedPosition(answer.offset, f"the first record at or after {at} is offset "
                                                          f"{answer.offset}, of {iso_ms(answer.timestamp)}")
        return found

    def partitions(self, topics: Iterable[str], pattern: str | None = None) -> list[TP]:
        """The partitions of the named topics, or of every topic the pattern matches in full (as the
        service subscribes); a named topic that does not exist raises `KeyError` naming it."""
        self._refresh_metadata()
        metadata = self._admin.list_topics(timeout=_TIMEOUT_S).topics
        names = [t for t in sorted(metadata) if re.fullmatch(pattern, t)] if pattern else list(topics)
        missing = [t for t in names if t not in metadata or metadata[t].error is not None]
        if missing:
            raise KeyError(", ".join(missing))
        return sorted((t, p) for t in names for p in metadata[t].partitions)

    def active_members(self) -> list[str]:
        """The group's members right now (client id@host): an offset change must wait until none are left."""
        group = self._ask(lambda admin, timeout_s: admin.describe_consumer_groups(
            [self._group_id], request_timeout=timeout_s))[self._group_id]
        if group.state in (ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD) and not group.members:
            return []
        return [f"{m.client_id}@{m.host}" for m in group.members] or [f"(group state {group.state.name})"]

    def alter(self, offsets: Mapping[TP, int]) -> None:
        """Commit offsets for a group without members, as Kafka's tooling does; raises if any is refused."""
        request = [TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())]
        if not request:
            return
        result = self._ask(lambda admin, timeout_s: admin.alter_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(self._group_id, request)], request_timeout=timeout_s))[self._group_id]
        refused = [f"{tp.topic}:{tp.partition} ({tp.error})" for tp in result.topic_partitions or ()
                   if tp.error is not None]
        if refused:
            raise KafkaException(f"the broker refused the offsets of {', '.join(refused)}")

    def committed(self, tps: Iterable[TP] | None) -> dict[TP, int]:
        """Committed offsets of the group (of every partition it committed, for None); others absent.

        A partition named in `tps` whose commit cannot be read (not authorised, say) raises rather
        than reading as "never committed", which would start it from SINK_STARTING_OFFSETS.
        """
        explicit = tps is not None
        request = [TopicPartition(t, p) for t, p in (tps if explicit else self._every_partition())]
        if not request:
            return {}

        def attempt(timeout_s: float) -> list[TopicPartition]:
            reader = self._committed_reader()
            try:
                return reader.committed(request, timeout=timeout_s)
            except KafkaException:
                reader.poll(0)  # serves the error callback: a refused login is reported as such
                raise
        answers = self._within_budget(attempt)
        refused = [f"{tp.topic}:{tp.partition} ({tp.error})" for tp in answers if tp.error is not None]
        if refused and explicit:
            raise KafkaException(f"the committed offsets of group {self._group_id} could not be read for "
                                 f"{', '.join(refused)}")
        return {(tp.topic, tp.partition): tp.offset for tp in answers if tp.error is None and tp.offset >= 0}

    def _committed_reader(self) -> Consumer:
        if self._reader is None:
            self._reader = new_client(Consumer, {**self._config, "group.id": self._group_id,
                                                 "enable.auto.commit": False})
        return self._reader

    def _every_partition(self) -> list[TP]:
        """Every partition of the cluster the client may see: where any commit of the group could be."""
        self._refresh_metadata()
        topics = self._admin.list_topics(timeout=_TIMEOUT_S).topics
        return sorted((name, p) for name, meta in topics.items() if meta.error is None and not name.startswith("__")
                      for p in meta.partitions)

    def resolve_start(self, tps: list[TP], starting: str, gap_policy: str,
                      commit: Callable[[Mapping[TP, int]], None]) -> dict[TP, int]:
        """Where each partition starts: its committed offset, else `starting`; checks the log's bounds.

        `starting` applies only to the group's first start, while it has no committed offset at
        all. Once it has one, a partition without a commit was created (or first matched) later and
        starts at its earliest offset. This is decided from Kafka, never from the process's memory:
        a topic found while running whose uploads have not succeeded yet must not be taken for one
        present at the first start by the next process (a restart, a rolling update, another
        replica) and skipped to its end.
        `timestamp:<ISO-8601>` starts at the first record at or after that time (`at_time`).
        A `latest` or `timestamp:` position is committed as soon as it is resolved: otherwise the
        next query (a replay, a restart) would resolve it again, to a newer end or against a log
        that retention has shortened since.
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
        when_ms = starting_time_ms(starting)
        fresh = [tp for tp in tps if tp not in committed]
        timed = self.at_time(fresh, when_ms, low, high) if when_ms is not None else {}
        start: dict[TP, int] = {}
        resolved: dict[TP, int] = {}
        gaps: list[str] = []
        for tp in tps:
            topic, partition = tp
            if tp not in committed:
                if tp in timed:
                    start[tp] = resolved[tp] = timed[tp].offset
                    log.info("topic=%s partition=%d: no committed offset; SINK_STARTING_OFFSETS=%s: %s",
                             topic, partition, starting, timed[tp].why)
                    continue
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


def _timed_out(exc: KafkaException) -> bool:
    return bool(exc.args) and exc.args[0].code() in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT)
