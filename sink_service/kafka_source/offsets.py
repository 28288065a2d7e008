"""Offsets as Kafka knows them: topics, watermarks and the consumer group's committed offsets.

The consumer group's committed offsets are the service's only record of progress: this module
reads them and decides where each partition starts (`resolve_start`: a commit, else a Delta table's
position for the group, else SINK_STARTING_OFFSETS at the group's first start, else earliest); the
group member (`membership.py`) commits, and `alter` moves the offsets of a group without members.
"""

from __future__ import annotations

import contextlib
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


class CommittedOffsetsUnreadable(KafkaException):
    """The group's committed offsets could not be read: the start stops rather than guess."""

    def __str__(self) -> str:
        return str(self.args[0])


class StartPositionUnknown(CommittedOffsetsUnreadable):
    """A Delta table's position for a partition without a committed offset could not be read."""


@dataclass(frozen=True)
class Subscription:
    """What the group subscribes to: SINK_TOPICS, or every topic SINK_TOPIC_PATTERN matches in full."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None

    def topic_names(self, known: Iterable[str]) -> list[str]:
        """The named topics, or the known topics the pattern matches (as the group member subscribes), Kafka's
        internal ones (`__consumer_offsets`, `__transaction_state`) left out."""
        if self.pattern:
            return [t for t in sorted(known) if not t.startswith("__") and re.fullmatch(self.pattern, t)]
        return list(self.topics)


@dataclass(frozen=True)
class FreshStart:
    """A partition started without a committed offset: where, and from what (for the WARNING and a metric).

    `source`: `table` (a Delta table's position), `first_start` (SINK_STARTING_OFFSETS, the group's first
    start or its offsets expired) or `found_later` (earliest: created or matched after the first start)."""

    tp: TP
    offset: int
    source: str
    note: str = ""


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
        self._said: set[TP] = set()  # partitions whose start without a committed offset was said

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
                if not (_timed_out(exc) or _no_leader(exc)) or time.monotonic() >= deadline:
                    raise
                log.info("Kafka did not answer within %.0fs or knew no leader yet (%s); asking again", _ATTEMPT_S,
                         exc)

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

    def _list_offsets(self, tps: Iterable[TP], spec: OffsetSpec) -> dict[TP, tuple[int, int]]:
        """Kafka's ListOffsets answer per partition: (offset, the record's timestamp where the spec is a time)."""
        request = {TopicPartition(t, p): spec for t, p in tps}
        if not request:
            return {}
        answers = self._ask(lambda admin, timeout_s: admin.list_offsets(
            request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout_s))
        return {(tp.topic, tp.partition): (answer.offset, answer.timestamp) for tp, answer in answers.items()}

    def earliest(self, tps: Iterable[TP]) -> dict[TP, int]:
        return {tp: offset for tp, (offset, _) in self._list_offsets(tps, OffsetSpec.earliest()).items()}

    def latest(self, tps: Iterable[TP]) -> dict[TP, int]:
        """Last stable offset: records of open transactions are not readable yet."""
        return {tp: offset for tp, (offset, _) in self._list_offsets(tps, OffsetSpec.latest()).items()}

    def at_time(self, tps: Iterable[TP], when_ms: int, low: Mapping[TP, int] | None = None,
                high: Mapping[TP, int] | None = None) -> dict[TP, TimedPosition]:
        """The first offset whose record timestamp is at or after `when_ms`, per partition.

        Kafka's offsets-for-times answers -1 for a time after the last record: that is the log end.
        A log that starts after the time (retention or delete-records removed its head, or the
        topic's first record is later) answers its earliest offset, which is said in `why`: records
        from that time, if any, are gone.
        """
        tps = list(tps)
        if not tps:
            return {}
        low = low if low is not None else self.earliest(tps)
        high = high if high is not None else self.latest(tps)
        at = iso_ms(when_ms)
        found: dict[TP, TimedPosition] = {}
        for key, (offset, timestamp) in self.first_at_or_after(tps, when_ms).items():
            if offset < 0 or offset >= high[key]:
                found[key] = TimedPosition(high[key], f"no record at or after {at}: starting at the log end, "
                                                      f"offset {high[key]}")
            elif offset <= low[key] and timestamp > when_ms:
                deleted = f" (offsets below {low[key]} were deleted)" if low[key] > 0 else ""
                found[key] = TimedPosition(low[key], f"the log starts after {at}{deleted}: starting at its "
                                                     f"earliest offset {low[key]}, a record of {iso_ms(timestamp)}")
            else:
                found[key] = TimedPosition(offset, f"the first record at or after {at} is offset "
                                                   f"{offset}, of {iso_ms(timestamp)}")
        return found

    def first_at_or_after(self, tps: Iterable[TP], when_ms: int) -> dict[TP, tuple[int, int]]:
        """Kafka's offsets-for-times, per partition: the first offset whose record timestamp is at or
        after `when_ms`, with that timestamp; an offset of -1 when every record is older."""
        return self._list_offsets(tps, OffsetSpec.for_timestamp(when_ms))

    def partitions(self, topics: Iterable[str], pattern: str | None = None) -> list[TP]:
        """The partitions of the named topics, or of every topic the pattern matches in full (as the
        service subscribes); a named topic that does not exist raises `KeyError` naming it."""
        self._refresh_metadata()
        metadata = self._admin.list_topics(timeout=_TIMEOUT_S).topics
        names = Subscription(tuple(topics), pattern).topic_names(metadata)
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
        """Commit offsets for a group without members, as Kafka's tooling does; raises if any is refused.

        Through a consumer of the group that never joins it (a "simple" consumer's commit), not the admin
        client's coordinator call that can abort the process (librdkafka #4605, see the class). A broker
        refuses it (UNKNOWN_MEMBER_ID) while the group has members: a running service would commit over it.
        """
        request = [TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())]
        if not request:
            return
        reader = self._committed_reader()
        try:
            answers = reader.commit(offsets=request, asynchronous=False) or []
        except KafkaException:
            reader.poll(0)  # serves the error callback: a refused login is reported as such
            self._access.check()
            raise
        refused = [f"{tp.topic}:{tp.partition} ({tp.error})" for tp in answers if tp.error is not None]
        if refused:
            raise KafkaException(f"the broker refused the offsets of {', '.join(refused)}")

    def committed(self, tps: Iterable[TP]) -> dict[TP, int]:
        """Committed offsets of the group for these partitions; a partition never committed is absent.

        A partition whose commit cannot be read (not authorised, a coordinator that is loading or
        moving) is asked again within `_TIMEOUT_S`, then raises `CommittedOffsetsUnreadable`: read as
        "never committed" it would start at SINK_STARTING_OFFSETS, under `latest` a silent skip.
        """
        request = [TopicPartition(t, p) for t, p in tps]
        if not request:
            return {}

        def attempt(timeout_s: float) -> list[TopicPartition]:
            reader = self._committed_reader()
            try:
                return reader.committed(request, timeout=timeout_s)
            except KafkaException as exc:
                reader.poll(0)  # serves the error callback: a refused login is reported as such
                if _no_leader(exc):  # its metadata predates a broker restart or a new partition
                    with contextlib.suppress(KafkaException):
                        reader.list_topics(timeout=min(1.0, timeout_s))
                raise
        deadline = time.monotonic() + _TIMEOUT_S
        while True:
            answers = self._within_budget(attempt)
            refused = [f"{tp.topic}:{tp.partition} ({tp.error})" for tp in answers if tp.error is not None]
            if not refused:
                return {(tp.topic, tp.partition): tp.offset for tp in answers if tp.offset >= 0}
            if time.monotonic() >= deadline:
                raise CommittedOffsetsUnreadable(
                    f"the committed offsets of consumer group {self._group_id} could not be read for "
                    f"{', '.join(refused[:10])}{' …' if len(refused) > 10 else ''} within {_TIMEOUT_S:.0f}s. "
                    "Nothing was started: a partition read as never committed would start at "
                    "SINK_STARTING_OFFSETS. Check the group's and topics' ACLs (Describe and Read for this "
                    "login) and the broker's group coordinator; the service tries again with backoff")
            log.info("committed offsets of group %s not readable for %s; asking again", self._group_id,
                     ", ".join(refused[:10]))
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    def _committed_reader(self) -> Consumer:
        if self._reader is None:
            self._reader = new_client(Consumer, {**self._config, "group.id": self._group_id,
                                                 "enable.auto.commit": False})
        return self._reader

    def subscribed(self, subscription: Subscription) -> list[TP]:
        """The partitions the subscription covers now: named topics that exist, or the pattern's matches."""
        self._refresh_metadata()
        metadata = self._admin.list_topics(timeout=_TIMEOUT_S).topics
        names = subscription.topic_names(metadata)
        return sorted((t, p) for t in names if t in metadata and metadata[t].error is None
                      for p in metadata[t].partitions)

    def resolve_start(self, tps: list[TP], starting: str, gap_policy: str,
                      commit: Callable[[Mapping[TP, int]], None], *,
                      subscription: Subscription | None = None,
                      table_position: Callable[[str, int], int | None] | None = None,
                      commit_first_start: Callable[[Mapping[TP, int]], None] | None = None,
                      on_fresh: Callable[[list[FreshStart]], None] | None = None) -> dict[TP, int]:
        """Where each of `tps` (this member's partitions) starts; checks the log's bounds.

        A partition starts at its committed offset; without one, at the position a Delta table's
        application transaction for the group holds (`table_position`: the first offset the table does
        not hold), which survives the expiry of the group's offsets (offsets.retention.minutes).
        Without either, `starting` applies only at the group's first start, while neither Kafka nor
        the table has a position for any subscribed partition. Once one has, a partition without one
        was created (or first matched) later and starts at its earliest offset (`uncommitted_start`).
        This is decided from Kafka and the table, never from the process's memory: a topic found while
        running whose uploads have not succeeded yet must not be taken for one present at the first
        start by the next process (a restart, a rolling update, another replica) and skipped to its end.

        At the first start under `latest` or `timestamp:<ISO-8601>` (`at_time`) the position of every
        subscribed partition is resolved and committed before anything is read, this member's and the
        others' still without a commit in one request (`commit_first_start`), so the members of a new
        group started together all see the same decision, however their starts interleave. A
        `latest`, `timestamp:` or table position is committed as soon as it is resolved: otherwise the
        next query (a replay, a restart) would resolve it again, to a newer end or against a log that
        retention has shortened since. Each partition started without a committed offset is said at
        WARNING once per process and handed to `on_fresh` (a metric).

        A committed or table position outside [earliest, end] is a gap: `fail` raises `OffsetGapError`
        and commits nothing; `skip` restarts the partition at its earliest available offset, commits
        that and logs `RECORDS LOST`.
        """
        # `subscribed` refreshes the metadata: the group may assign partitions newer than this client's
        # cached metadata, and offset lookups for those fail (unknown partition) until it is refreshed.
        subscription = subscription or Subscription(tuple(sorted({t for t, _ in tps})))
        subscribed = sorted(set(self.subscribed(subscription)) | set(tps))
        committed = self.committed(subscribed)
        table = self._table_positions([tp for tp in subscribed if tp not in committed], table_position)
        history = bool(committed) or bool(table)
        rule = uncommitted_start(starting, history)
        first_start = not history and rule != "earliest" and commit_first_start is not None
        scope = subscribed if first_start else tps
        low = self.earliest(scope)
        high = self.latest(scope)
        when_ms = starting_time_ms(rule)
        fresh = [tp for tp in scope if tp not in committed and tp not in table]
        timed = self.at_time(fresh, when_ms, low, high) if when_ms is not None else {}
        start: dict[TP, int] = {}
        resolved: dict[TP, int] = {}
        gaps: list[str] = []
        for tp in scope:
            topic, partition = tp
            if tp in fresh:
                if tp in timed:
                    start[tp] = resolved[tp] = timed[tp].offset
                elif rule == "latest":
                    start[tp] = resolved[tp] = high[tp]
                else:
                    start[tp] = low[tp]
                continue
            was, source = (committed[tp], "committed offset") if tp in committed else \
                (table[tp], "the Delta table's position (its application transaction for the group)")
            if tp in table:
                resolved[tp] = was
            if low[tp] <= was <= high[tp]:
                start[tp] = was
                continue
            where = f"topic={topic} partition={partition}: {source} {was} but "
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
        mine = set(tps)
        if first_start and commit_first_start is not None:
            # One request for this member's partitions and the others' still without a commit (another
            # member that started meanwhile committed its own): a refusal leaves the group new, and the
            # next query decides again; half of it committed would make the rest look found later.
            taken = self.committed(sorted(tp for tp in resolved if tp not in mine))
            commit_first_start({tp: o for tp, o in resolved.items() if tp not in taken})
        elif any(tp in resolved for tp in tps):
            # through the group member: a broker refuses others while it is active
            commit({tp: o for tp, o in resolved.items() if tp in mine})
        self._say_fresh([FreshStart(tp, start[tp], "table" if tp in table else
                                    "found_later" if history else "first_start", timed[tp].why if tp in timed else "")
                         for tp in scope if tp not in committed], starting, on_fresh)
        return {tp: start[tp] for tp in tps}

    def _table_positions(self, tps: list[TP], table_position: Callable[[str, int], int | None] | None,
                         ) -> dict[TP, int]:
        """The Delta table's position for each partition that has one; an unreadable table stops the start."""
        if table_position is None:
            return {}
        found: dict[TP, int] = {}
        for topic, partition in tps:
            try:
                position = table_position(topic, partition)
            except Exception as exc:  # deltalake's and the store's errors alike: no start on a guess
                raise StartPositionUnknown(
                    f"topic={topic} partition={partition} has no committed offset and the Delta table's "
                    f"position for it could not be read ({type(exc).__name__}: {exc}); nothing was started, "
                    "the service tries again with backoff") from exc
            if position is not None:
                found[(topic, partition)] = position
        return found

    def _say_fresh(self, starts: list[FreshStart], starting: str,
                   on_fresh: Callable[[list[FreshStart]], None] | None) -> None:
        """A WARNING for the partitions starting without a committed offset, once per process and partition:
        why that may be and where each starts. An alert uses the metric `on_fresh` feeds."""
        new = [s for s in starts if s.tp not in self._said]
        if not new:
            return
        self._said.update(s.tp for s in new)
        expired = ("the group's committed offsets expired (offsets.retention.minutes, 7 days by default, "
                   "counted from when the group was left without members) or were deleted")
        why = {
            "table": f"{expired}; resuming at the Delta table's position for the group (its application "
                     "transaction)",
            "found_later": "the group has positions for other partitions, so this one was created or first "
                           f"matched after the group's first start (or {expired}); starting at its earliest offset"
                           + ("" if starting == "earliest" else f", not at SINK_STARTING_OFFSETS={starting}"),
            "first_start": f"a new group, or {expired}; starting at SINK_STARTING_OFFSETS={starting}"
                           + ("" if starting == "earliest" else ", committed at once"),
        }
        # One line per topic and reason, not per partition: a new group over hundreds of partitions said
        # the same sentence hundreds of times.
        alike: dict[tuple[str, str, str], list[FreshStart]] = {}
        for s in sorted(new, key=lambda s: s.tp):
            alike.setdefault((s.tp[0], s.source, s.note), []).append(s)
        for (topic, source, note), same in alike.items():
            note = f" ({note})" if note else ""
            if len(same) == 1:
                log.warning("topic=%s partition=%d: no committed offset in consumer group %s: %s: offset %d%s",
                            topic, same[0].tp[1], self._group_id, why[source], same[0].offset, note)
            else:
                log.warning("topic=%s partitions=%s (%d): no committed offset in consumer group %s: %s: "
                            "offsets (partition:offset) %s%s", topic, _spans([s.tp[1] for s in same]), len(same),
                            self._group_id, why[source], _offsets_by_partition(same), note)
        if on_fresh is not None:
            on_fresh(new)


def _spans(numbers: list[int]) -> str:
    """Sorted partition numbers as runs: [0, 1, 2, 5] -> "0-2,5"."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _offsets_by_partition(starts: list[FreshStart]) -> str:
    """Each partition's start offset, consecutive partitions starting at the same offset as one run:
    "0-95:0", or "0:150 1:140"."""
    runs: list[tuple[list[int], int]] = []
    for s in starts:
        if runs and runs[-1][1] == s.offset and s.tp[1] == runs[-1][0][-1] + 1:
            runs[-1][0].append(s.tp[1])
        else:
            runs.append(([s.tp[1]], s.offset))
    return " ".join(f"{_spans(partitions)}:{offset}" for partitions, offset in runs)


def uncommitted_start(starting: str, history: bool) -> str:
    """Where a partition without a committed offset (or table position) starts: SINK_STARTING_OFFSETS
    while the group has no position for any subscribed partition (its first start), else its earliest
    offset (created or matched later). One rule for the service and `sink-service check`."""
    return "earliest" if history else starting


def _no_leader(exc: KafkaException) -> bool:
    """librdkafka's "Failed to query partition leaders": its metadata does not know them yet."""
    error = exc.args[0] if exc.args else None
    return isinstance(error, KafkaError) and error.code() == KafkaError._NOENT


def _timed_out(exc: KafkaException) -> bool:
    error = exc.args[0] if exc.args else None
    return isinstance(error, KafkaError) and error.code() in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT)
