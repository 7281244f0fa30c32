"""Faults on real processes: lost replies, workers that are slow, freeze or die, a master that is
killed or stopped or stays away, and many clients at once. Each test prints the figure it
measured (`pytest -s`).

Most use the session cluster (tests/conftest.py), which the `cluster` fixture brings back up
after a test killed some of it. The persistence and load tests use a master of this module with
no periodic save, so that only SIGTERM's and POST /stop's own saves can explain what a restart
finds."""

from __future__ import annotations

import math
import os
import re
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

from a3c_http.localcluster import (
    LocalCluster,
    ServiceProcess,
    free_port,
    wait_for,
)
from a3c_http.standin import StandInWorker
from a3c_http.store import RunStore
from master.state import VERSIONS_SKIPPED_AFTER_A_CRASH
from tests.conftest import IMPATIENT, PATIENT
from tests.faultproxy import FaultProxy
from tests.support import (
    AUTH,
    ENDLESS_RUN,
    OCTET,
    SHORT_RUN,
    STAND_IN_RUN,
    TOKEN,
    registry,
    snapshot,
)

pytestmark = pytest.mark.integration

# A 2 s heartbeat timeout finds dead workers fast; starting one may take longer on a busy machine.
FAST_FAILING_RUN = {**ENDLESS_RUN, "heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 2,
                    "start_timeout_s": 60}
COUNTERS = (
    "run_id",
    "global_episode",
    "global_steps",
    "best_score",
    "moving_average",
    "mean_return_100",
    "model_version",
    "updates_applied",
    "queue_length",
)


def patient(cluster: LocalCluster) -> list[ServiceProcess]:
    return [cluster.workers[i] for i in PATIENT]


def record(status: dict, url: str) -> dict:
    return next(w for w in status["workers"] if w["url"] == url)


def silence(record: dict) -> float:
    """The silence a lost worker's error reports ("no message for 2.1 s ...")."""
    found = re.match(r"no message for ([\d.]+) s", record["error"] or "")
    assert found, record
    return float(found[1])


def assert_counts_add_up(status: dict, statuses: list[dict]) -> None:
    """What each worker of the master's run believes it reported is exactly what the master
    counted."""
    workers = [w for w in statuses if w["run_id"] == status["run_id"]]
    assert workers, statuses
    by_id = registry(status)
    for w in workers:
        assert by_id[w["worker_id"]]["episodes"] == w["episodes"], w["worker_id"]
        assert by_id[w["worker_id"]]["steps"] == w["steps"], w["worker_id"]
    assert sum(w["episodes"] for w in workers) == status["global_episode"]
    assert sum(w["steps"] for w in workers) == status["global_steps"]
    assert sum(w["updates"] for w in workers) == status["updates_applied"]


# -- the network loses replies ------------------------------------------------------------------


def test_lost_replies_are_retried_and_counted_once(cluster: LocalCluster) -> None:
    """The workers reach the master through a proxy that throws away 1 reply in 10 after the
    master has acted on the request: every retry must be recognised, none counted twice."""
    workers = patient(cluster)
    proxy = FaultProxy(cluster.master.port, drop_reply_p=0.1, seed=1).start()
    try:
        run = {**SHORT_RUN, "max_episodes": 60}
        reply = cluster.train(**run, master_url=proxy.url, workers=[w.url for w in workers])
        assert reply.status_code == 202, reply.text
        cluster.wait_finished()
        status, statuses = cluster.wait_workers_settled(workers)
    finally:
        proxy.close()
    duplicates = sum(w["duplicates"] for w in status["workers"])
    retries = sum(w["http_retries"] for w in statuses)
    print(
        f"\n[lost replies] {proxy.replies + proxy.dropped} replies, {proxy.dropped} dropped, "
        f"{retries} retries, {duplicates} recognised as retries; "
        f"{status['global_episode']} episodes and {status['updates_applied']} updates counted"
    )
    assert proxy.dropped > 0 and retries > 0
    assert duplicates > 0, "no retry of a request the master had taken: the test proved nothing"
    assert_counts_add_up(status, statuses)
    assert status["global_episode"] >= 60


# -- workers that are slow, freeze or die --------------------------------------------------------


def test_a_slow_starting_worker_is_not_lost_before_it_accepted(cluster: LocalCluster) -> None:
    """start_timeout_s unset: the heartbeat timeout (2 s) applies from when a worker accepted
    POST /start_worker. This one is a slow host that answers 2.5 s later, then registers and
    beats every 0.3 s: it has never been silent for 2 s since it accepted, so it must be
    `running` all along and the run must not end for want of workers."""
    with StandInWorker(token=TOKEN, start_delay_s=2.5, beat_s=0.3) as slow:
        run = {"seed": 1, "max_steps": None, "heartbeat_interval_s": 0.5,
               "heartbeat_timeout_s": 2}
        t0 = time.monotonic()
        reply = cluster.train(**run, workers=[slow.url])
        answered = time.monotonic()
        assert reply.status_code == 202, reply.text
        assert reply.json()["data"]["workers"][0]["started"] is True, reply.text
        seen: list[tuple[float, str, str]] = []

        def watched_for_2_5_s() -> bool:
            s = cluster.status()
            w1 = registry(s)["w1"]
            seen.append((round(time.monotonic() - answered, 2), s["state"], w1["state"]))
            events = [(round(t - t0, 2), what, code) for t, what, code in slow.events]
            assert s["state"] == "running" and w1["state"] != "lost", (w1, seen, events)
            return time.monotonic() - answered >= 2.5

        wait_for(watched_for_2_5_s, 30, "2.5 s of watching the slow worker", interval_s=0.2)
        assert registry(cluster.status())["w1"]["state"] == "running", seen
    print(f"\n[slow worker] POST /train answered after {answered - t0:.2f} s; never lost")


def start_fast_failing_run(cluster: LocalCluster) -> list[ServiceProcess]:
    """An endless run on the patient workers that marks a silent one lost after 2 s, once both
    train."""
    workers = patient(cluster)
    assert cluster.train(**FAST_FAILING_RUN, workers=[w.url for w in workers]).status_code == 202
    wait_for(
        lambda: all(w["episodes"] > 0 for w in cluster.status()["workers"]),
        60,
        "both workers to report episodes",
    )
    return workers


def test_a_frozen_worker_is_lost_then_folded_back_in_once(cluster: LocalCluster) -> None:
    frozen, other = start_fast_failing_run(cluster)
    frozen.signal(signal.SIGSTOP)
    try:
        stopped_at = time.monotonic()
        lost = wait_for(
            lambda: record(s := cluster.status(), frozen.url)["state"] == "lost" and s,
            60,
            "the master to mark the frozen worker lost",
        )
        seconds_to_lost = time.monotonic() - stopped_at
        # The run goes on with the other worker.
        assert lost["state"] == "running"
        wait_for(
            lambda: cluster.status()["global_episode"] >= lost["global_episode"] + 10,
            60,
            "more episodes from the other worker",
        )
        assert record(cluster.status(), other.url)["state"] == "running"
    finally:
        frozen.signal(signal.SIGCONT)
    # Its late requests are taken: it is running again, and nothing it sent counts twice.
    wait_for(
        lambda: record(cluster.status(), frozen.url)["state"] == "running",
        60,
        "the thawed worker to be running again",
    )
    status, statuses = cluster.stop_run()
    print(f"\n[frozen worker] marked lost {seconds_to_lost:.1f} s after SIGSTOP (timeout 2 s)")
    # Not before the timeout: counted from its last message, which came before the SIGSTOP.
    assert silence(record(lost, frozen.url)) >= 2.0  # "2.0 s" is more than 2 s, rounded
    assert_counts_add_up(status, statuses)


def test_killed_workers_are_lost_and_the_run_ends_without_them(cluster: LocalCluster) -> None:
    first, second = start_fast_failing_run(cluster)
    first.kill()
    killed_at = time.monotonic()
    status = wait_for(
        lambda: record(s := cluster.status(), first.url)["state"] == "lost" and s,
        60,
        "the master to mark the killed worker lost",
    )
    seconds_to_lost = time.monotonic() - killed_at
    assert status["state"] == "running"
    assert silence(record(status, first.url)) >= 2.0, "marked lost before the timeout"
    wait_for(
        lambda: cluster.status()["global_episode"] >= status["global_episode"] + 10,
        60,
        "the run to go on with the other worker",
    )
    assert record(cluster.status(), second.url)["state"] == "running"
    second.kill()
    final = wait_for(
        lambda: (s := cluster.status())["state"] == "finished" and s,
        60,
        "the run to end once no worker is left",
    )
    print(f"\n[killed worker] marked lost {seconds_to_lost:.1f} s after SIGKILL (timeout 2 s)")
    assert final["finish_reason"] == "no worker is running any more"
    assert {w["state"] for w in final["workers"]} == {"lost"}


# -- a master that dies --------------------------------------------------------------------------


def test_a_killed_master_resumes_from_its_last_save_and_only_impatient_workers_give_up(
    cluster: LocalCluster,
) -> None:
    """kill -9 the master of a running run on all three workers. The impatient one
    (A3C_MASTER_RETRY_S=3) gives up, failed, once 3 s have passed; the others keep retrying. The
    master, restarted on its folder, has exactly its last save, no older than the persist
    interval (1 s); the patient workers continue the same run with it, and the impatient one
    takes the next run."""
    impatient = cluster.workers[IMPATIENT]
    run = {**ENDLESS_RUN, "heartbeat_timeout_s": 30}
    assert cluster.train(**run, workers=[w.url for w in cluster.workers]).status_code == 202
    wait_for(
        lambda: (s := cluster.status())["global_episode"] >= 30
        and {w["state"] for w in s["workers"]} == {"running"},
        60,
        "some episodes from all three workers",
    )
    seen = cluster.status()
    seen_at = time.monotonic()
    # Let more than one persist interval pass while the run goes on, then kill.
    wait_for(
        lambda: (
            time.monotonic() - seen_at > 1.0 + 2.0
            and cluster.status()["global_episode"] > seen["global_episode"]
        ),
        60,
        "the run to go on past a persist interval",
    )
    last = cluster.status()
    master = cluster.master
    master.kill()
    killed_at, killed_wall = time.monotonic(), time.time()
    saved = RunStore(cluster.run_dir).load()
    persisted = saved.state

    # The impatient worker gives up once its deadline has passed, saying why.
    gave_up = wait_for(
        lambda: (w := cluster.worker_status(impatient))["state"] == "failed" and w,
        60,
        "the impatient worker to give up",
    )
    waited = time.monotonic() - killed_at
    assert waited >= 3.0 - 0.1, f"gave up {waited:.2f} s after the kill, before its 3 s"
    assert "unreachable" in gave_up["error"] and "A3C_MASTER_RETRY_S=3" in gave_up["error"]
    for p in patient(cluster):
        assert cluster.worker_status(p)["state"] in ("running", "stopping")

    # First on another port, where the workers cannot reach it: exactly the last saved state.
    port = master.port
    master.port = free_port()
    master.start().wait_healthy()
    restored = cluster.status()
    weights = cluster.http.get(f"{master.url}/global_model_weights")
    for key in COUNTERS:
        expected = persisted["stats"].get(key, persisted.get(key))
        if key == "model_version":  # the versions handed out after the save are skipped
            expected += VERSIONS_SKIPPED_AFTER_A_CRASH
        elif key == "queue_length":
            expected = len(saved.queue)
        elif key == "mean_return_100":
            window = persisted["stats"]["last100"]
            expected = sum(window) / len(window)
        assert restored[key] == expected, key
    assert weights.content == saved.weights
    assert saved.weights == (cluster.run_dir / "weights.safetensors").read_bytes()
    assert weights.headers["X-Model-Version"] == str(restored["model_version"])
    assert restored["state"] == "running" and restored["run_id"] == last["run_id"]
    assert {w["state"] for w in restored["workers"]} == {"running"}
    # Counters and registry are saved together: they agree.
    assert sum(w["episodes"] for w in restored["workers"]) == restored["global_episode"]
    assert sum(w["steps"] for w in restored["workers"]) == restored["global_steps"]
    # The save it resumed from is no older than the persist interval (plus slack for a busy
    # machine): it holds at least what a status read long before the kill showed.
    assert restored["global_episode"] >= seen["global_episode"]
    rows = RunStore(cluster.run_dir).read_episodes()
    assert [r["global_episode"] for r in rows] == list(range(1, restored["global_episode"] + 1))
    # SIGTERM persists and ends cleanly (uvicorn re-raises SIGTERM after its graceful shutdown).
    assert master.stop() in (0, -signal.SIGTERM)

    # Back on its own port: the patient workers, which kept retrying, continue the same run.
    master.port = port
    master.start().wait_healthy()
    wait_for(
        lambda: cluster.status()["global_episode"] >= restored["global_episode"] + 20,
        90,
        "the workers to continue the run",
    )
    again = cluster.status()
    assert again["run_id"] == last["run_id"] and again["state"] == "running"
    for p in patient(cluster):
        w = cluster.worker_status(p)
        assert w["state"] == "running" and w["run_id"] == last["run_id"], w
        assert w["http_retries"] > 0, w
    lost = last["global_episode"] - restored["global_episode"]
    print(
        f"\n[killed master] {lost} of {last['global_episode']} episodes lost; the save was "
        f"{killed_wall - persisted['saved_at']:.1f} s old at the kill (A3C_PERSIST_INTERVAL_S=1);"
        f" the impatient worker gave up after {waited:.1f} s (A3C_MASTER_RETRY_S=3)"
    )
    # The worker that gave up still serves: it takes the next run.
    cluster.stop_run()
    reply = cluster.train(**{**SHORT_RUN, "max_episodes": 10}, workers=[impatient.url])
    assert reply.status_code == 202 and reply.json()["data"]["workers"][0]["started"], reply.text
    assert cluster.wait_finished()["finish_reason"].startswith("max_episodes")


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
        c.post("/stop")
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
    grads = st_save({k: torch.full_like(v, 0.01) for k, v in good.items()})
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
    data = c.post("/stop").json()["data"]
    assert data["stopped"] is True and data["state"] == "finished" and data["run_id"] == run_id
    stopped = snapshot(c)
    quiet.kill()
    quiet.start().wait_healthy(120)
    assert snapshot(c) == stopped, "POST /stop did not persist"
    final = c.get("/status").json()
    assert final["finish_reason"] == "stopped by POST /stop"
    assert c.post("/stop").json()["data"]["stopped"] is False


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

    def reporter(t: int) -> None:
        with client() as own:
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
                reply = own.post("/global_episode", json={"data": n} if n else None)
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
    assert c.post("/stop").status_code == 200
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
