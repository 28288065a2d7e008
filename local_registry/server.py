"""A Confluent-compatible schema registry in memory, for tests and the demo.

Serves what confluent-kafka's `SchemaRegistryClient` and its Avro and Protobuf serializers and
deserializers use (no registry that installs from the package registries runs without a
JVM or a Kafka cluster of its own):

    POST /subjects/{subject}/versions         register (the same schema text keeps its id)
    POST /subjects/{subject}                  look a schema up in a subject
    GET  /schemas/ids/{id}                    a schema by id (`format` is accepted and ignored:
                                              schemas are served as registered)
    GET  /schemas/ids/{id}/versions           subject-versions of an id
    GET  /subjects                            subject names
    GET  /subjects/{subject}/versions         version numbers
    GET  /subjects/{subject}/versions/{n|latest}
    GET|PUT /config[/{subject}], POST /compatibility/subjects/{subject}/versions/{v}: every schema is
                                              compatible (no checks are made)
    PUT  /_control/fault                      {"status": 503} answers every other request with that
                                              status; {"status": null} heals (also `fail_with`)

Optional HTTP basic auth (`user:password`): requests without it get 401. Errors have Confluent's
shape, `{"error_code": 40403, "message": ...}`.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit


class _Error(Exception):
    def __init__(self, status: int, code: int, message: str):
        super().__init__(message)
        self.status, self.code = status, code


@dataclass
class _Store:
    schemas: list[dict[str, Any]] = field(default_factory=list)  # id - 1 -> {schema, schemaType, references}
    subjects: dict[str, list[int]] = field(default_factory=dict)  # subject -> ids, version - 1 -> id
    lock: threading.Lock = field(default_factory=threading.Lock)

    def register(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        entry = _entry(body)
        with self.lock:
            schema_id = self._id_of(entry)
            if schema_id is None:
                self.schemas.append(entry)
                schema_id = len(self.schemas)
            versions = self.subjects.setdefault(subject, [])
            if schema_id not in versions:
                versions.append(schema_id)
            return self._version(subject, versions.index(schema_id) + 1)

    def lookup(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        entry = _entry(body)
        with self.lock:
            schema_id = self._id_of(entry)
            versions = self._versions(subject)
            if schema_id not in versions:
                raise _Error(404, 40403, "Schema not found")
            return self._version(subject, versions.index(schema_id) + 1)

    def by_id(self, schema_id: int) -> dict[str, Any]:
        with self.lock:
            if not 0 < schema_id <= len(self.schemas):
                raise _Error(404, 40403, "Schema not found")
            return dict(self.schemas[schema_id - 1])

    def versions_of(self, schema_id: int) -> list[dict[str, Any]]:
        with self.lock:
            return [{"subject": s, "version": ids.index(schema_id) + 1}
                    for s, ids in self.subjects.items() if schema_id in ids]

    def version(self, subject: str, version: str) -> dict[str, Any]:
        with self.lock:
            versions = self._versions(subject)
            number = len(versions) if version in ("latest", "-1") else int(version)
            if not 0 < number <= len(versions):
                raise _Error(404, 40402, "Version not found")
            return self._version(subject, number)

    def version_numbers(self, subject: str) -> list[int]:
        with self.lock:
            return list(range(1, len(self._versions(subject)) + 1))

    def _versions(self, subject: str) -> list[int]:
        if subject not in self.subjects:
            raise _Error(404, 40401, "Subject not found")
        return self.subjects[subject]

    def _version(self, subject: str, number: int) -> dict[str, Any]:
        schema_id = self.subjects[subject][number - 1]
        return {"subject": subject, "version": number, "id": schema_id, **self.schemas[schema_id - 1]}

    def _id_of(self, entry: dict[str, Any]) -> int | None:
        return next((i + 1 for i, known in enumerate(self.schemas) if known == entry), None)


def _entry(body: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(body.get("schema"), str):
        raise _Error(422, 42201, "Invalid schema: `schema` must be a string")
    return {"schema": body["schema"], "schemaType": body.get("schemaType") or "AVRO",
            "references": body.get("references") or []}


_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("POST", re.compile(r"/subjects/(?P<subject>[^/]+)/versions"), "register"),
    ("POST", re.compile(r"/subjects/(?P<subject>[^/]+)"), "lookup"),
    ("GET", re.compile(r"/schemas/ids/(?P<id>\d+)"), "by_id"),
    ("GET", re.compile(r"/schemas/ids/(?P<id>\d+)/versions"), "versions_of"),
    ("GET", re.compile(r"/subjects"), "subjects"),
    ("GET", re.compile(r"/subjects/(?P<subject>[^/]+)/versions"), "version_numbers"),
    ("GET", re.compile(r"/subjects/(?P<subject>[^/]+)/versions/(?P<version>latest|-?\d+)"), "version"),
    ("GET", re.compile(r"/config(/[^/]+)?"), "config"),
    ("PUT", re.compile(r"/config(/[^/]+)?"), "config"),
    ("POST", re.compile(r"/compatibility/subjects/[^/]+/versions(/[^/]+)?"), "compatible"),
]


class LocalRegistry:
    """The registry on a port of 127.0.0.1 in a thread: `start()`, `url`, `stop()`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, basic_auth: str | None = None):
        self.store = _Store()
        self.fail_with: int | None = None  # a status every request gets instead (the fault switch)
        self.requests = 0
        self._auth = None if basic_auth is None else "Basic " + base64.b64encode(basic_auth.encode()).decode()
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="local-registry", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> LocalRegistry:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, method: str, path: str, authorization: str | None, body: bytes) -> tuple[int, Any]:
        """(status, JSON body) for one request."""
        if path == "/_control/fault" and method == "PUT":
            self.fail_with = json.loads(body or b"{}").get("status")
            return 200, {"fail_with": self.fail_with}
        self.requests += 1
        if self.fail_with is not None:
            return self.fail_with, {"error_code": self.fail_with * 100, "message": "unavailable (fault switch)"}
        if self._auth is not None and authorization != self._auth:
            return 401, {"error_code": 40101, "message": "Unauthorized"}
        try:
            return 200, self._route(method, path, body)
        except _Error as exc:
            return exc.status, {"error_code": exc.code, "message": str(exc)}
        except (ValueError, binascii.Error) as exc:
            return 422, {"error_code": 42201, "message": f"Invalid request: {exc}"}

    def _route(self, method: str, path: str, body: bytes) -> Any:
        for route_method, pattern, name in _ROUTES:
            match = pattern.fullmatch(path)
            if route_method == method and match:
                args = {k: unquote(v) for k, v in match.groupdict().items() if v is not None}
                return getattr(self, "_" + name)(body=json.loads(body) if body else {}, **args)
        raise _Error(404, 404, f"no route for {method} {path}")

    def _register(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.store.register(subject, body)["id"]}

    def _lookup(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.store.lookup(subject, body)

    def _by_id(self, id: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.store.by_id(int(id))

    def _versions_of(self, id: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        return self.store.versions_of(int(id))

    def _subjects(self, body: dict[str, Any]) -> list[str]:
        return sorted(self.store.subjects)

    def _version_numbers(self, subject: str, body: dict[str, Any]) -> list[int]:
        return self.store.version_numbers(subject)

    def _version(self, subject: str, version: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.store.version(subject, version)

    def _config(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"compatibilityLevel": body.get("compatibility", "NONE"), "compatibility": "NONE"}

    def _compatible(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"is_compatible": True}


def _handler(registry: LocalRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            status, answer = registry.answer(self.command, urlsplit(self.path).path.rstrip("/") or "/",
                                             self.headers.get("Authorization"), body)
            payload = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:  # quiet: tests and the demo read their own logs
            pass

    return Handler
