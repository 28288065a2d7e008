"""Confluent wire format and the schema registry the Avro and Protobuf decoders read schemas from.

A framed value is magic byte 0, a 4-byte big-endian schema id, then the payload (for Protobuf
preceded by the message-index varints). Schemas are fetched from SINK_SCHEMA_REGISTRY_URL by
id (`GET /schemas/ids/{id}`) and kept for the life of the Python worker: an id names one schema
forever, so the cache never goes stale, and each worker asks once per id.

An id the registry does not know (404) is the record's fault: a bad record (`unknown_schema_id`).
A registry that cannot answer (connection refused, timeout, 5xx, 429) is an outage: retried with
backoff, then `RegistryUnavailable`, which the task reports as a retryable outage, never as bad
records. A registry refusing the credentials (401, 403) is `RegistryRefused`, never retried
(retrying a bad credential can lock the account): the service stops naming the setting. The
registry's certificate is verified against SINK_TLS_CA_BUNDLE when it is set, whatever
REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE say.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import requests
import tenacity

from sink_service.decode.json_values import ParsedValues
from uploader.classify import is_certificate_failure
from uploader.column_types import without_empty_structs
from uploader.masking import mask_userinfo

# What building a decoder from a schema the registry holds can raise when the schema is not one
# the format reads (fastavro's SchemaParseException is a ValueError; protobuf's errors TypeError).
DATA_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError)

MAGIC = 0
HEADER = 5  # magic byte and schema id
_TIMEOUT_S = 5.0  # a registry that does not answer within this is down, as a silent broker is
_ATTEMPTS = 5  # about 8 s of backoff before a task gives up on the registry...
_GIVE_UP_S = 20.0  # ...or this long, when each attempt waits out the timeout


class RegistryUnavailable(Exception):
    """The registry did not answer: an outage, retried by replaying the range."""


class RegistryRefused(Exception):
    """The registry refused the credentials: fatal, retrying cannot fix it."""


class UnknownSchema(Exception):
    """The registry answered that no schema has this id."""


@dataclass(frozen=True)
class RegistrySettings:
    """Where schemas come from; part of the task spec, so the auth is kept out of its repr."""

    url: str
    basic_auth: str = field(default="", repr=False)  # `user:password`
    ca_bundle: str | None = None  # SINK_TLS_CA_BUNDLE: PEM file to verify the registry against; None: default CAs


def schema_ids(values: pa.Array, invalid_kind: str) -> tuple[np.ndarray, dict[int, tuple[str, str]]]:
    """The schema id of each value (binary, no nulls) in the Confluent wire format, -1 where the
    value is not framed (too short, or no magic byte), with those values' failures. Vectorised: a
    healthy chunk costs no Python loop."""
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32, count=len(values) + 1, offset=values.offset * 4)
    buffer = values.buffers()[2]
    data = np.frombuffer(buffer, dtype=np.uint8) if buffer is not None and buffer.size else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    framed = lengths >= HEADER
    at = np.where(framed, starts, 0)
    framed &= data[at] == MAGIC if len(data) else framed
    ids = np.full(len(values), -1, dtype=np.int64)
    at = starts[framed]
    ids[framed] = (data[at + 1].astype(np.int64) << 24) | (data[at + 2].astype(np.int64) << 16) \
        | (data[at + 3].astype(np.int64) << 8) | data[at + 4]
    failures = {}
    for row in np.flatnonzero(~framed).tolist():
        shown = "too short" if lengths[row] < HEADER else f"first byte is 0x{data[starts[row]]:02x}"
        failures[row] = (f"not in the schema registry wire format (magic byte 0, 4-byte schema id): {shown}",
                         invalid_kind)
    return ids, failures


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, RegistryUnavailable)


class RegistryClient:
    """Schemas by id, fetched once per worker process."""

    def __init__(self, settings: RegistrySettings):
        self.base = settings.url.rstrip("/")
        self.shown = mask_userinfo(self.base)  # what errors name: never credentials written into the URL
        self.session = requests.Session()
        # Passed with every request, not set on the session: requests lets REQUESTS_CA_BUNDLE and
        # CURL_CA_BUNDLE replace a session's `verify`, but never one given to the request itself.
        self._verify: str | bool = settings.ca_bundle or True
        if settings.basic_auth:
            user, _, password = settings.basic_auth.partition(":")
            self.session.auth = (user, password)
        self._schemas: dict[Hashable, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def schema(self, schema_id: int) -> dict[str, Any]:
        """The registry's answer for `schema_id`: `schema` (text), `schemaType` (AVRO if absent), `references`."""
        return self._cached(schema_id, f"schemas/ids/{schema_id}", f"schema id {schema_id}")

    def version(self, subject: str, version: int) -> dict[str, Any]:
        """A subject's version (what a schema's `references` name), in the same form as `schema`."""
        return self._cached((subject, version), f"subjects/{quote(subject, safe='')}/versions/{version}",
                            f"subject {subject} version {version}")

    def _cached(self, key: Hashable, path: str, what: str) -> dict[str, Any]:
        found = self._schemas.get(key)
        if found is None:
            found = self._fetch(path, what)
            with self._lock:
                self._schemas[key] = found
        return found

    @tenacity.retry(retry=tenacity.retry_if_exception(_transient),
                    stop=tenacity.stop_after_attempt(_ATTEMPTS) | tenacity.stop_after_delay(_GIVE_UP_S),
                    wait=tenacity.wait_exponential(multiplier=0.5, max=8), reraise=True)
    def _fetch(self, path: str, what: str) -> dict[str, Any]:
        # `format=serialized`: Protobuf schemas as a base64 FileDescriptorProto, which needs no .proto parser.
        url = f"{self.base}/{path}"
        try:
            response = self.session.get(url, params={"format": "serialized"}, timeout=_TIMEOUT_S, verify=self._verify)
        except requests.RequestException as exc:
            if is_certificate_failure(exc):  # a configuration problem: asking again cannot help
                raise RegistryRefused(
                    f"schema registry {self.shown}: its TLS certificate could not be verified for {what}; this "
                    "will not be retried. If the registry uses a private or self-signed CA, set SINK_TLS_CA_BUNDLE "
                    "to a PEM file holding that CA's certificate; otherwise check that the host in "
                    "SINK_SCHEMA_REGISTRY_URL matches the certificate.") from None
            raise RegistryUnavailable(f"schema registry {self.shown} unreachable: {type(exc).__name__}") from None
        if response.status_code == 404:
            raise UnknownSchema(f"{what} is not in the schema registry")
        if response.status_code in (401, 403):
            raise RegistryRefused(
                f"schema registry {self.shown} refused the credentials ({response.status_code}) for {what}: check "
                "SINK_SCHEMA_REGISTRY_BASIC_AUTH (`user:password`) and the registry's permissions for this user")
        if response.status_code != 200:
            raise RegistryUnavailable(f"schema registry {self.shown} answered {response.status_code} for {what}: "
                                      f"{response.text[:200]}")
        return response.json()


_clients: dict[RegistrySettings, RegistryClient] = {}


def registry_client(settings: RegistrySettings) -> RegistryClient:
    """One client (and schema cache) per worker process and registry."""
    client = _clients.get(settings)
    if client is None:
        client = _clients[settings] = RegistryClient(settings)
    return client


class Decoder:
    """Decodes one schema's payloads to Python dicts shaped like `schema` (a struct's fields)."""

    schema: pa.Schema

    def decode(self, value: bytes, start: int) -> dict[str, Any]:
        """The payload of a framed value, from `start` on."""
        raise NotImplementedError


Build = Callable[["RegistryClient", dict[str, Any], Hashable], Decoder]  # client, schema, variant
# A payload's message type (Protobuf's indexes) read from a value at `start`, and where its body starts.
Variant = Callable[[bytes, int], tuple[Hashable, int]]


def parse_framed(values: pa.Array, settings: RegistrySettings, build: Build, invalid_kind: str,
                 variant: Variant | None = None) -> ParsedValues:
    """Decode framed values (binary, no nulls) by their schemas: one table, rows in order.

    Values of several schema ids (versions) in one chunk each decode with their own schema, and
    the tables are joined by the widening lattice, as inferred JSON of different shapes is.
    """
    ids, failures = schema_ids(values, invalid_kind)
    groups = _groups(values, ids, variant, invalid_kind, failures)
    tables, rows = [], []
    for (schema_id, which), members in groups.items():
        try:
            schema_decoder = _decoder(settings, schema_id, which, build)
        except UnknownSchema as exc:
            failures.update((row, (str(exc), "unknown_schema_id")) for row, _, _ in members)
            continue
        except DATA_ERRORS as exc:  # the registry's schema is not one this format reads
            reason = f"schema id {schema_id} cannot be read: {type(exc).__name__}: {exc}"
            failures.update((row, (reason, invalid_kind)) for row, _, _ in members)
            continue
        decoded = []
        for row, value, start in members:
            try:
                decoded.append(schema_decoder.decode(value, start))
                rows.append(row)
            except Exception as exc:  # decoding reads only this payload: whatever it raises is the record's
                failures[row] = (f"cannot be decoded with schema id {schema_id}: {type(exc).__name__}: {exc}",
                                 invalid_kind)
        if decoded:
            tables.append(without_empty_structs(pa.Table.from_pylist(decoded, schema=schema_decoder.schema)))
    return ParsedValues.gathered(tables, rows, len(values), failures)


Members = list[tuple[int, bytes, int]]  # row, value, where its payload starts


def _groups(values: pa.Array, ids: np.ndarray, variant: Variant | None, invalid_kind: str,
            failures: dict[int, tuple[str, str]]) -> dict[tuple[int, Hashable], Members]:
    """The framed values by schema id and message type (`variant`: None when a schema has one)."""
    groups: dict[tuple[int, Hashable], Members] = {}
    for schema_id in np.unique(ids[ids >= 0]).tolist():
        rows = np.flatnonzero(ids == schema_id)
        chosen = values if len(rows) == len(values) else values.take(pa.array(rows))
        for row, value in zip(rows.tolist(), chosen.to_pylist(), strict=True):
            if variant is None:
                groups.setdefault((schema_id, None), []).append((row, value, HEADER))
                continue
            try:
                which, start = variant(value, HEADER)
            except ValueError as exc:
                failures[row] = (f"schema id {schema_id}: {exc}", invalid_kind)
                continue
            groups.setdefault((schema_id, which), []).append((row, value, start))
    return groups


_decoders: dict[tuple[RegistrySettings, int, Hashable], Decoder] = {}


def _decoder(settings: RegistrySettings, schema_id: int, which: Hashable, build: Build) -> Decoder:
    """The decoder of `schema_id` (and message type), built once per worker process."""
    found = _decoders.get((settings, schema_id, which))
    if found is None:
        client = registry_client(settings)
        found = _decoders[(settings, schema_id, which)] = build(client, client.schema(schema_id), which)
    return found
