"""End to end against a broker that requires SASL_SSL (SCRAM-SHA-512, private CA), and one that requires a
client certificate (mutual TLS): the service delivers and commits, and its password (the SASL password,
the client key's password) shows nowhere (output, command lines)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import pytest

from devkit.kafka_data import Workload, create_topics, produce_orders
from devkit.secured_broker import CLIENT_COMMON_NAME, SecuredBroker, running_secured_broker
from devkit.service_process import wait_until
from tests.e2e.checks import all_commands, all_committed, table_matches

pytestmark = pytest.mark.e2e

USER = "sink-e2e"


@pytest.fixture(scope="module")
def secured(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    with running_secured_broker(bootstrap, {USER: secrets.token_urlsafe(18)},
                                tmp_path_factory.mktemp("pki")) as broker:
        yield broker


def test_the_service_delivers_through_sasl_ssl(secured, bootstrap, ems, unique, service_env, services):
    topic, group = unique("secured-orders"), unique("group")
    create_topics(bootstrap, {topic: 2})
    workload = Workload()
    produce_orders(bootstrap, topic, keys=300, updates=2, workload=workload)
    password = secured.users[USER]
    since = time.monotonic()
    env = service_env(topic, group, SINK_FLUSH_RECORDS=200,
                      SINK_KAFKA_BOOTSTRAP_SERVERS=secured.bootstrap,
                      SINK_KAFKA_SECURITY_PROTOCOL="SASL_SSL", SINK_KAFKA_SASL_MECHANISM="SCRAM-SHA-512",
                      SINK_KAFKA_SASL_USERNAME=USER, SINK_KAFKA_SASL_PASSWORD=password,
                      SINK_KAFKA_SSL_CA_LOCATION=str(secured.pki.ca_file))
    service = services(env)
    wait_until(lambda: table_matches(ems, topic, workload), 240, f"{topic} to converge", process=service)
    wait_until(lambda: all_committed(bootstrap, group, topic, 2), 60, f"{topic} commits", process=service)
    assert not [cmdline for cmdline in all_commands() if password in cmdline]
    logins = [e for e in secured.gateway.logins() if e.at >= since]
    assert {(e.user, e.mechanism) for e in logins} == {(USER, "SCRAM-SHA-512")}
    assert service.terminate() == 0
    assert password not in service.output()
    refused = [e for e in secured.gateway.events if e.at >= since and e.outcome != "authenticated"]
    assert not refused, refused


@pytest.mark.parametrize(("fault", "setting"), [("wrong-password", "SINK_KAFKA_SASL_PASSWORD"),
                                                ("untrusted-ca", "SINK_KAFKA_SSL_CA_LOCATION")])
def test_a_refused_login_or_certificate_stops_the_service_naming_the_setting(
        secured, bootstrap, unique, service_env, services, fault, setting):
    topic, group = unique("secured-refused"), unique("group")
    create_topics(bootstrap, {topic: 1})
    env = service_env(topic, group, SINK_KAFKA_BOOTSTRAP_SERVERS=secured.bootstrap,
                      SINK_KAFKA_SECURITY_PROTOCOL="SASL_SSL", SINK_KAFKA_SASL_MECHANISM="SCRAM-SHA-512",
                      SINK_KAFKA_SASL_USERNAME=USER, SINK_KAFKA_SASL_PASSWORD=secured.users[USER],
                      SINK_KAFKA_SSL_CA_LOCATION=str(secured.pki.ca_file))
    if fault == "wrong-password":
        env["SINK_KAFKA_SASL_PASSWORD"] = "not-the-password-" + secrets.token_urlsafe(8)
    else:
        env["SINK_KAFKA_SSL_CA_LOCATION"] = str(secured.pki.other_ca_file)
    started = time.monotonic()
    service = services(env)
    assert service.wait(60) == 3, service.output()[-3000:]
    assert time.monotonic() - started < 30, f"stopped after {time.monotonic() - started:.0f}s"
    stopping = [line for line in service.output().splitlines() if "stopping:" in line]
    assert len(stopping) == 1 and setting in stopping[0], stopping
    assert env["SINK_KAFKA_SASL_PASSWORD"] not in service.output()


@pytest.fixture(scope="module")
def mtls(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    with running_secured_broker(bootstrap, None, tmp_path_factory.mktemp("mtls-pki"), mutual_tls=True,
                                sasl=False) as broker:
        yield broker


def test_the_service_delivers_through_mutual_tls(mtls, bootstrap, ems, unique, service_env, services):
    """security.protocol=SSL with a client certificate whose key is encrypted: every client the service
    makes (group member, offsets, range readers in the Spark workers) logs in with the certificate, and
    the key password shows nowhere (output with Spark's, command lines)."""
    topic, group = unique("mtls-orders"), unique("group")
    create_topics(bootstrap, {topic: 2})
    workload = Workload()
    produce_orders(bootstrap, topic, keys=200, updates=2, workload=workload)
    pki = mtls.pki
    since = time.monotonic()
    env = service_env(topic, group, SINK_FLUSH_RECORDS=200, SINK_KAFKA_BOOTSTRAP_SERVERS=mtls.bootstrap,
                      SINK_KAFKA_SECURITY_PROTOCOL="SSL", SINK_KAFKA_SSL_CA_LOCATION=str(pki.ca_file),
                      SINK_KAFKA_SSL_CERTIFICATE_LOCATION=str(pki.client_cert_file),
                      SINK_KAFKA_SSL_KEY_LOCATION=str(pki.client_encrypted_key_file),
                      SINK_KAFKA_SSL_KEY_PASSWORD=pki.client_key_password)
    service = services(env)
    wait_until(lambda: table_matches(ems, topic, workload), 240, f"{topic} to converge", process=service)
    wait_until(lambda: all_committed(bootstrap, group, topic, 2), 60, f"{topic} commits", process=service)
    assert not [cmdline for cmdline in all_commands() if pki.client_key_password in cmdline]
    logins = [e for e in mtls.gateway.logins() if e.at >= since]
    assert logins and {(e.user, e.mechanism) for e in logins} == {(CLIENT_COMMON_NAME, "SSL")}
    assert service.terminate() == 0
    assert pki.client_key_password not in service.output()
    assert "SINK_KAFKA_SSL_KEY_PASSWORD" in service.output()  # the configuration dump names it, masked
    refused = [e for e in mtls.gateway.events if e.at >= since and e.outcome != "authenticated"]
    assert not refused, refused
