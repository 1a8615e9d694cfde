"""A recorded Kubernetes API on 127.0.0.1 for the real ``kubernetes`` client.

No API server runs on these machines, so tests serve recorded responses (``tests/fixtures/kube``,
the real JSON shape) over HTTP to the official client: its URL building, query parameters, watch
streaming, deserialization and patch content types are all exercised, not mocked. Every request is
recorded and mapped to the RBAC (group, resource, verb) it needs, so the chart's Role can be
compared with what the code really calls.

    with FakeKubeApi() as api:
        api.add("scaledobjects", load("scaledobject_llama3.json"))
        api.set_pods(load("pods_llama3.json"))
        api.queue_watch(load("watch_scale_up.json"))    # served to the next watch request
        client = KubeApi.for_host(api.url)
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "kube"
PATH = re.compile(r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
                  r"/namespaces/(?P<ns>[^/]+)/(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?$")


def load(name: str) -> Any:
    """A fixture file's JSON."""
    return json.loads((FIXTURES / name).read_text())


def matches(selector: str, labels: dict[str, str]) -> bool:
    """Equality-based label selectors (``a=b,c=d``), the form the scaler sends for matchLabels."""
    for part in filter(None, selector.split(",")):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"unsupported selector term {part!r}")
        if labels.get(key.strip()) != value.strip():
            return False
    return True


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class FakeKubeApi:
    """Serves scaledobjects, deployments and pods; records (method, path, query, content type, body)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (resource, ns, name) -> object
        self.pod_list: dict[str, Any] = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []}
        self.watch_batches: list[list[dict[str, Any]]] = []
        self.requests: list[dict[str, Any]] = []
        self.forbidden: set[tuple[str, str]] = set()  # (verb, resource) answered with 403
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeKubeApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add(self, resource: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.objects[(resource, meta["namespace"], meta["name"])] = obj

    def set_pods(self, pod_list: dict[str, Any]) -> None:
        self.pod_list = pod_list

    def queue_watch(self, events: list[dict[str, Any]]) -> None:
        self.watch_batches.append(events)

    def rbac_calls(self) -> set[tuple[str, str, str]]:
        """(apiGroup, resource, verb) of every request served so far."""
        out = set()
        for req in self.requests:
            found = PATH.match(req["path"])
            if not found:
                continue
            group = "" if found["core"] else found["group"]
            if req["method"] == "GET":
                verb = "get" if found["name"] else ("watch" if req["query"].get("watch") == ["true"] else "list")
            else:
                verb = {"PATCH": "patch", "PUT": "update", "POST": "create", "DELETE": "delete"}[req["method"]]
            out.add((group, found["resource"], verb))
        return out

    # --- HTTP ---------------------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self, method: str) -> None:
                parts = urlsplit(self.path)
                query = parse_qs(parts.query)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                with api._lock:
                    api.requests.append({"method": method, "path": parts.path, "query": query, "body": body,
                                         "content_type": self.headers.get("Content-Type")})
                found = PATH.match(parts.path)
                if not found:
                    return self._send(404, status(404, "NotFound", f"no route {parts.path}"))
                resource, ns, name = found["resource"], found["ns"], found["name"]
                verb = ("get" if name else "watch" if query.get("watch") == ["true"] else "list") \
                    if method == "GET" else method.lower()
                if (verb, resource) in api.forbidden:
                    return self._send(403, status(403, "Forbidden", f'{resource} is forbidden: User '
                                                  f'"system:serviceaccount:keda:leadscale" cannot {verb} resource '
                                                  f'"{resource}" in the namespace "{ns}"'))
                if resource == "pods" and not name and method == "GET":
                    return self._pods(ns, query)
                if resource == "pods" and method == "PATCH":
                    return self._patch_pod(ns, name, body)
                obj = api.objects.get((resource, ns, name or ""))
                if method == "GET" and obj is not None:
                    return self._send(200, obj)
                return self._send(404, status(404, "NotFound", f'{resource} "{name}" not found'))

            def _pods(self, ns: str, query: dict[str, list[str]]) -> None:
                selector = query.get("labelSelector", [""])[0]
                try:
                    keep = [p for p in api.pod_list["items"] if p["metadata"]["namespace"] == ns
                            and matches(selector, p["metadata"].get("labels") or {})]
                except ValueError as exc:
                    return self._send(400, status(400, "BadRequest", str(exc)))
                if query.get("watch") != ["true"]:
                    return self._send(200, {**api.pod_list, "items": keep})
                events = api.watch_batches.pop(0) if api.watch_batches else []
                lines = [json.dumps(e) for e in events
                         if e["type"] in ("BOOKMARK", "ERROR")
                         or matches(selector, e["object"]["metadata"].get("labels") or {})]
                data = ("\n".join(lines) + ("\n" if lines else "")).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _patch_pod(self, ns: str, name: str, body: Any) -> None:
                if self.headers.get("Content-Type") != "application/merge-patch+json":
                    return self._send(415, status(415, "UnsupportedMediaType", "want a JSON merge patch"))
                for pod in api.pod_list["items"]:
                    if (pod["metadata"]["namespace"], pod["metadata"]["name"]) == (ns, name):
                        notes = pod["metadata"].setdefault("annotations", {})
                        for key, value in (body.get("metadata", {}).get("annotations") or {}).items():
                            if value is None:
                                notes.pop(key, None)
                            else:
                                notes[key] = value
                        return self._send(200, pod)
                return self._send(404, status(404, "NotFound", f'pods "{name}" not found'))

            def do_GET(self) -> None:
                self._route("GET")

            def do_PATCH(self) -> None:
                self._route("PATCH")

            def do_PUT(self) -> None:
                self._route("PUT")

            def do_POST(self) -> None:
                self._route("POST")

            def do_DELETE(self) -> None:
                self._route("DELETE")

        return Handler
