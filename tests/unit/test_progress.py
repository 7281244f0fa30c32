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


class Restarting:
    """A master's /status on a fake clock: run "r" running, the master gone (connection refused)
    from `down` to `up` seconds and answering 503 for a second after (starting, resuming its
    folder), the run finished at `end`. Every other request is recorded and answered 404."""

    def __init__(self, clock: list[float], down: float, up: float, end: float) -> None:
        self.clock, self.down, self.up, self.end = clock, down, up, end
        self.others: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        now = self.clock[0]
        if request.url.path != "/status":
            self.others.append(f"{request.method} {request.url.path}")
            return httpx.Response(404, json={"detail": "not here"})
        if self.down <= now < self.up:
            raise httpx.ConnectError("Connection refused", request=request)
        if self.up <= now < self.up + 1.0:
            return httpx.Response(503, json={"detail": "starting"})
        running = now < self.end
        return httpx.Response(200, json={
            "state": "running" if running else "finished", "run_id": "r", "config": {},
            "finish_reason": None if running else "solved", "solved": not running,
            "global_episode": 3, "global_steps": 100, "env_steps": 100, "mean_return_100": 1.0,
            "best_score": 2.0, "elapsed_s": now, "updates_applied": 1, "workers": [],
        })  # fmt: skip


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(progress.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    return now


def test_a_follower_waits_for_its_master_to_come_back_and_follows_the_same_run(
    clock: list[float], capsys: pytest.CaptureFixture[str]
) -> None:
    """A master killed at 10 s and serving again at 70 s (its run resumed): a3c-train's follower
    says so twice and follows the run to its end; one that stays away past `reconnect_s` is
    given up with MasterLost."""
    master = Restarting(clock, down=10.0, up=70.0, end=100.0)
    http = httpx.Client(transport=httpx.MockTransport(master))
    last = progress.follow(http, "http://m", "r", time_cap=None, every=5.0, reconnect_s=120.0)
    assert last["state"] == "finished" and last["solved"]
    out = capsys.readouterr().out
    assert out.count("the master at http://m cannot be reached (Connection refused)") == 1
    assert out.count("the master at http://m is back: run r, running") == 1
    assert "run finished: solved" in out

    clock[0] = 0.0
    gone = Restarting(clock, down=10.0, up=10**9, end=10**9)
    http = httpx.Client(transport=httpx.MockTransport(gone))
    with pytest.raises(progress.MasterLost, match="did not come back within 30 s"):
        progress.follow(http, "http://m", "r", time_cap=None, every=5.0, reconnect_s=30.0)
    assert 40.0 <= clock[0] <= 42.0


def test_attach_follows_a_run_started_elsewhere_through_a_restart_and_leaves_it_alone(
    clock: list[float], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`a3c-train --master URL --follow` and the API's `attach`: the run the master runs now,
    followed through its master's restart to its end, with nothing started or stopped."""
    from a3c_http.api import training
    from a3c_http.cli import remote

    master = Restarting(clock, down=10.0, up=40.0, end=60.0)
    http = httpx.Client(transport=httpx.MockTransport(master))
    assert remote.attach_on_master(http, "http://m", every=5.0) == 0
    out = capsys.readouterr().out
    assert "following run r on http://m (running)" in out and out.rstrip().endswith("SOLVED")
    assert "is back" in out and master.others == []

    def interrupted(request: httpx.Request) -> httpx.Response:
        if clock[0] > 20.0:
            raise remote.Stopped("SIGINT")
        return master(request)

    clock[0] = 0.0
    http = httpx.Client(transport=httpx.MockTransport(interrupted))
    assert remote.attach_on_master(http, "http://m", every=5.0) == 1
    assert "SIGINT: run r goes on" in capsys.readouterr().out and master.others == []

    clock[0] = 0.0
    monkeypatch.setattr(
        training, "_client", lambda url, token: httpx.Client(
            base_url=url, transport=httpx.MockTransport(master)),
    )  # fmt: skip
    run = training.attach("http://m:33333", progress=False)
    assert run.attached and run.id == "r"
    assert run.wait()["solved"] and master.others == []
    run.close()
    assert master.others == []  # closing an attached run does not stop it
