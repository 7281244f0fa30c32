"""Faults of the network and of the workers, on real processes: lost replies, and workers that
are slow, freeze or die. Each test prints the figure it measured (`pytest -s`).

They use the session cluster (tests/conftest.py), which the `cluster` fixture brings back up
after a test killed some of it."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from a3c_http.local.cluster import LocalCluster, ServiceProcess, free_port, wait_for
from a3c_http.testing.standin import StandInWorker
from tests.support.common import ENDLESS_RUN, SHORT_RUN, TOKEN, patient, registry
from tests.support.faultproxy import FaultProxy

pytestmark = pytest.mark.integration

# A 2 s heartbeat timeout finds dead workers fast; starting one may take longer on a busy machine.
FAST_FAILING_RUN = {**ENDLESS_RUN, "heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 2,
                    "start_timeout_s": 60}


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


def test_a_worker_with_the_masters_url_joins_a_running_run_and_leaves_on_sigterm(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Workers that join by themselves (worker/joiner.py) beside the ones the master started:
    one waits while no run runs, joins the run, trains in it, and on SIGTERM says it is done."""
    joiner = ServiceProcess(
        "worker.app:app",
        free_port(),
        tmp_path / "joiner.log",
        env={"A3C_MASTER_URL": cluster.master.url, "A3C_WORKER_NAME": "joiner-1"},
        token=TOKEN,
    )
    joiner.start()
    try:
        joiner.wait_healthy()
        wait_for(lambda: "joiner-1" in cluster.status()["waiting_workers"], 30,
                 "the worker to ask to join while no run runs")
        first, _ = start_fast_failing_run(cluster)

        def joined() -> dict | None:
            mine = [w for w in cluster.status()["workers"] if w["name"] == "joiner-1"]
            return mine[0] if mine and mine[0]["episodes"] > 0 else None

        record_ = wait_for(joined, 60, "the worker to join the run and report episodes")
        assert record_["origin"] == "joined" and record_["state"] == "running"
        assert cluster.worker_status(joiner)["worker_id"] == record_["worker_id"]
        joiner.signal(signal.SIGTERM)
        # uvicorn ends by raising the signal again, once its shutdown is done
        assert joiner.proc.wait(timeout=30) in (0, -signal.SIGTERM)
        left = wait_for(
            lambda: (s := cluster.status()) and [
                w for w in s["workers"] if w["name"] == "joiner-1" and w["state"] == "done"
            ],
            30,
            "the master to show the worker that left as done",
        )
        assert len(left) == 1
        assert record(cluster.status(), first.url)["state"] == "running"  # the run goes on
    finally:
        joiner.stop()
        cluster.stop_run()  # an endless run: the tests after this one may not stop it
