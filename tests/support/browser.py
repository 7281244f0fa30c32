"""A real headless Chromium for the dashboard's test, driven over the DevTools protocol with the
`websockets` client that uvicorn[standard] installs (no Selenium, no browser download).

Debian's `chromium` package provides the browser; `.ci/run` installs it when it is missing, and
`chromium_or_skip()` skips the test with the reason where there is none.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from a3c_http.local.cluster import wait_for

NAMES = ("chromium", "chromium-browser", "google-chrome")


def chromium_or_skip() -> str:
    for name in NAMES:
        if path := shutil.which(name):
            return path
    pytest.skip(
        "no Chromium on PATH (Debian's `chromium` package; .ci/run installs it with apt-get): "
        "the dashboard's browser test needs one"
    )


class JavaScriptError(AssertionError):
    """An expression evaluated in the page threw."""


class Browser:
    """One headless Chromium process with one page. Close it (or use `with`) to end the process
    and its children: they run in a process group of their own, ended by the browser's pid."""

    def __init__(self, executable: str, profile: Path, log: Path) -> None:
        profile.mkdir(parents=True, exist_ok=True)
        port_file = profile / "DevToolsActivePort"
        port_file.unlink(missing_ok=True)  # a profile used before: only the new port counts
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    executable, "--headless=new", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
                    "--window-size=1280,900",
                    "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                    f"--user-data-dir={profile}", "about:blank",
                ],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.ids = itertools.count(1)
        self.closing = ExitStack()
        try:
            port = wait_for(
                lambda: port_file.exists() and port_file.read_text().split("\n")[0].strip(),
                30, "Chromium to open its DevTools port",
            )

            def page() -> dict[str, Any] | None:
                targets = httpx.get(f"http://127.0.0.1:{port}/json/list", trust_env=False)
                return next((t for t in targets.json() if t["type"] == "page"), None)

            url = wait_for(page, 30, "Chromium's page")["webSocketDebuggerUrl"]
            self.ws = self.closing.enter_context(connect(url, max_size=None, open_timeout=10))
        except BaseException:
            self._end()
            raise

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result (events that arrive meanwhile are dropped)."""
        call_id = next(self.ids)
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=30))
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def js(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises are awaited)."""
        result = self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise JavaScriptError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait(self, expression: str, timeout_s: float, what: str) -> Any:
        """Poll `expression` in the page until it is truthy; its value."""

        def value() -> Any:
            try:
                return self.js(expression)
            except JavaScriptError:  # the page is still loading
                return None

        return wait_for(value, timeout_s, what)

    def close(self) -> None:
        try:
            self.closing.close()
        finally:
            self._end()

    def _end(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        with suppress(ProcessLookupError):  # the renderers and helpers it started, its group
            os.killpg(self.proc.pid, signal.SIGKILL)
