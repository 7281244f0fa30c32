"""What the tests on real processes share: polling with a deadline, a short run's config and a
stand-in worker."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Callable

# A run of a few seconds on two workers.
SHORT_RUN = {
    "num_envs": 2,
    "t_max": 8,
    "max_episodes": 40,
    "max_steps": None,
    "seed": 7,
    "heartbeat_interval_s": 0.5,
    "heartbeat_timeout_s": 20,
}
# A run that goes on until it is stopped.
ENDLESS_RUN = {**SHORT_RUN, "max_episodes": None, "max_steps": None, "target_return": 1e9}


def wait_for(condition: Callable[[], object], timeout_s: float, what: str) -> object:
    """Poll `condition` until it returns something truthy, or fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class StandInWorker:
    """A worker that accepts `POST /start_worker` (202) and then does nothing: the master's run
    stays running with it `starting`, and the test plays the worker's part itself."""

    def __init__(self) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.dumps({"data": {"state": "running"}}).encode()
                self.send_response(202)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def master_sees_every_worker_done(status_of: Callable[[], dict]) -> dict | None:
    """The master's status once its registry shows every worker done, else None (for wait_for)."""
    status = status_of()
    return status if {w["state"] for w in status["workers"]} == {"done"} else None
