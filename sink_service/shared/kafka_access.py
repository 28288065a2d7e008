"""Kafka refusing this client's login or the broker's certificate: fatal, naming the setting to fix.

librdkafka reports both at once, through the client's error callback only (`_AUTHENTICATION`;
`_SSL` with "certificate verify failed"), and then tries the login again about once a second
forever. What the service asks meanwhile simply times out, like an unreachable broker: 30 s for the
admin API, silence from the group member, a 120 s stall in a range reader, a delivery timeout for a
dead letter. Retrying cannot fix a wrong password or CA and can lock an account, so each client
carries an `AccessWatch` as its `error_cb` and the first refusal ends the service (exit 3). A
broker that is only unreachable (`_TRANSPORT`, `_ALL_BROKERS_DOWN`) stays an outage to retry.
"""

from __future__ import annotations

from confluent_kafka import KafkaError


class KafkaAccessRefused(Exception):
    """Kafka refused the credentials, or the broker's certificate did not verify."""


def refusal(error: KafkaError) -> str | None:
    """What to fix when `error` is a refusal that no retry changes; None for anything else."""
    code, text = error.code(), error.str()
    if code == KafkaError._AUTHENTICATION:
        return (f"Kafka refused the login ({text}): check SINK_KAFKA_SASL_USERNAME and SINK_KAFKA_SASL_PASSWORD "
                "(and SINK_KAFKA_SASL_MECHANISM)")
    if code == KafkaError._SSL and "certificate verify failed" in text:
        return (f"the broker's TLS certificate does not verify ({text}): set SINK_KAFKA_SSL_CA_LOCATION to the "
                "CA certificate that signed it")
    return None


class AccessWatch:
    """An `error_cb` that keeps the first refusal; librdkafka calls it from poll, consume or flush."""

    def __init__(self) -> None:
        self.refused: str | None = None

    def __call__(self, error: KafkaError) -> None:
        if self.refused is None:
            self.refused = refusal(error)

    def check(self) -> None:
        if self.refused is not None:
            raise KafkaAccessRefused(self.refused)
