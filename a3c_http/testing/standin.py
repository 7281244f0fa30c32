"""A stand-in worker host: an in-process HTTP server that answers `POST /start_worker` like a
worker and then never trains, so that a master's run stays `running` while the caller (a test, a
benchmark) plays the worker's part itself."""

from __future__ import annotations

import http.server
import json
import threading
import time
from typing import Any

import httpx

from a3c_http.net.tls import TLS


class StandInWorker:
    """An HTTP server in this process that plays a worker host which never trains: it answers 202
    to `POST /start_worker` (and to any other POST), 200 to GET, and keeps every request it got
    (`requests`: method, path, lower-case headers, JSON body or None). With `token`, it refuses
    requests without `Authorization: Bearer <token>` with 401, as a worker with that token does,
    and sends that token to the master. A master's run whose only workers are stand-ins stays
    `running` (they stay `starting`), so the caller can play the worker's part itself and control
    every counter.

    `start_delay_s` makes it a slow host: its answer to `POST /start_worker` takes that long. With
    `beat_s` it then acts alive without training: `POST /worker_started` to the master it was
    given, and `POST /heartbeat` every `beat_s` (at most `max_beats`, until closed); `events`
    keeps (monotonic time, what, HTTP status) of those. With `tls` it serves HTTPS and calls
    over it, as a worker with those settings."""

    def __init__(
        self,
        token: str | None = None,
        host: str = "127.0.0.1",
        start_delay_s: float = 0.0,
        beat_s: float | None = None,
        max_beats: int = 600,
        tls: TLS | None = None,
    ) -> None:
        self.token = token
        self.tls = tls or TLS()
        self.start_delay_s = start_delay_s
        self.beat_s = beat_s
        self.max_beats = max_beats
        self.requests: list[dict[str, Any]] = []
        self.events: list[tuple[float, str, int]] = []
        self._closing = threading.Event()
        self._beaters: list[threading.Thread] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _handle(self, code: int) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                headers = {k.lower(): v for k, v in self.headers.items()}
                with owner._lock:
                    owner.requests.append(
                        {"method": self.command, "path": self.path, "headers": headers,
                         "body": body}
                    )
                start = self.command == "POST" and self.path.startswith("/start_worker")
                if owner.token and headers.get("authorization") != f"Bearer {owner.token}":
                    code, reply, start = 401, {"detail": "missing or wrong token"}, False
                elif self.command == "GET":
                    reply = {"status": "ok", "state": "idle"}
                else:
                    reply = {"data": {"state": "running"}}
                if start:
                    # a slow host: the answer itself takes this long (not a synchronisation)
                    owner._closing.wait(owner.start_delay_s)
                data = json.dumps(reply).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                self.wfile.flush()
                if start and owner.beat_s is not None and isinstance(body, dict):
                    owner._record("answered /start_worker", code)
                    beater = threading.Thread(target=owner._live, args=(body,), daemon=True)
                    owner._beaters.append(beater)
                    beater.start()

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                self._handle(200)

            def do_POST(self) -> None:  # noqa: N802
                self._handle(202)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        if self.tls.serves:  # HTTPS as a worker with these TLS settings (a3c_http/net/tls.py)
            context = self.tls.server_context()
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        # A short poll interval: shutdown() waits for it (0.5 s by default, at every close).
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{'https' if self.tls.serves else 'http'}://{host}:{port}"

    def _record(self, what: str, code: int) -> None:
        with self._lock:
            self.events.append((time.monotonic(), what, code))

    def _live(self, start: dict[str, Any]) -> None:
        """Register with the master of `start` and heart-beat until closed (a live worker's
        messages, without its training)."""
        assert self.beat_s is not None
        master = str(start.get("master_url", "")).rstrip("/")
        worker_id = start.get("worker_id")
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        verify = self.tls.client_context()
        with httpx.Client(
            base_url=master, headers=headers, timeout=10, trust_env=False, verify=verify
        ) as c:
            try:
                reply = c.post(
                    "/worker_started",
                    json={"worker_id": worker_id, "url": self.url, "run_id": start.get("run_id")},
                )
                self._record("worker_started", reply.status_code)
                for _ in range(self.max_beats):
                    if self._closing.wait(self.beat_s):  # the beat's period
                        return
                    reply = c.post("/heartbeat", json={"worker_id": worker_id})
                    self._record(f"heartbeat {reply.text[:80]}", reply.status_code)
            except httpx.HTTPError as exc:
                self._record(f"error {exc!r}", 0)

    def starts(self) -> list[dict[str, Any]]:
        """The `POST /start_worker` requests received so far."""
        with self._lock:
            return [r for r in self.requests if r["path"].startswith("/start_worker")]

    def close(self) -> None:
        self._closing.set()
        for beater in self._beaters:
            beater.join(timeout=15)
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> StandInWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
