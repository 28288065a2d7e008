"""What `sink-service check` asks Kafka: the broker, the topics, the group, the dead-letter topic.

Each question is a read (metadata, offsets, descriptions, ACL-authorised operations, a validate-only
create): nothing is produced, committed, joined or created. The client is built from the service's
own `kafka_client_config()` and its refusals are read with the service's `refusal()` and
`client_refusal()`, so a wrong password names SINK_KAFKA_SASL_USERNAME/SINK_KAFKA_SASL_PASSWORD, an
untrusted CA SINK_KAFKA_SSL_CA_LOCATION, a client certificate the broker refuses
SINK_KAFKA_SSL_CERTIFICATE_LOCATION and a key that does not decrypt SINK_KAFKA_SSL_KEY_PASSWORD,
exactly as the service would when it stopped on them.

Every wait is bounded by one deadline per probe: an unreachable broker is one FAIL line, not a hang.
librdkafka retries a refused connection forever; "all brokers down" is therefore taken as the answer
at once (the check is a one-shot question), a silent address as no answer by the deadline.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AclOperation, AdminClient, ConfigResource, NewTopic, OffsetSpec, ResourceType

from sink_service.check.probe import FAIL, OK, SKIP, WARN, Probe
from sink_service.shared.kafka_access import client_refusal, refusal

if TYPE_CHECKING:
    from sink_service.config import SinkConfig

T = TypeVar("T")

BOOTSTRAP_SETTING = "SINK_KAFKA_BOOTSTRAP_SERVERS"
SHOWN_TOPICS = 10  # a pattern's matches named in its line; the rest are counted
HTTP_ANSWER = "1213486160"  # "HTTP" read as a Kafka response size: librdkafka talked to a web server


class NoAnswer(Exception):
    """The broker did not answer in time, or refused; `probe` is the line to print."""

    def __init__(self, probe: Probe):
        super().__init__(probe.line())
        self.probe = probe


@dataclass
class _Errors:
    """The client's `error_cb`: the first refusal no retry changes, and whether every broker is down."""

    refused: str | None = None
    all_down: str | None = None
    last: list[str] = field(default_factory=list)

    def __call__(self, error: KafkaError) -> None:
        if self.refused is None:
            self.refused = refusal(error)
        if error.code() == KafkaError._ALL_BROKERS_DOWN and self.all_down is None:
            self.all_down = error.str()
        else:
            text = re.sub(r"\s*\(after \d+ms in state \w+\)", "", error.str())
            if HTTP_ANSWER in text:
                text += " (an HTTP server answered: is this a Kafka listener's address?)"
            if text not in self.last:
                self.last = [*self.last[-1:], text]


def refusal_fix(message: str) -> str:
    """The settings a refusal from `refusal()` or `client_refusal()` names, for the line's `fix` part:
    the first SINK_* its advice names (the key password before the key location it mentions)."""
    advice = re.split(r":\s*(?:check|set) ", message)[-1]
    for setting in ("SINK_KAFKA_SSL_KEY_PASSWORD", "SINK_KAFKA_SSL_CERTIFICATE_LOCATION",
                    "SINK_KAFKA_SSL_KEY_LOCATION", "SINK_KAFKA_SSL_CA_LOCATION"):
        if advice.startswith(setting):
            return setting
    if "SINK_KAFKA_SASL_" in advice:
        return "SINK_KAFKA_SASL_USERNAME/SINK_KAFKA_SASL_PASSWORD (and SINK_KAFKA_SASL_MECHANISM)"
    found = re.search(r"SINK_KAFKA_[A-Z_]+", advice)
    return found.group(0) if found else "the SINK_KAFKA_* settings"


def _first_sentence(message: str) -> str:
    """`refusal()` ends with its own "check X" advice, which the line's fix part replaces."""
    return re.split(r":\s*(?:check|set) SINK_", message, maxsplit=1)[0]


class KafkaProbes:
    """The Kafka half of the check, over one admin client; each method returns its lines."""

    def __init__(self, config: SinkConfig, timeout_s: float):
        self.config = config
        self.timeout_s = timeout_s
        self.errors = _Errors()
        self.client_config: dict[str, Any] = {**config.kafka_client_config(), "error_cb": self.errors,
                                              "log_level": 0}
        self.admin: AdminClient | None = None
        self.topic_names: list[str] = []
        self.log_end: dict[tuple[str, int], int] = {}
        self.broker_ids: list[int] = []

    # --- waiting, bounded ---------------------------------------------------------------------
    def _raise_if_refused(self, what: str) -> None:
        if self.errors.refused is not None:
            raise NoAnswer(Probe(FAIL, what, _first_sentence(self.errors.refused), refusal_fix(self.errors.refused)))

    def _wait(self, future: Future[T], what: str, fix: str | None = BOOTSTRAP_SETTING) -> T:
        """A request's answer within the probe's timeout; a refusal ends the wait at once."""
        assert self.admin is not None
        deadline = time.monotonic() + self.timeout_s
        while not future.done():
            self.admin.poll(0.05)
            self._raise_if_refused(what)
            if time.monotonic() >= deadline:
                future.cancel()
                raise NoAnswer(Probe(FAIL, what, f"no answer within {self.timeout_s:g} s", fix))
        return future.result()

    # --- the probes ---------------------------------------------------------------------------
    def broker(self) -> Probe:
        """Reachable, and the login and certificate accepted: the first metadata answer proves both."""
        c = self.config
        protocol = self.client_config.get("security.protocol", "plaintext")
        mechanism = self.client_config.get("sasl.mechanism")
        security = f"{protocol}" + (f", {mechanism}" if mechanism and "sasl" in protocol.lower() else "")
        what = f"Kafka broker {c.kafka_bootstrap_servers} ({security})"
        try:
            self.admin = AdminClient(self.client_config)
        except KafkaException as exc:  # a client setting librdkafka refuses (a CA file it cannot read, ...)
            why = client_refusal(exc.args[0], self.client_config)  # as the service would say it stopping
            if why is not None:
                return Probe(FAIL, what, _first_sentence(why), refusal_fix(why))
            return Probe(FAIL, what, f"the client could not be made: {exc.args[0].str()}", _setting_in(
                exc.args[0].str(), c.kafka_options))
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                metadata = self.admin.list_topics(timeout=min(0.25, max(0.05, deadline - time.monotonic())))
                break
            except KafkaException:
                self.admin.poll(0)
                try:
                    self._raise_if_refused(what)
                except NoAnswer as no:
                    return no.probe
                if self.errors.all_down is not None:
                    detail = "; ".join(self.errors.last) or self.errors.all_down
                    return Probe(FAIL, what, f"not reachable: {detail}", BOOTSTRAP_SETTING)
                if time.monotonic() >= deadline:
                    detail = f" (last error: {self.errors.last[-1]})" if self.errors.last else ""
                    return Probe(FAIL, what, f"no answer within {self.timeout_s:g} s{detail}", BOOTSTRAP_SETTING)
        self.topic_names = sorted(metadata.topics)
        self.broker_ids = sorted(metadata.brokers)
        return Probe(OK, what, f"{len(metadata.brokers)} broker(s) answered")

    def topics(self) -> list[Probe]:
        """Each configured topic present and readable (or the pattern's matches)."""
        c = self.config
        if c.topic_pattern:
            return [self._pattern(c.topic_pattern)]
        return [self._topic(t) for t in c.topics]

    def _topic(self, topic: str) -> Probe:
        what = f"topic {topic}"
        try:
            described = self._describe([topic], what)[topic]
        except NoAnswer as no:
            return no.probe
        if isinstance(described, KafkaException):
            return _topic_error(what, described, "SINK_TOPICS")
        partitions, operations = described
        if operations is not None and AclOperation.READ not in operations:
            return Probe(FAIL, what, f"this login may not read it (allowed: {_names(operations)})",
                         "the topic's ACLs (grant Read to this login) or SINK_KAFKA_SASL_USERNAME")
        try:
            records = self._records(topic, partitions)
        except NoAnswer as no:
            return no.probe
        read = "readable by this login" if operations is not None else \
            "the broker does not report ACLs: read access not proven"
        return Probe(OK, what, f"{partitions} partition(s), {records} record(s); {read}")

    def _pattern(self, pattern: str) -> Probe:
        what = f"topics matching SINK_TOPIC_PATTERN={pattern}"
        matches = [t for t in self.topic_names if re.fullmatch(pattern, t)]
        if not matches:
            return Probe(WARN, what, "no topic matches yet; the service starts and picks one up within "
                         f"SINK_TOPIC_REFRESH_INTERVAL_MS ({self.config.topic_refresh_interval_ms} ms) of its "
                         "creation", "SINK_TOPIC_PATTERN if a topic should match now")
        try:
            described = self._describe(matches, what)
        except NoAnswer as no:
            return no.probe
        bad = {t: d for t, d in described.items() if isinstance(d, KafkaException)}
        unreadable = [t for t, d in described.items() if not isinstance(d, KafkaException)
                      and d[1] is not None and AclOperation.READ not in d[1]]
        if bad or unreadable:
            reasons = [f"{t}: {e.args[0].str()}" for t, e in bad.items()] + [f"{t}: no Read ACL" for t in unreadable]
            return Probe(FAIL, what, f"{len(matches)} match(es), {len(reasons)} not readable: "
                         f"{'; '.join(reasons[:SHOWN_TOPICS])}", "the topics' ACLs (grant Read to this login)")
        shown = ", ".join(matches[:SHOWN_TOPICS]) + (f", … ({len(matches)} in all)" if len(matches) > SHOWN_TOPICS
                                                     else "")
        reported = all(not isinstance(d, KafkaException) and d[1] is not None for d in described.values())
        read = "readable by this login" if reported else "the broker does not report ACLs: read access not proven"
        return Probe(OK, what, f"{shown}; {read}")

    def _describe(self, topics: list[str], what: str) -> dict[str, tuple[int, list[Any] | None] | KafkaException]:
        """Partition count and the operations this login may perform (None: the broker does not say)."""
        assert self.admin is not None
        futures = self.admin.describe_topics(TopicCollection(topics), include_authorized_operations=True,
                                             request_timeout=self.timeout_s)
        answers: dict[str, tuple[int, list[Any] | None] | KafkaException] = {}
        for topic, future in futures.items():
            try:
                d = self._wait(future, what)
                answers[topic] = (len(d.partitions), d.authorized_operations)
            except KafkaException as exc:
                answers[topic] = exc
        return answers

    def _records(self, topic: str, partitions: int) -> int:
        """Records between the log starts and ends: a list-offsets round trip, as the service's first."""
        assert self.admin is not None
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        total = 0
        ends: dict[tuple[str, int], int] = {}
        for spec, sign in ((OffsetSpec.latest(), 1), (OffsetSpec.earliest(), -1)):
            futures = self.admin.list_offsets({tp: spec for tp in tps}, request_timeout=self.timeout_s)
            for tp, future in futures.items():
                offset = self._wait(future, f"topic {topic}").offset
                total += sign * offset
                if sign == 1:
                    ends[(tp.topic, tp.partition)] = offset
        self.log_end.update(ends)
        return total

    def group(self) -> Probe:
        """The group described (its state, members, permissions) and its committed offsets read."""
        c = self.config
        what = f"consumer group {c.group_id}"
        assert self.admin is not None
        try:
            futures = self.admin.describe_consumer_groups([c.group_id], include_authorized_operations=True,
                                                          request_timeout=self.timeout_s)
            group = self._wait(futures[c.group_id], what)
        except NoAnswer as no:
            return no.probe
        except KafkaException as exc:
            return Probe(FAIL, what, f"cannot be described: {exc.args[0].str()}",
                         "the group's ACLs (grant Describe and Read to this login) or SINK_GROUP_ID")
        operations = group.authorized_operations
        if operations is not None and AclOperation.READ not in operations:
            return Probe(FAIL, what, f"this login may not join it or commit (allowed: {_names(operations)})",
                         "the group's ACLs (grant Read to this login) or SINK_GROUP_ID")
        members = f", {len(group.members)} active member(s)" if group.members else ""
        state = "no member yet" if group.state == ConsumerGroupState.DEAD and not group.members \
            else f"state {group.state.name.lower()}{members}"
        try:
            tps = self._subscribed(what)
            committed = self._committed(tps, what)
        except NoAnswer as no:
            return no.probe
        except KafkaException as exc:
            error = exc.args[0]
            detail = error.str() if isinstance(error, KafkaError) else str(error)
            return Probe(FAIL, what, f"its committed offsets cannot be read: {detail}; the service would not "
                         "start", "the group's ACLs (grant Describe to this login) or SINK_GROUP_ID")
        acl = "" if operations is not None else "; the broker does not report ACLs"
        return Probe(OK, what, f"{state}; {self._start(tps, committed)}{acl}")

    def _subscribed(self, what: str) -> list[tuple[str, int]]:
        """The partitions the service subscribes to now, as it will see them (named topics that exist, or
        the pattern's matches)."""
        assert self.admin is not None
        from sink_service.kafka_source.offsets import Subscription

        c = self.config
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                topics = self.admin.list_topics(timeout=min(1.0, max(0.05, deadline - time.monotonic()))).topics
                break
            except KafkaException:
                self._raise_if_refused(what)
                if time.monotonic() >= deadline:
                    raise NoAnswer(Probe(FAIL, what, f"no answer within {self.timeout_s:g} s",
                                         BOOTSTRAP_SETTING)) from None
        names = Subscription(c.topics, c.topic_pattern).topic_names(topics)
        return sorted((t, p) for t in names if t in topics and topics[t].error is None for p in topics[t].partitions)

    def _committed(self, tps: list[tuple[str, int]], what: str) -> dict[tuple[str, int], int]:
        """Read as the service reads them: by a consumer of the group that never joins it, not the admin
        client's coordinator call that can abort the process (librdkafka #4605). A partition whose commit
        cannot be read raises, as it stops the service's start."""
        if not tps:
            return {}
        reader = Consumer({**self.client_config, "group.id": self.config.group_id, "enable.auto.commit": False})
        try:
            answers = reader.committed([TopicPartition(t, p) for t, p in tps], timeout=self.timeout_s)
        except KafkaException as exc:
            reader.poll(0)
            self._raise_if_refused(what)
            if exc.args and isinstance(exc.args[0], KafkaError) and exc.args[0].code() == KafkaError._TIMED_OUT:
                raise NoAnswer(Probe(FAIL, what, f"no answer within {self.timeout_s:g} s", BOOTSTRAP_SETTING)) \
                    from None
            raise
        finally:
            reader.close()
        refused = [f"{tp.topic}:{tp.partition} ({tp.error.str()})" for tp in answers if tp.error is not None]
        if refused:
            raise KafkaException(f"not readable for {', '.join(refused[:5])}")
        return {(tp.topic, tp.partition): tp.offset for tp in answers if tp.offset >= 0}

    def _start(self, tps: list[tuple[str, int]], committed: dict[tuple[str, int], int]) -> str:
        """Where the service will start, by its own rule (`offsets.uncommitted_start`): committed offsets,
        a Delta table's positions, then SINK_STARTING_OFFSETS at the group's first start or earliest."""
        from sink_service.kafka_source.offsets import uncommitted_start

        c = self.config
        uncommitted = [tp for tp in tps if tp not in committed]
        table, unknown = self._table_positions(uncommitted)
        history = bool(committed) or bool(table)
        parts = []
        if committed:
            lag = sum(self.log_end[tp] - offset for tp, offset in committed.items() if tp in self.log_end)
            parts.append(f"committed on {len(committed)} of {len(tps)} partition(s), lag {lag}")
        if table:
            parts.append(f"{len(table)} without a committed offset resume at the Delta table's position for the "
                         "group (its committed offsets expired or were deleted)")
        rest = [tp for tp in uncommitted if tp not in table]
        rule = uncommitted_start(c.starting_offsets, history)
        if rest and not history:
            which = "every partition starts" if len(rest) == len(tps) else f"{len(rest)} partition(s) start"
            parts.append(f"nothing committed yet: {which} at SINK_STARTING_OFFSETS={c.starting_offsets} (a new "
                         "group, or its offsets expired after offsets.retention.minutes)")
        elif rest:
            named = ", ".join(f"{t}:{p}" for t, p in rest[:5]) + (" …" if len(rest) > 5 else "")
            parts.append(f"{len(rest)} without a committed offset ({named}) start at their earliest offset"
                         + ("" if rule == c.starting_offsets else f", not at SINK_STARTING_OFFSETS="
                            f"{c.starting_offsets}") + " (created or matched after the group's first start, or "
                         "their offsets expired)")
        if unknown:
            parts.append(f"the Delta table's position could not be read ({unknown}): the service would not start")
        return "; ".join(parts) or "no partition to read yet"

    def _table_positions(self, tps: list[tuple[str, int]]) -> tuple[dict[tuple[str, int], int], str]:
        """A Delta target's positions for partitions without a committed offset, and why they are unknown."""
        if self.config.target != "delta" or not tps:
            return {}, ""
        from sink_service.config.upload_targets import target_settings
        from uploader.delta_changes import delta_target
        from uploader.parking import ParkingSettings

        settings = target_settings(self.config)
        if isinstance(settings, ParkingSettings):
            settings = settings.inner
        found: dict[tuple[str, int], int] = {}
        try:
            with delta_target(settings) as table:
                for topic, partition in tps:
                    position = table.covered_to(topic, partition)
                    if position is not None:
                        found[(topic, partition)] = position
        except Exception as exc:  # the target probe says what is wrong with the table
            return found, f"{type(exc).__name__}: {exc}"
        return found, ""

    def dead_letters(self) -> Probe:
        """SINK_DLQ_TOPIC: present and writable, or creatable on the first dead letter; nothing produced."""
        topic = self.config.dlq_topic
        assert topic is not None
        what = f"dead-letter topic {topic}"
        try:
            described = self._describe([topic], what)[topic]
        except NoAnswer as no:
            return no.probe
        if not isinstance(described, KafkaException):
            partitions, operations = described
            if operations is not None and AclOperation.WRITE not in operations:
                return Probe(FAIL, what, f"this login may not write to it (allowed: {_names(operations)})",
                             "the topic's ACLs (grant Write to this login) or SINK_DLQ_TOPIC")
            written = "writable by this login" if operations is not None else \
                "the broker does not report ACLs: write access not proven without producing a record"
            return Probe(OK, what, f"{partitions} partition(s); {written}")
        if described.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
            return _topic_error(what, described, "SINK_DLQ_TOPIC")
        try:
            return self._creatable(topic, what)
        except NoAnswer as no:
            return no.probe

    def _creatable(self, topic: str, what: str) -> Probe:
        """A missing dead-letter topic: the producer's first record creates it only if the broker
        auto-creates topics and this login may create it (a validate-only create asks the latter)."""
        assert self.admin is not None
        try:
            self._wait(self.admin.create_topics([NewTopic(topic, 1)], validate_only=True,
                                                request_timeout=self.timeout_s)[topic], what)
        except KafkaException as exc:
            return Probe(FAIL, what, f"does not exist, and this login may not create it "
                         f"({exc.args[0].str()})", "SINK_DLQ_TOPIC, or create the topic")
        auto = self._auto_create(what)
        if auto == "true":
            return Probe(WARN, what, "does not exist yet; the broker creates it at the first dead letter "
                         "(auto.create.topics.enable=true) with its default partitions and retention",
                         "create the topic with the retention you want")
        known = f"auto.create.topics.enable={auto}" if auto else "the broker's auto.create.topics.enable is unknown"
        return Probe(FAIL, what, f"does not exist and may not be created at the first dead letter ({known}); the "
                     "service would stop there", "SINK_DLQ_TOPIC, or create the topic")

    def _auto_create(self, what: str) -> str | None:
        assert self.admin is not None
        if not self.broker_ids:
            return None
        node = self.broker_ids[0]
        try:
            futures = self.admin.describe_configs([ConfigResource(ResourceType.BROKER, str(node))],
                                                  request_timeout=self.timeout_s)
            entries = self._wait(next(iter(futures.values())), what)
        except KafkaException:
            return None
        entry = entries.get("auto.create.topics.enable")
        return None if entry is None else str(entry.value).lower()


def _topic_error(what: str, exc: KafkaException, setting: str) -> Probe:
    error: KafkaError = exc.args[0]
    if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
        return Probe(FAIL, what, "does not exist", f"{setting}, or create the topic")
    if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return Probe(FAIL, what, "this login may not describe it (or it does not exist)",
                     "the topic's ACLs (grant Describe and Read to this login) or SINK_KAFKA_SASL_USERNAME")
    return Probe(FAIL, what, error.str(), setting)


def _names(operations: list[Any]) -> str:
    return ", ".join(sorted(op.name for op in operations)) or "nothing"


def _setting_in(message: str, options: dict[str, str]) -> str:
    """The SINK_KAFKA_* variable of the librdkafka property a client error names."""
    for name in sorted(options, key=len, reverse=True):
        if name in message:
            return "SINK_KAFKA_" + name.upper().replace(".", "_")
    return "the SINK_KAFKA_* settings"


def kafka_probes(config: SinkConfig, timeout_s: float, report: Callable[[Probe], None]) -> None:
    """Broker first; the rest only when it answered (else each says it was not probed)."""
    probes = KafkaProbes(config, timeout_s)
    broker = _timed(probes.broker)
    report(broker)
    later = ["topics", "consumer group"] + (["dead-letter topic"] if config.dlq_topic else [])
    if broker.failed:
        for what in later:
            report(Probe(SKIP, what, "not probed: the broker did not answer"))
        return
    for probe in _timed_many(probes.topics):
        report(probe)
    report(_timed(probes.group))
    if config.dlq_topic:
        report(_timed(probes.dead_letters))


def _timed(probe: Callable[[], Probe]) -> Probe:
    started = time.monotonic()
    result = probe()
    result.seconds = round(time.monotonic() - started, 3)
    return result


def _timed_many(probe: Callable[[], list[Probe]]) -> list[Probe]:
    started = time.monotonic()
    results = probe()
    for result in results:
        result.seconds = round((time.monotonic() - started) / max(1, len(results)), 3)
    return results
