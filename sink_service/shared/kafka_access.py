"""Kafka refusing this client's login or certificate, or the broker's certificate: fatal, naming the
setting to fix.

librdkafka reports these through the client's error callback only (`_AUTHENTICATION`; `_SSL` with
"certificate verify failed"; the broker's TLS alert about the client certificate, as `_TRANSPORT`
under TLS 1.3 where it arrives after the handshake and as `_SSL` under TLS 1.2), and then tries again
about once a second forever. What the service asks meanwhile simply times out, like an unreachable
broker: 30 s for the admin API, silence from the group member, a 120 s stall in a range reader, a
delivery timeout for a dead letter. Retrying cannot fix a wrong password, CA or client certificate
and can lock an account, so each client carries an `AccessWatch` as its `error_cb` and the first
refusal ends the service (exit 3). A broker that is only unreachable (`_TRANSPORT` without an alert,
`_ALL_BROKERS_DOWN`) stays an outage to retry.

A client librdkafka cannot even make (a client key that does not decrypt with its password, a key
that is not the certificate's, a file it cannot read) raised a bare `KafkaException` where the client
was made: a traceback and exit 1. `new_client` turns it into the same refusal, naming the setting.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

T = TypeVar("T")

# TLS alerts a broker sends about the client's certificate (RFC 8446 §6.2). Java brokers send
# certificate_required (TLS 1.3) or bad_certificate (1.2) for none, certificate_unknown for one no
# trusted CA signed; OpenSSL-based ones unknown_ca, and handshake_failure for none under TLS 1.2.
_CLIENT_CERTIFICATE_ALERT = re.compile(
    r"alert (certificate required|bad certificate|unknown ca|certificate unknown|unsupported certificate|"
    r"certificate expired|certificate revoked|access denied)")
_HANDSHAKE_FAILURE_ALERT = "alert handshake failure"
_CLIENT_SETTING_FAILED = re.compile(r"\b(ssl\.[a-z.]+) failed: (.*)")
_ENCRYPTED_PEM = (b"-----BEGIN ENCRYPTED PRIVATE KEY-----", b"Proc-Type: 4,ENCRYPTED")


class KafkaAccessRefused(Exception):
    """Kafka refused the credentials or the client certificate, the broker's certificate did not
    verify, or librdkafka could not load the client's TLS files."""


def refusal(error: KafkaError) -> str | None:
    """What to fix when `error` is a refusal that no retry changes; None for anything else."""
    code, text = error.code(), error.str()
    if code == KafkaError._AUTHENTICATION:
        return (f"Kafka refused the login ({text}): check SINK_KAFKA_SASL_USERNAME and SINK_KAFKA_SASL_PASSWORD "
                "(and SINK_KAFKA_SASL_MECHANISM)")
    if code == KafkaError._SSL and "certificate verify failed" in text:
        return (f"the broker's TLS certificate does not verify ({text}): set SINK_KAFKA_SSL_CA_LOCATION to the "
                "CA certificate that signed it")
    if (code in (KafkaError._SSL, KafkaError._TRANSPORT) and _CLIENT_CERTIFICATE_ALERT.search(text)) or (
            code == KafkaError._SSL and _HANDSHAKE_FAILURE_ALERT in text):
        return (f"the broker refused this client's TLS certificate ({text}): set "
                "SINK_KAFKA_SSL_CERTIFICATE_LOCATION to a client certificate signed by a CA the broker trusts "
                "and SINK_KAFKA_SSL_KEY_LOCATION to its key (the broker requires one)")
    return None


def client_refusal(error: KafkaError, config: Mapping[str, Any]) -> str | None:
    """What to fix when librdkafka refused to make a client over one of its `ssl.*` files; else None."""
    found = _CLIENT_SETTING_FAILED.search(error.str()) if error.code() == KafkaError._INVALID_ARG else None
    if found is None:
        return None
    name, why = found.groups()
    setting = "SINK_KAFKA_" + name.upper().replace(".", "_")
    if name == "ssl.key.location":
        return _key_refusal(why, config)
    if name == "ssl.certificate.location":
        return (f"the client certificate cannot be loaded ({why}): set SINK_KAFKA_SSL_CERTIFICATE_LOCATION to a "
                "readable PEM certificate")
    if name == "ssl.ca.location":
        return f"the CA certificates cannot be loaded ({why}): set SINK_KAFKA_SSL_CA_LOCATION to a readable PEM file"
    return f"librdkafka cannot use {name} ({why}): check {setting}"


def _key_refusal(why: str, config: Mapping[str, Any]) -> str:
    """librdkafka says only "PEM lib" for a key it cannot load: tell a wrong password from the rest."""
    if "key values mismatch" in why:
        return (f"the client key is not the client certificate's ({why}): set SINK_KAFKA_SSL_KEY_LOCATION to the "
                "key of SINK_KAFKA_SSL_CERTIFICATE_LOCATION")
    path = str(config.get("ssl.key.location", ""))
    try:
        with open(path, "rb") as key:
            encrypted = any(marker in key.read(1 << 20) for marker in _ENCRYPTED_PEM)
    except OSError as exc:
        return f"the client key cannot be read ({exc.strerror}): set SINK_KAFKA_SSL_KEY_LOCATION to a readable file"
    if encrypted and config.get("ssl.key.password"):
        return (f"the client key does not decrypt with SINK_KAFKA_SSL_KEY_PASSWORD ({why}): set "
                "SINK_KAFKA_SSL_KEY_PASSWORD to the password of the key in SINK_KAFKA_SSL_KEY_LOCATION")
    if encrypted:
        return ("the client key is encrypted and no password is set: set SINK_KAFKA_SSL_KEY_PASSWORD to the "
                "password of the key in SINK_KAFKA_SSL_KEY_LOCATION")
    return f"the client key cannot be loaded ({why}): set SINK_KAFKA_SSL_KEY_LOCATION to a PEM private key"


def new_client(factory: Callable[[dict[str, Any]], T], config: Mapping[str, Any]) -> T:
    """`factory(config)` (a Consumer, Producer or AdminClient); `KafkaAccessRefused` naming the setting
    when librdkafka refuses to make it over a TLS file, any other `KafkaException` unchanged."""
    try:
        return factory(dict(config))
    except KafkaException as exc:
        why = client_refusal(exc.args[0], config) if exc.args and isinstance(exc.args[0], KafkaError) else None
        if why is None:
            raise
        raise KafkaAccessRefused(why) from None


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
