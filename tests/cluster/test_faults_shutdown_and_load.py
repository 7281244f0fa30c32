"""A master's shutdown and load, on real processes: SIGTERM and POST /stop persist everything,
and many clients at once lose no update. The load test prints the figure it measured
(`pytest -s`).

Both use a master of this module with no periodic save, so that only SIGTERM's and POST
/stop's own saves can explain what a restart finds."""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from a3c_http.local.cluster import ServiceProcess, free_port
from a3c_http.store.runstore import RunStore
from a3c_http.testing.standin import StandInWorker
from tests.support.common import AUTH, OCTET, STAND_IN_RUN, TOKEN, registry, snapshot

JSON = {"Content-Type": "application/json"}

pytestmark = pytest.mark.integration


# -- a master of this module, with no periodic save ----------------------------------------------


@pytest.fixture(scope="module")
def quiet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """A master with the token and a persist interval of an hour."""
    tmp = tmp_path_factory.mktemp("quiet")
    (tmp / "workers.txt").write_text("")
    with pytest.MonkeyPatch.context() as mp:
        for key in list(os.environ):
            if key.startswith("A3C_"):
                mp.delenv(key)
        proc = ServiceProcess(
            "master.app:app", free_port(), tmp / "master.log", token=TOKEN,
            env={"A3C_RUN_DIR": str(tmp / "run"), "A3C_WORKERS_FILE": str(tmp / "workers.txt"),
                 "A3C_PERSIST_INTERVAL_S": "3600"},
        )
    try:
        yield proc.start().wait_healthy(120)
    finally:
        proc.stop()
        assert not proc.running()


def run_dir(master: ServiceProcess) -> Path:
    return Path(master.env["A3C_RUN_DIR"])


@pytest.fixture
def quiet_run(quiet: ServiceProcess, standin: StandInWorker) -> Iterator[httpx.Client]:
    """The quiet master (up: a test before may have ended it) running a fresh run whose only
    worker is the stand-in; a client with the token and the master's URL as base."""
    if not quiet.running():
        quiet.start().wait_healthy(120)
    with httpx.Client(base_url=quiet.url, headers=AUTH, timeout=60, trust_env=False) as c:
        c.post("/stop", json={})
        body = {**STAND_IN_RUN, "workers": [standin.url], "max_staleness": 100_000}
        reply = c.post("/train", json=body)
        assert reply.status_code == 202, reply.text
        yield c


def test_sigterm_and_stop_persist_everything(
    quiet: ServiceProcess, quiet_run: httpx.Client
) -> None:
    c = quiet_run
    run_id = c.get("/status").json()["run_id"]
    good = st_load(c.get("/global_model_weights").content)
    pushed: list[float] = []
    for i in range(7):
        reply = c.post("/episode", json={"worker_id": "w1", "reward": 10.0 + i, "length": 9})
        assert reply.status_code == 200, reply.text
        pushed.append(reply.json()["data"]["moving_average"])
    for v in (1.5, 2.5):
        assert c.post("/queue", json={"data": v}).status_code == 200
        pushed.append(v)
    assert c.post("/global_episode", json={"data": 3}).status_code == 200
    assert c.post("/best_score", json={"data": 99.5, "worker_id": "w1"}).status_code == 200
    assert c.post("/global_moving_average", json={"data": 40.0}).status_code == 200
    new = {k: v + 0.25 for k, v in good.items()}
    reply = c.post("/local_model_weights?worker_id=w1&temporary=false", content=st_save(new),
                   headers=OCTET)
    assert reply.status_code == 200, reply.text
    grads = st_save({k: torch.full_like(v, 1e-3) for k, v in good.items()})
    version = c.get("/global_model_weights").headers["X-Model-Version"]
    gradient = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": version}
    assert c.post("/gradients", content=grads, headers=gradient).status_code == 200
    assert c.post("/gradients", content=b"junk", headers=gradient).status_code == 422
    before = snapshot(c)
    full = c.get("/status").json()
    assert full["updates_rejected"] == 1 and full["queue_length"] == len(pushed)

    exit_code = quiet.stop()
    assert exit_code in (0, -signal.SIGTERM), exit_code
    quiet.start().wait_healthy(120)
    after = snapshot(c)
    assert after == before, "not everything was persisted on SIGTERM"
    assert after["run_id"] == run_id and after["state"] == "running"
    resumed = c.get("/status").json()
    for key in ("updates_rejected", "config", "queue_dropped"):
        assert resumed[key] == full[key], key
    popped = [c.get("/queue").json()["data"] for _ in range(len(pushed))]
    assert popped == pushed, "the FIFO was not persisted in order"
    assert c.get("/queue").json()["empty"] is True

    # POST /stop persists at once: kill -9 right after it loses nothing.
    for i in range(3):
        reply = c.post("/episode", json={"worker_id": "w1", "reward": 50.0 + i, "length": 4})
        assert reply.status_code == 200, reply.text
    data = c.post("/stop", json={}).json()["data"]
    assert data["stopped"] is True and data["state"] == "finished" and data["run_id"] == run_id
    stopped = snapshot(c)
    quiet.kill()
    quiet.start().wait_healthy(120)
    assert snapshot(c) == stopped, "POST /stop did not persist"
    final = c.get("/status").json()
    assert final["finish_reason"] == "stopped by POST /stop"
    assert c.post("/stop", json={}).json()["data"]["stopped"] is False


# -- many clients at once ------------------------------------------------------------------------


def run_all(jobs: list[tuple[Callable[[int], None], int]]) -> None:
    """Run every job in a thread of its own, all at once; fail on the first error."""
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        for future in [pool.submit(fn, t) for fn, t in jobs]:
            future.result(timeout=300)


def test_concurrent_clients_lose_no_update(quiet: ServiceProcess, quiet_run: httpx.Client) -> None:
    """16 reporters of 40 episodes each (numbered: X-A3C-Seq), 4 pushers of 25 gradients, 4
    clients adding to /global_episode, all at once, then 8 raising /best_score: every update is
    counted once, in an order the history, the FIFO and the statistics agree on."""
    c = quiet_run
    threads, per_thread = 16, 40
    rewards = {(t, i): float((t * 7919 + i * 104729) % 1000) / 4
               for t in range(threads) for i in range(per_thread)}
    initial = c.get("/global_model_weights")
    first_version = int(initial.headers["X-Model-Version"])
    grads = st_save({k: torch.full_like(v, 1e-3) for k, v in st_load(initial.content).items()})
    increments: list[int] = []
    pushed: list[int] = []
    lock = threading.Lock()

    def client() -> httpx.Client:
        return httpx.Client(base_url=quiet.url, headers=AUTH, timeout=60, trust_env=False)

    def register(own: httpx.Client, worker_id: str) -> None:
        # Only registered workers report and push.
        assert own.post("/worker_started", json={"worker_id": worker_id}).status_code == 200

    def reporter(t: int) -> None:
        with client() as own:
            register(own, f"load{t}")
            for i in range(per_thread):
                reply = own.post(
                    "/episode",
                    json={"worker_id": f"load{t}", "reward": rewards[(t, i)], "length": i + 1},
                    headers={"X-A3C-Seq": str(i + 1)},
                )
                assert reply.status_code == 200, reply.text

    def pusher(t: int) -> None:
        version = first_version
        with client() as own:
            register(own, f"push{t}")
            for i in range(25):
                headers = {**OCTET, "X-Worker-Id": f"push{t}", "X-Model-Version": str(version),
                           "X-A3C-Seq": str(i + 1)}
                reply = own.post("/gradients", content=grads, headers=headers)
                assert reply.status_code == 200, reply.text
                # The reply's weights include this push's update (and maybe newer ones).
                assert int(reply.headers["X-Model-Version"]) > version
                version = int(reply.headers["X-Model-Version"])
                with lock:
                    pushed.append(version)

    def incrementer(t: int) -> None:
        with client() as own:
            for i in range(25):
                n = (t + i) % 3  # 0: no body (add one); else {"data": n}
                kwargs: dict = {"json": {"data": n}} if n else {"headers": JSON}
                reply = own.post("/global_episode", **kwargs)
                assert reply.status_code == 200, reply.text
                with lock:
                    increments.append(reply.json()["data"])

    started = time.monotonic()
    run_all([(reporter, t) for t in range(threads)] + [(pusher, t) for t in range(4)]
            + [(incrementer, t) for t in range(4)])
    took = time.monotonic() - started
    s = c.get("/status").json()
    added = sum(max(1, (t + i) % 3) for t in range(4) for i in range(25))
    print(f"\n[load] {threads * per_thread + 200} requests from {threads + 8} clients at once "
          f"in {took:.1f} s; {threads * per_thread + added - s['global_episode']} episodes and "
          f"{100 - s['updates_applied']} updates lost")
    assert s["global_episode"] == threads * per_thread + added
    assert len(set(increments)) == 100, "two additions answered the same count"
    assert s["global_steps"] == threads * sum(range(1, per_thread + 1))
    assert s["best_score"] == max(rewards.values())
    assert s["queue_length"] == threads * per_thread and s["queue_dropped"] == 0
    assert s["updates_applied"] == 100 and s["model_version"] == first_version + 100
    assert max(pushed) == s["model_version"]
    assert s["model_version"] == first_version + 100
    for t in range(threads):
        w = registry(s)[f"load{t}"]
        assert (w["episodes"], w["steps"], w["last_seq"]) == (
            per_thread, sum(range(1, per_thread + 1)), per_thread)

    # The FIFO holds one moving average per report, each the fold of exactly one more reward.
    averages = [c.get("/queue").json()["data"] for _ in range(threads * per_thread)]
    assert c.get("/queue").json()["empty"] is True
    assert math.isclose(averages[-1], s["moving_average"], rel_tol=1e-9)
    recovered, previous = [], None
    for a in averages:
        r = a if previous is None else (a - 0.99 * previous) / 0.01
        recovered.append(round(r * 4) / 4)
        assert abs(r - recovered[-1]) < 1e-3, f"average {a} after {previous} is no single fold"
        previous = a
    assert sorted(recovered) == sorted(rewards.values())

    # The history holds every report once, in the order the master took them: folding it again
    # gives exactly the moving average and the mean of the last 100. POST /stop saves at once.
    assert c.post("/stop", json={}).status_code == 200
    rows = RunStore(run_dir(quiet)).read_episodes()
    assert sorted((r["worker_id"], r["reward"]) for r in rows) == sorted(
        (f"load{t}", reward) for (t, _), reward in rewards.items())
    average = None
    for r in rows:
        average = r["reward"] if average is None else 0.99 * average + 0.01 * r["reward"]
    assert average == s["moving_average"]
    assert sum(r["reward"] for r in rows[-100:]) / 100 == s["mean_return_100"]

    # Concurrent raises of /best_score: the highest wins.
    def raiser(t: int) -> None:
        with client() as own:
            for i in range(10):
                body = {"data": 10_000.0 + t * 10 + i, "worker_id": f"load{t}"}
                assert own.post("/best_score", json=body).status_code == 200

    run_all([(raiser, t) for t in range(8)])
    assert c.get("/best_score").json()["data"] == 10_000.0 + 7 * 10 + 9
