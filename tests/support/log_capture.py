"""The events our loggers write (a3c_http/server/logs.py), as pytest's caplog captures them.

Once set up, our `a3c` logger does not hand its records to the root logger, where caplog listens.
pytest attaches caplog's handler to such loggers too, but only to those that were so when the
test's phase began (not when the test's app sets logging up); the fixture `captured_events`
(tests/conftest.py) gives the `a3c` logger a handler that passes each record to caplog's handler
of the current phase when neither the root logger nor pytest's own attachment will."""

from __future__ import annotations

import logging

import pytest


class _ToCaplog(logging.Handler):
    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        super().__init__()
        self.caplog = caplog

    def emit(self, record: logging.LogRecord) -> None:
        handler, ours = self.caplog.handler, logging.getLogger("a3c")
        if not ours.propagate and handler not in ours.handlers:
            handler.handle(record)


class CapturedEvents:
    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self.caplog = caplog
        self.handler = _ToCaplog(caplog)

    def records(self) -> list[logging.LogRecord]:
        return [r for r in self.caplog.records if r.name.startswith("a3c")]

    def names(self) -> list[str]:
        """The events' names in the order they were logged (records without one left out)."""
        return [r.event for r in self.records() if getattr(r, "event", None)]

    def all(self, event: str) -> list[logging.LogRecord]:
        return [r for r in self.records() if getattr(r, "event", None) == event]

    def one(self, event: str) -> logging.LogRecord:
        found = self.all(event)
        assert len(found) == 1, f"{event}: {len(found)} records; events: {self.names()}"
        return found[0]
