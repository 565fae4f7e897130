"""A schema registry for the tests: the external one ``THROUGHLINE_TEST_SCHEMA_REGISTRY`` names, else a
loopback stand-in that serves the part of Confluent's Schema Registry REST API that throughline and
confluent-kafka's ``SchemaRegistryClient`` call.

Why a stand-in: no Confluent-compatible registry could be had from the package registries this project
reaches (docs/kafka.md, "Schema Registry": Apicurio Registry's app on Maven Central is a Quarkus
application jar, not a runnable one, and a dependency it needs is not served; Confluent's registry is
not on Maven Central; Karapace is not on PyPI). Point ``THROUGHLINE_TEST_SCHEMA_REGISTRY`` at a real
registry (its Confluent-compatible base URL) to run the same tests against it.

The stand-in keeps Confluent's semantics where the tests depend on them: one id per distinct schema
(the same schema under two subjects keeps its id), versions per subject, a subject's compatibility
level (``GET``/``PUT /config/{subject}``, 404 when unset), and a ``BACKWARD`` check (a reader of the
new schema must read data of the latest one: every field of the new schema without a default exists
in the latest, record by record, with the same type, and the record names agree).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ENV_TEST_REGISTRY = "THROUGHLINE_TEST_SCHEMA_REGISTRY"


def _named(schema: Any, names: dict[str, Any], namespace: str = "") -> Any:
    """``schema`` with named types resolved (records and fixed defined earlier are looked up by name)."""
    if isinstance(schema, str):
        full = schema if "." in schema or not namespace else f"{namespace}.{schema}"
        return names.get(full, names.get(schema, schema))
    if isinstance(schema, list):
        return [_named(s, names, namespace) for s in schema]
    if isinstance(schema, dict) and schema.get("type") in ("record", "fixed", "enum"):
        ns = schema.get("namespace", namespace)
        full = schema["name"] if "." in schema["name"] else (f"{ns}.{schema['name']}" if ns else schema["name"])
        names[full] = schema
        if schema["type"] == "record":
            for f in schema["fields"]:
                f["type"] = _named(f["type"], names, ns)
    return schema


def _shape(schema: Any) -> Any:
    """A schema reduced to what reading depends on (logical types and docs dropped)."""
    if isinstance(schema, dict):
        kind = schema.get("type")
        if kind == "record":
            return (
                "record",
                schema["name"].rsplit(".", 1)[-1],
                tuple((f["name"], _shape(f["type"])) for f in schema["fields"]),
            )
        if kind == "fixed":
            return ("fixed", schema.get("size"))
        if kind == "map":
            return ("map", _shape(schema["values"]))
        if kind == "array":
            return ("array", _shape(schema["items"]))
        if isinstance(kind, str | list | dict):
            return _shape(kind)
    if isinstance(schema, list):
        return tuple(_shape(s) for s in schema)
    return schema


def backward_problems(new: Any, old: Any, where: str = "") -> list[str]:
    """Why a reader of ``new`` cannot read data written with ``old`` (empty: it can)."""
    if isinstance(new, dict) and new.get("type") == "record":
        if not (isinstance(old, dict) and old.get("type") == "record"):
            return [f"{where or 'the schema'}: a record cannot read {_shape(old)!r}"]
        if new["name"].rsplit(".", 1)[-1] != old["name"].rsplit(".", 1)[-1]:
            return [f"{where or 'the schema'}: record {new['name']} cannot read record {old['name']}"]
        olds = {f["name"]: f for f in old["fields"]}
        problems: list[str] = []
        for field in new["fields"]:
            path = f"{where}.{field['name']}" if where else field["name"]
            if field["name"] not in olds:
                if "default" not in field:
                    problems.append(f"{path}: a new field without a default")
                continue
            problems += backward_problems(field["type"], olds[field["name"]]["type"], path)
        return problems
    if _shape(new) != _shape(old):
        return [f"{where}: type {_shape(new)!r} cannot read {_shape(old)!r}"]
    return []


class _Store:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ids: dict[str, int] = {}  # canonical text -> id
        self.texts: dict[int, str] = {}
        self.subjects: dict[str, list[int]] = {}
        self.config: dict[str, str] = {}


def _canonical(text: str) -> str:
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))


def _parsed(text: str) -> Any:
    return _named(json.loads(text), {})


class _Handler(BaseHTTPRequestHandler):
    store: _Store
    prefix: str

    def log_message(self, *args: object) -> None:  # quiet: the tests show what matters
        pass

    def _send(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length)) if length else {}

    def _route(self) -> str | None:
        path = self.path.split("?", 1)[0]
        if not path.startswith(self.prefix):
            self._send(404, {"error_code": 404, "message": "not found"})
            return None
        return path[len(self.prefix) :] or "/"

    def do_GET(self) -> None:
        path = self._route()
        if path is None:
            return
        s = self.store
        with s.lock:
            if m := re.fullmatch(r"/schemas/ids/(\d+)(/schema)?", path):
                text = s.texts.get(int(m.group(1)))
                if text is None:
                    return self._send(404, {"error_code": 40403, "message": "Schema not found"})
                return self._send(200, json.loads(text) if m.group(2) else {"schema": text})
            if path == "/subjects":
                return self._send(200, sorted(s.subjects))
            if m := re.fullmatch(r"/subjects/([^/]+)/versions", path):
                return self._send(200, list(range(1, len(s.subjects.get(_unquote(m.group(1)), [])) + 1)))
            if m := re.fullmatch(r"/subjects/([^/]+)/versions/(latest|\d+)", path):
                subject = _unquote(m.group(1))
                versions = s.subjects.get(subject)
                if not versions:
                    return self._send(404, {"error_code": 40401, "message": "Subject not found"})
                n = len(versions) if m.group(2) == "latest" else int(m.group(2))
                if not 1 <= n <= len(versions):
                    return self._send(404, {"error_code": 40402, "message": "Version not found"})
                sid = versions[n - 1]
                return self._send(200, {"subject": subject, "version": n, "id": sid, "schema": s.texts[sid]})
            if m := re.fullmatch(r"/config/([^/]+)", path):
                level = s.config.get(_unquote(m.group(1)))
                if level is None:
                    return self._send(404, {"error_code": 40408, "message": "Subject has no compatibility level"})
                return self._send(200, {"compatibilityLevel": level})
        self._send(404, {"error_code": 404, "message": "not found"})

    def do_PUT(self) -> None:
        path = self._route()
        if path is None:
            return
        if m := re.fullmatch(r"/config/([^/]+)", path):
            level = str(self._body().get("compatibility", "")).upper()
            if level not in ("NONE", "BACKWARD"):
                return self._send(422, {"error_code": 42203, "message": f"level {level} is not supported here"})
            with self.store.lock:
                self.store.config[_unquote(m.group(1))] = level
            return self._send(200, {"compatibility": level})
        self._send(404, {"error_code": 404, "message": "not found"})

    def do_POST(self) -> None:
        path = self._route()
        if path is None:
            return
        body = self._body()
        text = body.get("schema")
        if not isinstance(text, str) or body.get("schemaType", "AVRO") != "AVRO":
            return self._send(422, {"error_code": 42201, "message": "an Avro schema is required"})
        try:
            new = _parsed(text)
        except ValueError:
            return self._send(422, {"error_code": 42201, "message": "the schema is not JSON"})
        s = self.store
        with s.lock:
            if m := re.fullmatch(r"/compatibility/subjects/([^/]+)/versions/latest", path):
                versions = s.subjects.get(_unquote(m.group(1)))
                if not versions:
                    return self._send(404, {"error_code": 40401, "message": "Subject not found"})
                problems = self._problems(_unquote(m.group(1)), new, versions)
                return self._send(200, {"is_compatible": not problems, "messages": problems})
            if m := re.fullmatch(r"/subjects/([^/]+)", path):
                subject = _unquote(m.group(1))
                versions = s.subjects.get(subject)
                if not versions:
                    return self._send(404, {"error_code": 40401, "message": "Subject not found"})
                known = s.ids.get(_canonical(text))
                if known is None or known not in versions:
                    return self._send(404, {"error_code": 40403, "message": "Schema not found"})
                version = versions.index(known) + 1
                return self._send(200, {"subject": subject, "version": version, "id": known, "schema": text})
            if m := re.fullmatch(r"/subjects/([^/]+)/versions", path):
                subject = _unquote(m.group(1))
                canonical = _canonical(text)
                versions = s.subjects.setdefault(subject, [])
                known = s.ids.get(canonical)
                if known is not None and known in versions:
                    return self._send(200, {"id": known})
                if versions:
                    problems = self._problems(subject, new, versions)
                    if problems:
                        return self._send(409, {"error_code": 409, "message": "; ".join(problems)})
                if known is None:
                    known = len(s.texts) + 1
                    s.ids[canonical] = known
                    s.texts[known] = text
                versions.append(known)
                return self._send(200, {"id": known})
        self._send(404, {"error_code": 404, "message": "not found"})

    def _problems(self, subject: str, new: Any, versions: list[int]) -> list[str]:
        if self.store.config.get(subject, "BACKWARD") == "NONE":
            return []
        return backward_problems(new, _parsed(self.store.texts[versions[-1]]))


def _unquote(part: str) -> str:
    from urllib.parse import unquote

    return unquote(part)


@contextmanager
def schema_registry(prefix: str = "/apis/ccompat/v7", port: int = 0) -> Iterator[str]:
    """The base URL of a registry for one test: ``THROUGHLINE_TEST_SCHEMA_REGISTRY``'s, else a loopback
    stand-in's (on ``port``, 0: any free one; stopped on exit)."""
    external = os.environ.get(ENV_TEST_REGISTRY)
    if external and not port:
        yield external.rstrip("/")
        return
    handler = type("Handler", (_Handler,), {"store": _Store(), "prefix": prefix})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    thread = threading.Thread(target=server.serve_forever, name="schema-registry", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{prefix}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
