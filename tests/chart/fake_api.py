"""A Kubernetes API server that knows Secrets and nothing else: what `helm template
--dry-run=server` needs to answer the chart's `lookup`s (discovery of core/v1 and GET of a
Secret). No Kubernetes API server runs on these machines; this stands in for one, only so
that a render can see the Secrets an earlier install left (the chart's upgrade path)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_RESOURCES = {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
    {"name": "secrets", "singularName": "secret", "namespaced": True, "kind": "Secret", "verbs": ["get", "list"]}]}


class FakeSecretsApi:
    def __init__(self) -> None:
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.gets: list[str] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name
                path = self.path.split("?")[0]
                parts = path.strip("/").split("/")
                if path == "/version":
                    self._send(200, {"major": "1", "minor": "33", "gitVersion": "v1.33.0"})
                elif path == "/api":
                    self._send(200, {"kind": "APIVersions", "versions": ["v1"]})
                elif path == "/apis":
                    self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
                elif path == "/api/v1":
                    self._send(200, _RESOURCES)
                elif len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "secrets":
                    api.gets.append(parts[5])
                    secret = api.secrets.get((parts[3], parts[5]))
                    if secret is None:
                        self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                         "reason": "NotFound", "code": 404})
                    else:
                        self._send(200, secret)
                else:
                    self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeSecretsApi":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    def kubeconfig(self, directory: Path) -> Path:
        path = directory / "kubeconfig"
        port = self.server.server_address[1]
        path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: fake, user: {{}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: fake}}}}]
current-context: fake
""")
        return path

    def store(self, namespace: str, secrets: list[dict[str, Any]]) -> None:
        """What an install left in the cluster: these Secrets."""
        for s in secrets:
            self.secrets[(namespace, s["metadata"]["name"])] = s
