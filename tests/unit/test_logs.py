"""The services' logging set-up (a3c_http/server/logs.py): the text and JSON formats, A3C_LOG_LEVEL
and A3C_LOG_FORMAT, one set-up however many apps a process makes, uvicorn's loggers left alone; and
the pieces that decide what is logged: the client's lost contact, the progress lines."""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import master.app
import worker.app
from a3c_http.config.settings import Settings, WorkerSettings
from a3c_http.net.client import MasterClient
from a3c_http.server import logs
from master.run.events import ProgressLog
from tests.support.log_capture import CapturedEvents

ROOT = logging.getLogger("a3c")
TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


@pytest.fixture(autouse=True)
def _default_logging() -> Iterator[None]:
    """Each test configures what it needs; the default is back for the next."""
    yield
    logs.configure("info", "text")


def stderr_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line]


def joined(worker: str = "w1") -> logs.Events:
    return logs.Events(logging.getLogger("a3c.master"), "20261123-164001-ab12cd", worker)


# -- the formats ----------------------------------------------------------------------------------


def test_a_text_line_names_the_run_and_the_worker_then_the_figures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logs.configure("info", "text")
    joined().info(
        "worker_joined",
        "worker joined",
        url="http://127.0.0.1:8001",
        reason="no message for 31.0 s",
        best=475.0,
        lr=7e-5,
        sizes=[64, 64],
        target=None,
    )
    (line,) = stderr_lines(capsys)
    assert re.fullmatch(
        TIME + r" INFO a3c\.master run=20261123-164001-ab12cd worker=w1 worker joined "
        r'url=http://127\.0\.0\.1:8001 reason="no message for 31\.0 s" best=475 lr=7e-05 '
        r"sizes=\[64,64\] target=null",
        line,
    ), line


def test_json_is_one_object_per_line_with_the_events_fields(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logs.configure("info", "json")
    joined().info("best_score", "best score raised", best_score=21.5, episode=7, odd=float("nan"))
    logging.getLogger("a3c.master").info("a plain line")
    try:
        raise RuntimeError("surprise")
    except RuntimeError:
        logging.getLogger("a3c.worker").exception("it broke")
    lines = stderr_lines(capsys)
    assert len(lines) == 3, lines
    event, plain, broken = (json.loads(line) for line in lines)
    assert set(event) == {
        "time", "level", "logger", "message", "event", "run_id", "worker_id",
        "best_score", "episode", "odd",
    }  # fmt: skip
    assert (event["level"], event["logger"], event["message"]) == (
        "INFO",
        "a3c.master",
        "best score raised",
    )
    assert (event["event"], event["run_id"], event["worker_id"]) == (
        "best_score",
        "20261123-164001-ab12cd",
        "w1",
    )
    assert (event["best_score"], event["episode"], event["odd"]) == (21.5, 7, "nan")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d", event["time"])
    assert set(plain) == {"time", "level", "logger", "message"}
    assert broken["level"] == "ERROR" and "RuntimeError: surprise" in broken["traceback"]


# -- the settings and the set-up ------------------------------------------------------------------


# Each service's start once (the settings they share, a3c_http/config/environment.py
# `FromEnv`, judge both).
@pytest.mark.parametrize(
    ("service", "name", "raw"),
    [(master.app, "A3C_LOG_LEVEL", "loud"), (worker.app, "A3C_LOG_FORMAT", "xml")],
)
def test_a_bad_log_setting_stops_the_service_naming_it(
    monkeypatch: pytest.MonkeyPatch, service, name: str, raw: str
) -> None:
    monkeypatch.setenv(name, raw)
    with pytest.raises(SystemExit) as info:
        service.__getattr__("app")
    message = str(info.value)
    assert f"{name}={raw!r}" in message and "\n" not in message, message
    assert "'text' or 'json'" in message or "'warning' or 'error'" in message, message


def test_log_settings_take_any_case_and_progress_can_be_turned_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("A3C_LOG_LEVEL", "WARNING")
    monkeypatch.setenv("A3C_LOG_FORMAT", "JSON")
    monkeypatch.setenv("A3C_LOG_PROGRESS_S", "0")
    for settings in (Settings.from_env(), WorkerSettings.from_env()):
        assert (settings.log_level, settings.log_format, settings.log_progress_s) == (
            "warning",
            "json",
            0.0,
        )
    monkeypatch.setenv("A3C_LOG_PROGRESS_S", "-5")
    with pytest.raises(ValueError, match="A3C_LOG_PROGRESS_S='-5'"):
        WorkerSettings.from_env()


@pytest.mark.parametrize(
    ("level", "written"),
    [
        ("debug", ["DEBUG", "INFO", "WARNING", "ERROR"]),
        ("info", ["INFO", "WARNING", "ERROR"]),
        ("warning", ["WARNING", "ERROR"]),
        ("error", ["ERROR"]),
    ],
)
def test_the_level_filters_our_lines(
    capsys: pytest.CaptureFixture[str], level: logs.LogLevel, written: list[str]
) -> None:
    logs.configure(level, "text")
    events = joined()
    events.debug("retry", "no answer yet")
    events.info("worker_joined", "worker joined")
    events.warning("worker_lost", "worker lost")
    events.error("worker_failed", "worker failed")
    assert [line.split()[2] for line in stderr_lines(capsys)] == written


def test_apps_made_again_set_logging_up_once_and_leave_uvicorn_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def loggers() -> list[tuple]:
        names = ("", "uvicorn", "uvicorn.error", "uvicorn.access")
        return [
            (logging.getLogger(n).level, list(logging.getLogger(n).handlers)) for n in names
        ]

    before = loggers()
    for i in range(2):
        worker.app.create_app(settings=WorkerSettings(log_format="json"))
        app = master.app.create_app(Settings(run_dir=tmp_path / f"run{i}", log_level="debug"))
        app.state.cluster.close()
    assert loggers() == before
    assert sum(isinstance(h, logs.StderrHandler) for h in ROOT.handlers) == 1
    assert ROOT.propagate is False
    assert ROOT.level == logging.DEBUG  # the last app's settings
    capsys.readouterr()
    joined().debug("retry", "no answer yet")
    (line,) = stderr_lines(capsys)
    assert line.endswith(" DEBUG a3c.master run=20261123-164001-ab12cd worker=w1 no answer yet")


# -- what decides a line --------------------------------------------------------------------------


def test_the_client_logs_a_lost_contact_once_and_its_end(
    captured_events: CapturedEvents,
) -> None:
    answers = iter([503, 503, 503, 200, 200])

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(next(answers), json={"status": "ok", "detail": "restarting"})

    logs.configure("debug", "text")
    events = logs.Events(logging.getLogger("a3c.worker"), "r1", "w1")
    client = MasterClient(
        "http://master", transport=httpx.MockTransport(handler), backoff_s=0.001, events=events
    )
    assert client.healthz() and client.healthz()
    assert captured_events.names() == ["master_lost", "retry", "retry", "master_back"]
    lost = captured_events.one("master_lost")
    assert (lost.run_id, lost.worker_id, lost.levelname) == ("r1", "w1", "WARNING")
    assert lost.fields["request"] == "GET /healthz" and "503" in lost.fields["problem"]


def test_the_master_progress_line_comes_every_interval_while_a_run_runs(
    captured_events: CapturedEvents,
) -> None:
    clock = itertools.count(0.0, 10.0)  # each look at the clock is 10 s later
    progress = ProgressLog(30.0, clock=lambda: next(clock))
    asked: list[int] = []
    state = {"state": "running", "run_id": "r1", "elapsed_s": 60.0}  # resumed: 30 s before

    def status() -> dict:
        asked.append(1)
        workers = [{"state": "running"}, {"state": "lost"}]
        steps = 600 * len(asked)
        return {
            **state, "env_steps": steps, "global_episode": len(asked), "best_score": 9.0,
            "mean_return_100": 8.5, "model_version": 40, "workers": workers,
            "updates_applied": 39, "updates_rejected": 970,
            "updates_rejected_by": {"invalid": 0, "stale": 968, "outlier": 2},
        }  # fmt: skip

    for _ in range(2):
        progress.tick(status)  # 10 s, 20 s: not due
    assert asked == []
    progress.tick(status)  # 30 s
    for _ in range(3):  # 40, 50, 60 s
        progress.tick(status)
    state["state"] = "finished"
    for _ in range(3):
        progress.tick(status)  # due at 90 s, but the run is over
    assert len(asked) == 3
    first, second = captured_events.all("progress")
    assert first.run_id == "r1" and first.fields == {
        "episodes": 1, "env_steps": 600, "steps_per_s": 10.0, "mean_return_100": 8.5,
        "best_score": 9.0, "model_version": 40, "updates_applied": 39, "updates_rejected": 970,
        "rejected_by": {"stale": 968, "outlier": 2}, "workers_running": 1, "workers": 2,
    }  # fmt: skip
    assert second.fields["steps_per_s"] == 600 / 30  # since the first line


def test_a_progress_interval_of_0_never_logs() -> None:
    progress_clock = logs.ProgressClock(0.0, clock=itertools.count(0.0, 1000.0).__next__)
    assert [progress_clock.due() for _ in range(5)] == [None] * 5
