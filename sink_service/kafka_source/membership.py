"""Consumer group membership: which partitions this instance owns, and commits the broker can fence.

Instances started with one SINK_GROUP_ID share the partitions the way Kafka consumers do: each
joins the group with a consumer that never fetches (its partitions stay paused; records are read
by the executors) and plans only the partitions the group assigned it. Commits go through this
member, so the broker refuses them from a member that no longer holds the group's generation.

Every call on the consumer runs on one thread: confluent-kafka's synchronous commit from another
thread hangs while that thread is inside poll() (seen with noida-db). The batch thread hands its
commit over and waits for the answer.

A revoke (a rebalance) waits for the batch in flight, which then commits. A lost assignment (the
session expired, or the member was fenced) does not: the broker has already given the partitions to
another member, so ownership ends at once and the service stops the query, whose tasks stop
uploading. The member thread's end by an error is fatal for the service (`failure`): without it no
commit can be answered.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from sink_service.shared.kafka_access import AccessWatch, KafkaAccessRefused, new_client

log = logging.getLogger(__name__)

TP = tuple[str, int]
POLL_S = 0.05  # how long a commit may wait for the member thread; also its callback latency
ANSWER_S = 30.0  # a commit without an answer for this long counts as refused
# Fenced this often within the window, the member is not losing a race after a broker stall: another
# live client uses its group.instance.id, and rejoining would only fence that one in turn, forever.
FENCED_LIMIT = 3
FENCED_WINDOW_S = 600.0
DEFAULT_SESSION_TIMEOUT_MS = "10000"  # a killed instance's partitions move after this long


class CommitRefused(Exception):
    """The partitions are no longer this member's: they moved, or are moving, to another one."""


@dataclass(frozen=True)
class _State:
    """What the member holds, replaced whole so that a reader on another thread sees one moment:
    never a new epoch with an old `revoking`, nor an assignment with another assignment's epoch."""

    epoch: int = 0  # counts the changes
    assigned: frozenset[TP] | None = None  # None while a rebalance is in progress
    revoking: bool = False  # a revoke waits for the batch in flight: no new batch starts


@dataclass
class _CommitRequest:
    offsets: dict[TP, int]
    epoch: int
    others: bool = False  # the group's first start: positions of partitions other members own
    done: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None


def instance_id(scratch_path: str) -> str:
    """Stable across restarts of one instance (same host, same scratch area), distinct between replicas."""
    return f"{socket.gethostname()}-{hashlib.sha256(scratch_path.encode()).hexdigest()[:12]}"


class GroupMembership:
    """The group's assignment, changed only on the member thread; `epoch` counts the changes."""

    def __init__(self, client_config: Mapping[str, str], group_id: str, subscription: list[str],
                 refresh_interval_ms: int, batch_idle: Callable[[], bool], revoke_wait_s: float,
                 instance_id: str, on_change: Callable[[frozenset[TP] | None], None] = lambda _assigned: None):
        self._access = AccessWatch()
        config = {
            "session.timeout.ms": DEFAULT_SESSION_TIMEOUT_MS,
            **client_config,  # SINK_KAFKA_* cannot override what follows: the config refuses those names
            # Eager: a rebalance revokes everything and the query restarts from the new assignment,
            # which it does for any change anyway; it behaves the same on every broker tried.
            "partition.assignment.strategy": "roundrobin",
            "group.protocol": "classic",
            # Static membership: an instance restarted after kill -9 takes its place back at once.
            # noida-db never drops a dead dynamic member, so without it the group would stay stuck.
            "group.instance.id": instance_id,
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "topic.metadata.refresh.interval.ms": refresh_interval_ms,  # new topics and partitions
            "error_cb": self._access,  # a refused login or certificate ends the member: see `access`
        }
        self._config = config
        self._consumer = new_client(Consumer, config)  # KafkaAccessRefused: a TLS file it cannot use
        self._subscription = subscription
        self._group_id = group_id
        self._last_error: int | None = None
        self._fatal_at: list[float] = []  # monotonic times of fatal errors within FENCED_WINDOW_S
        self.gave_up = False  # fenced FENCED_LIMIT times: stays out of the group (never ready)
        self._batch_idle = batch_idle
        self._revoke_wait_s = revoke_wait_s
        self._on_change = on_change
        self._requests: queue.Queue[_CommitRequest] = queue.Queue()
        self._closing = threading.Event()
        self._assigned_event = threading.Event()
        self._state = _State()  # replaced whole, on the member thread only
        self.failure: str | None = None  # why the member thread ended, if an error ended it: fatal
        self._thread = threading.Thread(target=self._run, name="group-member", daemon=True)

    @property
    def epoch(self) -> int:
        return self._state.epoch

    @property
    def assigned(self) -> frozenset[TP] | None:
        return self._state.assigned

    @property
    def revoking(self) -> bool:
        return self._state.revoking

    def start(self) -> None:
        self._subscribe()
        self._thread.start()

    def _subscribe(self) -> None:
        self._consumer.subscribe(self._subscription, on_assign=self._assign, on_revoke=self._revoke,
                                 on_lost=self._lose)

    def close(self) -> None:
        """Stop being a member; the last thing the service does with Kafka."""
        self._closing.set()
        self._thread.join(ANSWER_S)

    def wait_assignment(self, timeout_s: float, stop: threading.Event | None = None,
                        ) -> tuple[frozenset[TP], int] | None:
        """The settled assignment and its epoch; None if the group gave none within the timeout or
        `stop` was set meanwhile (a SIGTERM while the broker is unreachable must not wait it out)."""
        deadline = time.monotonic() + timeout_s
        while (time.monotonic() < deadline and not self._closing.is_set() and self.failure is None
               and not (stop and stop.is_set())):
            state = self._state
            if state.assigned is not None and not state.revoking:
                return state.assigned, state.epoch
            self._assigned_event.wait(0.1)
        return None

    def owns(self, epoch: int) -> bool:
        """True while the assignment planned at `epoch` is still this member's."""
        state = self._state  # one read: see _State
        return epoch == state.epoch and not state.revoking

    def commit(self, offsets: Mapping[TP, int], epoch: int, others: bool = False) -> None:
        """Commit through the member; raises CommitRefused if the partitions are no longer ours.

        `others`: start positions for partitions other members own, resolved at the group's first start
        so that every member starts where SINK_STARTING_OFFSETS says (`KafkaOffsets.resolve_start`); the
        broker checks the generation only, so they are accepted from any member of it."""
        if not offsets:
            return
        request = _CommitRequest(dict(offsets), epoch, others)
        self._requests.put(request)
        deadline = time.monotonic() + ANSWER_S
        while not request.done.wait(POLL_S):
            if self.failure is not None:  # nobody is left to answer
                raise CommitRefused(self.failure)
            if time.monotonic() > deadline:
                raise CommitRefused(f"no answer to the commit within {ANSWER_S:.0f}s")
        if request.error is not None:
            raise request.error

    # --- the member thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._member_loop()
        except BaseException as exc:  # any end but close() leaves the service without commits
            self._die(exc)

    def _die(self, exc: BaseException) -> None:
        """The member thread ends by an error: nothing polls, commits, or follows a rebalance any
        more. Give up the assignment and say why; the service stops on `failure`."""
        self.failure = (str(exc) if isinstance(exc, KafkaAccessRefused) else
                        f"the consumer group member of {self._group_id} stopped: {type(exc).__name__}: {exc}; "
                        "no commit can be made without it")
        if not isinstance(exc, KafkaAccessRefused):  # that one is said once, by the service as it stops
            log.error("%s", self.failure, exc_info=exc)
        self._state = _State(self._state.epoch + 1)
        self._on_change(None)
        self._serve_commits()  # each answered with the failure

    def _member_loop(self) -> None:
        while not self._closing.is_set():
            self._serve_commits()
            message = self._consumer.poll(POLL_S)  # never a record: every assigned partition is paused
            self._access.check()
            error = message.error() if message is not None else None
            if error is not None:
                self._report(error)
                if error.code() == KafkaError._FATAL:  # the event's own fatal() is False; its code says it
                    self._on_fatal()
        self._serve_commits()
        # Revokes (the drain already ended the batch). A static member does not leave the group: its
        # partitions move after the session timeout, or at once to this instance restarted.
        self._consumer.close()
        self._serve_commits()

    def _on_fatal(self) -> None:
        if self.gave_up:
            return
        assigned = self.assigned
        if assigned is not None:  # librdkafka does not always revoke before a fatal error
            self._lose(self._consumer, [TopicPartition(t, p) for t, p in sorted(assigned)])
        now = time.monotonic()
        self._fatal_at = [t for t in self._fatal_at if now - t < FENCED_WINDOW_S] + [now]
        if len(self._fatal_at) < FENCED_LIMIT:
            self._replace_consumer()
            return
        self.gave_up = True
        log.error("consumer group %s: this member was fenced %d times within %.0f s: another running client "
                  "uses its group.instance.id %r (two instances with one host name and one SINK_SCRATCH_DIR "
                  "path, e.g. containers with host networking). It stays out of the group and is never ready; "
                  "give each instance its own host name or scratch path, then restart it",
                  self._group_id, len(self._fatal_at), FENCED_WINDOW_S, self._config["group.instance.id"])

    def _replace_consumer(self) -> None:
        """A fatal error (e.g. this static member fenced after a broker stall: its session expired and
        a rejoin under the same group.instance.id overtook an old request) ends a librdkafka client
        for good. Without a new one the instance would hold nothing and never be ready again."""
        log.warning("consumer group %s: the group member cannot continue; rejoining with a new one", self._group_id)
        with contextlib.suppress(KafkaException, RuntimeError):
            self._consumer.close()
        self._consumer = Consumer(self._config)
        self._last_error = None
        self._subscribe()

    def _report(self, error: KafkaError) -> None:
        """Subscription errors (e.g. a topic that does not exist) once each: with none of its topics
        found, an instance is an idle standby, which must not look like health."""
        if error.code() != self._last_error:
            self._last_error = error.code()
            log.warning("consumer group %s: %s", self._group_id, error.str())

    def _serve_commits(self) -> None:
        while True:
            try:
                request = self._requests.get_nowait()
            except queue.Empty:
                return
            try:
                if self.failure is not None:
                    raise CommitRefused(self.failure)
                self._commit(request)
            except Exception as exc:  # handed to the batch thread, which decides
                request.error = exc
            request.done.set()

    def _commit(self, request: _CommitRequest) -> None:
        state = self._state
        assigned = state.assigned or frozenset()
        stray = [] if request.others else sorted(tp for tp in request.offsets if tp not in assigned)
        if request.epoch != state.epoch or stray:
            # The broker checks the generation, not who owns a partition: check both here.
            raise CommitRefused(f"the assignment changed since this batch was planned (not ours: {stray})")
        try:
            results = self._consumer.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in sorted(request.offsets.items())],
                asynchronous=False)
        except KafkaException as exc:  # ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS...
            raise CommitRefused(f"the broker refused the commit: {exc.args[0]}") from exc
        errors = [tp for tp in results or [] if tp.error is not None]
        if errors:
            raise CommitRefused(f"the broker refused the commit: {errors}")

    def _assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # The executors read; this member only holds the partitions (its commits name their offsets).
        # Assigned at the log end and paused at once: a fetch started between the two (seen under CPU
        # load) then brings no backlog, where from the committed offset it brought 350 kB.
        consumer.assign([TopicPartition(tp.topic, tp.partition, OFFSET_END) for tp in partitions])
        consumer.pause(partitions)
        assigned = frozenset((tp.topic, tp.partition) for tp in partitions)
        self._state = _State(self._state.epoch + 1, assigned)
        log.info("group assignment: %d partition(s) %s", len(assigned),
                 ", ".join(f"{t}:{p}" for t, p in sorted(assigned)) or "none (standby: idle and ready)")
        self._on_change(assigned)
        self._assigned_event.set()

    def _revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Let the batch in flight finish and commit before the partitions go to another member."""
        self._state = replace(self._state, revoking=True)  # no new batch starts on the old assignment
        deadline = time.monotonic() + self._revoke_wait_s
        while not self._batch_idle() and time.monotonic() < deadline:
            self._serve_commits()
            time.sleep(POLL_S)
        self._serve_commits()
        if not self._batch_idle():
            log.warning("rebalance: the batch in flight did not finish within %.0fs; its ranges will be "
                        "replayed by the partitions' next owner", self._revoke_wait_s)
        self._assigned_event.clear()
        self._state = _State(self._state.epoch + 1)
        log.info("group rebalance: %d partition(s) revoked", len(partitions))
        self._on_change(None)

    def _lose(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """The session expired or this member was fenced: the partitions are already another member's.

        Unlike a revoke, this does not wait for the batch in flight: its tasks would go on uploading
        beside the new owner's, and on an endpoint that applies files in arrival order an older file
        could land after a newer one. The new epoch makes the service stop the query (which cancels
        its tasks) and refuses the batch's commit; the new owner replays its ranges.
        """
        self._assigned_event.clear()
        self._state = _State(self._state.epoch + 1)
        log.warning("consumer group %s: assignment lost (session expired or member fenced): %d partition(s) "
                    "%s belong to another member now; the batch in flight is stopped, not waited for, and its "
                    "ranges are replayed by their owner", self._group_id, len(partitions),
                    ", ".join(f"{tp.topic}:{tp.partition}" for tp in partitions) or "-")
        self._on_change(None)
