"""The services' own logs: one line per event worth knowing, readable by a person or, with
A3C_LOG_FORMAT=json, one JSON object per line for a log collector.

Our loggers are `a3c.master` and `a3c.worker` (and below them); `configure` gives the `a3c` logger
one handler on stderr and A3C_LOG_LEVEL, and stops its records there, so uvicorn's loggers (and
their `--log-level`) stay as uvicorn set them, and a root handler added by someone else does not
print our lines twice. An event is a record with `event`, `run_id`, `worker_id` and `fields`
attributes (`emit`); a plain `logger.info(...)` works too.

    2026-11-23 16:40:01 INFO a3c.master run=20261123-164001-ab12cd worker=w1 worker joined url=...
    {"time": "2026-11-23T16:40:01.123+01:00", "level": "INFO", "logger": "a3c.master", ...}
"""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Literal

ROOT = "a3c"
LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["text", "json"]
ExcInfo = bool | BaseException


class StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a line is written, not when the handler was made
    (pytest's capture, a redirect), as logging's last-resort handler does."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass  # always sys.stderr


def configure(level: LogLevel = "info", fmt: LogFormat = "text") -> None:
    """Set up the `a3c` loggers: once per process; a later call (another app made in the same
    process) only changes the level and the format."""
    logger = logging.getLogger(ROOT)
    handler = next((h for h in logger.handlers if isinstance(h, StderrHandler)), None)
    if handler is None:
        handler = StderrHandler()
        logger.addHandler(handler)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logger.setLevel(level.upper())
    logger.propagate = False


def emit(
    logger: logging.Logger,
    level: int,
    event: str,
    message: str,
    run_id: str | None = None,
    worker_id: str | None = None,
    fields: Mapping[str, Any] | None = None,
    exc_info: ExcInfo = False,
) -> None:
    """Log one event: `message` says what happened in words, `event` names it for machines,
    `fields` carry its figures; `exc_info`: an exception whose traceback goes with it."""
    if logger.isEnabledFor(level):
        extra = {"event": event, "run_id": run_id, "worker_id": worker_id, "fields": fields or {}}
        logger.log(level, message, extra=extra, exc_info=exc_info)


class Events:
    """A logger that names its run and worker in every event it logs."""

    def __init__(
        self, logger: logging.Logger, run_id: str | None = None, worker_id: str | None = None
    ) -> None:
        self.logger = logger
        self.run_id = run_id
        self.worker_id = worker_id

    def log(
        self, level: int, event: str, message: str, exc_info: ExcInfo = False, **fields: Any
    ) -> None:
        emit(self.logger, level, event, message, self.run_id, self.worker_id, fields, exc_info)

    def debug(self, event: str, message: str, **fields: Any) -> None:
        self.log(logging.DEBUG, event, message, **fields)

    def info(self, event: str, message: str, **fields: Any) -> None:
        self.log(logging.INFO, event, message, **fields)

    def warning(self, event: str, message: str, **fields: Any) -> None:
        self.log(logging.WARNING, event, message, **fields)

    def error(self, event: str, message: str, exc_info: ExcInfo = False, **fields: Any) -> None:
        self.log(logging.ERROR, event, message, exc_info, **fields)


class ProgressClock:
    """When the next progress line is due: every `interval_s` seconds, never with 0."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._since = clock()

    def due(self) -> float | None:
        """The seconds since it was last due (or made) once `interval_s` have passed, else
        None."""
        if self.interval_s <= 0:
            return None
        now = self._clock()
        seconds = now - self._since
        if seconds < self.interval_s:
            return None
        self._since = now
        return seconds


class Outage:
    """Whether the master at `url` answers a client: the first failed request logs that contact
    is lost, each retry after it logs at DEBUG, and the next answer logs that it is back. Safe to
    call from several threads at once."""

    def __init__(self, events: Events, url: str) -> None:
        self.events = events
        self.url = url
        self._lock = threading.Lock()
        self._since: float | None = None  # monotonic: when contact was lost

    def failed(self, request: str, problem: str, attempt: int) -> None:
        with self._lock:
            first = self._since is None
            if first:
                self._since = time.monotonic()
        if first:
            self.events.warning(
                "master_lost",
                "lost contact with the master",
                url=self.url,
                request=request,
                problem=problem,
            )
        else:
            self.events.debug("retry", "no answer yet", request=request, attempt=attempt)

    def answered(self) -> None:
        if self._since is None:  # the cheap look of every answer
            return
        with self._lock:
            since, self._since = self._since, None
        if since is not None:
            self.events.info(
                "master_back",
                "the master answers again",
                url=self.url,
                after_s=round(time.monotonic() - since, 1),
            )


def _plain(value: Any) -> Any:
    """`value` as JSON can hold it: NaN and infinities (which JSON lacks) as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _text(value: Any) -> str:
    """A field's value in a text line: numbers short, words bare, anything else (text with a
    space, a quote or `=`, lists, null) as JSON."""
    if isinstance(value, float) and math.isfinite(value):
        if value == 0 or abs(value) >= 1e-3:
            return f"{value:.4f}".rstrip("0").rstrip(".")
        return f"{value:.3g}"
    if isinstance(value, str) and value and not any(c in value for c in ' "=\n\t'):
        return value
    return json.dumps(_plain(value), default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """`2026-11-23 16:40:01 INFO a3c.master run=... worker=w1 worker joined url=...`: the time,
    the level, the logger, the run and the worker, the message, then the figures as key=value."""

    def __init__(self) -> None:
        super().__init__(datefmt="%Y-%m-%d %H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        parts = [self.formatTime(record, self.datefmt), record.levelname, record.name]
        if getattr(record, "run_id", None):
            parts.append(f"run={record.run_id}")
        if getattr(record, "worker_id", None):
            parts.append(f"worker={record.worker_id}")
        parts.append(record.getMessage())
        fields = getattr(record, "fields", None) or {}
        parts.extend(f"{k}={_text(v)}" for k, v in fields.items())
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, then the event's name, run id,
    worker id and figures (and the traceback, as one string, when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created).astimezone()
        out: dict[str, Any] = {
            "time": when.isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("event", "run_id", "worker_id"):
            if getattr(record, key, None) is not None:
                out[key] = getattr(record, key)
        for key, value in (getattr(record, "fields", None) or {}).items():
            out.setdefault(key, _plain(value))
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)
