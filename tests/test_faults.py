"""Faults on real processes: lost replies, workers that freeze or die, a master that is killed or
stopped, and a master that stays away. Each test prints the figure it measured (`pytest -s`)."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from a3c_http.localcluster import LocalCluster, free_port
from a3c_http.store import RunStore
from master.state import VERSIONS_SKIPPED_AFTER_A_CRASH
from tests.faultproxy import FaultProxy
from tests.support import ENDLESS_RUN, SHORT_RUN, master_sees_every_worker_done, wait_for

pytestmark = pytest.mark.integration

# A 2 s heartbeat timeout finds dead workers fast; starting one may take longer on a busy machine.
STARTUP = {"start_timeout_s": 60}
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


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """Start a master and two workers on free loopback ports; every process ends afterwards."""
    clusters: list[LocalCluster] = []

    def make(**env: str) -> LocalCluster:
        cluster = LocalCluster(
            tmp_path / "run",
            tmp_path / "logs",
            workers=[("127.0.0.1", free_port()), ("127.0.0.1", free_port())],
            env={"A3C_PERSIST_INTERVAL_S": "1", **env},
        )
        clusters.append(cluster)
        return cluster.start()

    yield make
    for cluster in clusters:
        cluster.close()
        for p in cluster.processes:
            assert not p.running(), f"{p.app} on port {p.port} is still running"


def record(status: dict, url: str) -> dict:
    return next(w for w in status["workers"] if w["url"] == url)


def all_workers_done(cluster: LocalCluster) -> list[dict] | None:
    statuses = [cluster.worker_status(p) for p in cluster.workers]
    return statuses if all(s["state"] == "done" for s in statuses) else None


def stop_and_settle(cluster: LocalCluster) -> tuple[dict, list[dict]]:
    """POST /stop, wait until every worker and the master agree that it is over."""
    assert cluster.http.post(f"{cluster.master.url}/stop").status_code == 200
    workers = wait_for(lambda: all_workers_done(cluster), 60, "the workers to stop")
    status = wait_for(
        lambda: master_sees_every_worker_done(cluster.status),
        30,
        "the master to see every worker done",
    )
    return status, workers


def assert_counts_add_up(status: dict, workers: list[dict]) -> None:
    """What each worker believes it reported is exactly what the master counted."""
    by_id = {w["worker_id"]: w for w in status["workers"]}
    for w in workers:
        assert by_id[w["worker_id"]]["episodes"] == w["episodes"], w["worker_id"]
        assert by_id[w["worker_id"]]["steps"] == w["steps"], w["worker_id"]
    assert sum(w["episodes"] for w in workers) == status["global_episode"]
    assert sum(w["steps"] for w in workers) == status["global_steps"]
    assert sum(w["updates"] for w in workers) == status["updates_applied"]


def test_lost_replies_are_retried_and_counted_once(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """The workers reach the master through a proxy that throws away 1 reply in 10 after the
    master has acted on the request: every retry must be recognised, none counted twice."""
    cluster = make_cluster()
    proxy = FaultProxy(cluster.master.port, drop_reply_p=0.1, seed=1).start()
    try:
        reply = cluster.train(**{**SHORT_RUN, "max_episodes": 60}, master_url=proxy.url)
        assert reply.status_code == 202, reply.text
        wait_for(lambda: cluster.status()["state"] == "finished", 120, "the run to finish")
        workers = wait_for(lambda: all_workers_done(cluster), 60, "the workers to be done")
        status = wait_for(
            lambda: master_sees_every_worker_done(cluster.status),
            60,
            "the master to see every worker done",
        )
    finally:
        proxy.close()
    duplicates = sum(w["duplicates"] for w in status["workers"])
    retries = sum(w["http_retries"] for w in workers)
    print(
        f"\n[lost replies] {proxy.replies + proxy.dropped} replies, {proxy.dropped} dropped, "
        f"{retries} retries, {duplicates} recognised as retries; "
        f"{status['global_episode']} episodes and {status['updates_applied']} updates counted, "
        f"0 lost or doubled"
    )
    assert proxy.dropped > 0 and retries > 0
    assert duplicates > 0, "no retry of a request the master had taken: the test proved nothing"
    assert_counts_add_up(status, workers)
    assert status["global_episode"] >= 60


def start_fast_failing_run(make_cluster: Callable[..., LocalCluster]) -> LocalCluster:
    """A cluster whose endless run marks a silent worker lost after 2 s, once both train."""
    cluster = make_cluster()
    run = {**ENDLESS_RUN, "heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 2, **STARTUP}
    assert cluster.train(**run).status_code == 202
    wait_for(
        lambda: all(w["episodes"] > 0 for w in cluster.status()["workers"]),
        60,
        "both workers to report episodes",
    )
    return cluster


def test_a_frozen_worker_is_lost_then_folded_back_in_once(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = start_fast_failing_run(make_cluster)
    frozen, other = cluster.workers
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
    status, workers = stop_and_settle(cluster)
    print(f"\n[frozen worker] marked lost {seconds_to_lost:.1f} s after SIGSTOP (timeout 2 s)")
    # Not before the timeout: counted from its last message, which came before the SIGSTOP.
    silent = float(re.match(r"no message for ([\d.]+) s", record(lost, frozen.url)["error"])[1])
    assert silent >= 2.0  # "no message for 2.0 s" is more than 2 s, rounded
    assert_counts_add_up(status, workers)


def test_killed_workers_are_lost_and_the_run_ends_without_them(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = start_fast_failing_run(make_cluster)
    first, second = cluster.workers
    first.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    status = wait_for(
        lambda: record(s := cluster.status(), first.url)["state"] == "lost" and s,
        60,
        "the master to mark the killed worker lost",
    )
    seconds_to_lost = time.monotonic() - killed_at
    assert status["state"] == "running"
    assert "no message for" in record(status, first.url)["error"]
    wait_for(
        lambda: cluster.status()["global_episode"] >= status["global_episode"] + 10,
        60,
        "the run to go on with the other worker",
    )
    second.signal(signal.SIGKILL)
    final = wait_for(
        lambda: (s := cluster.status())["state"] == "finished" and s,
        60,
        "the run to end once no worker is left",
    )
    print(f"\n[killed worker] marked lost {seconds_to_lost:.1f} s after SIGKILL (timeout 2 s)")
    assert final["finish_reason"] == "no worker is running any more"
    assert {w["state"] for w in final["workers"]} == {"lost"}


def test_a_killed_master_resumes_from_its_last_save_and_the_workers_go_on(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    interval = 1.0
    cluster = make_cluster(A3C_PERSIST_INTERVAL_S=str(interval))
    assert cluster.train(**{**ENDLESS_RUN, "heartbeat_timeout_s": 30}).status_code == 202
    wait_for(lambda: cluster.status()["global_episode"] >= 30, 60, "some episodes")
    seen = cluster.status()
    seen_at = time.monotonic()
    # Let more than one persist interval pass while the run goes on, then kill.
    wait_for(
        lambda: (
            time.monotonic() - seen_at > interval + 2.0
            and cluster.status()["global_episode"] > seen["global_episode"]
        ),
        60,
        "the run to go on past a persist interval",
    )
    last = cluster.status()
    cluster.master.signal(signal.SIGKILL)
    killed_at = time.time()
    cluster.master.proc.wait(timeout=10)
    saved = RunStore(cluster.run_dir).load()
    persisted = saved.state

    # First on another port, where the workers cannot reach it: exactly the last saved state.
    master = cluster.master
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
    # The save it resumed from is no older than the persist interval (plus slack for a busy
    # machine): it holds at least what a status read long before the kill showed.
    assert restored["global_episode"] >= seen["global_episode"]
    rows = RunStore(cluster.run_dir).read_episodes()
    assert [r["global_episode"] for r in rows] == list(range(1, restored["global_episode"] + 1))
    # SIGTERM persists and ends cleanly (uvicorn re-raises SIGTERM after its graceful shutdown).
    assert master.stop() in (0, -signal.SIGTERM)

    # Back on its own port: the workers, which kept retrying, continue the same run.
    master.port = port
    master.start().wait_healthy()
    wait_for(
        lambda: cluster.status()["global_episode"] >= restored["global_episode"] + 20,
        90,
        "the workers to continue the run",
    )
    again = cluster.status()
    assert again["run_id"] == last["run_id"] and again["state"] == "running"
    for p in cluster.workers:
        w = cluster.worker_status(p)
        assert w["state"] == "running" and w["run_id"] == last["run_id"], w
        assert w["http_retries"] > 0, w
    lost = last["global_episode"] - restored["global_episode"]
    print(
        f"\n[killed master] {lost} of {last['global_episode']} episodes lost; the save was "
        f"{killed_at - persisted['saved_at']:.1f} s old at the kill (A3C_PERSIST_INTERVAL_S=1)"
    )
    stop_and_settle(cluster)


def test_a_master_away_past_the_deadline_leaves_its_workers_failed_and_ready(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster(A3C_MASTER_RETRY_S="3")
    assert cluster.train(**ENDLESS_RUN).status_code == 202
    wait_for(lambda: cluster.status()["global_episode"] >= 10, 60, "some episodes")
    cluster.master.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    cluster.master.proc.wait(timeout=10)

    def all_failed() -> list[dict] | None:
        statuses = [cluster.worker_status(p) for p in cluster.workers]
        return statuses if all(s["state"] == "failed" for s in statuses) else None

    statuses = wait_for(all_failed, 60, "the workers to give up")
    seconds = time.monotonic() - killed_at
    print(f"\n[master away] workers gave up {seconds:.1f} s after the kill (A3C_MASTER_RETRY_S=3)")
    for s in statuses:
        assert "unreachable" in s["error"] and "A3C_MASTER_RETRY_S=3" in s["error"], s
    # They still serve, and take the next run of a master that is back.
    cluster.master.start().wait_healthy()
    assert cluster.status()["state"] == "running"  # resumed; it cannot know they gave up
    assert cluster.http.post(f"{cluster.master.url}/stop").status_code == 200
    reply = cluster.train(**SHORT_RUN)
    assert reply.status_code == 202 and all(w["started"] for w in reply.json()["data"]["workers"])
    wait_for(lambda: cluster.status()["state"] == "finished", 120, "the next run to finish")


def test_sigterm_and_stop_persist_everything(make_cluster: Callable[..., LocalCluster]) -> None:
    """With no periodic save for an hour, only SIGTERM's and POST /stop's own saves can explain
    a restart that finds everything."""
    cluster = make_cluster(A3C_PERSIST_INTERVAL_S="3600")
    run = {**ENDLESS_RUN, "heartbeat_timeout_s": 600}
    assert cluster.train(**run).status_code == 202
    wait_for(lambda: cluster.status()["global_episode"] >= 20, 60, "some episodes")
    for p in cluster.workers:  # freeze the counters: nobody reports any more
        p.signal(signal.SIGKILL)
        p.proc.wait(timeout=10)
    before = cluster.status()
    weights = cluster.http.get(f"{cluster.master.url}/global_model_weights").content

    assert cluster.master.stop() in (0, -signal.SIGTERM)
    cluster.master.start().wait_healthy()
    after = cluster.status()
    for key in (*COUNTERS, "state", "queue_dropped", "updates_rejected", "config"):
        assert after[key] == before[key], key
    assert cluster.http.get(f"{cluster.master.url}/global_model_weights").content == weights

    stopped = cluster.http.post(f"{cluster.master.url}/stop").json()["data"]
    assert stopped["stopped"] is True
    cluster.master.signal(signal.SIGKILL)  # no shutdown save this time
    cluster.master.proc.wait(timeout=10)
    cluster.master.start().wait_healthy()
    final = cluster.status()
    assert final["state"] == "finished" and final["finish_reason"] == "stopped by POST /stop"
    for key in COUNTERS:
        assert final[key] == before[key], key
