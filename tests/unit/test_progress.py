"""`a3c-train`'s progress: its lines come at their own pace, the run's end is seen at once."""

from __future__ import annotations

import httpx
import pytest

from a3c_http.cli import progress


def test_follow_sees_the_end_within_a_second_whatever_the_lines_pace(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(progress.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    finished_at = 95.5  # seconds on the fake clock

    def status(request: httpx.Request) -> httpx.Response:
        running = clock[0] < finished_at
        return httpx.Response(200, json={
            "state": "running" if running else "finished", "run_id": "r",
            "finish_reason": None if running else "max_steps=100 reached",
            "global_episode": 3, "global_steps": 100, "env_steps": 100, "mean_return_100": 1.0,
            "best_score": 2.0, "elapsed_s": clock[0], "updates_applied": 1, "workers": [],
        })  # fmt: skip

    http = httpx.Client(transport=httpx.MockTransport(status))
    last = progress.follow(http, "http://master", "r", time_cap=None, every=60.0)
    assert last["state"] == "finished"
    assert finished_at <= clock[0] <= finished_at + 1.0  # not at the next line, 120 s
    out = capsys.readouterr().out
    assert "run finished: max_steps=100 reached" in out
    assert len([line for line in out.splitlines() if "steps" in line]) >= 2  # a line at 60 s
