"""`POST /experience` (ppo and impala runs) through the master's HTTP layer: a rollout is checked,
counted and queued for the real learner process, a retry is taken once, what does not fit is
refused with nothing counted, and the reply brings newer weights (docs/http-api.md)."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load as st_load

from a3c_http.algos.learner import expected_tensors
from a3c_http.algos.registry import model_for, train_config
from a3c_http.local.cluster import wait_for
from a3c_http.wire.named_tensors import encode_tensors
from master import learner_runs
from master.learning import learner_needs
from master.learning.learner_loop import PeerGone, holding
from tests.support.log_capture import CapturedEvents
from tests.support.master_api import OCTET, gradients_like, push_gradients, start_run, status
from tests.support.master_api import _clean_env as _clean_env
from tests.support.master_api import client as client
from tests.support.master_api import launched as launched

PPO = {"algo": "ppo", "num_envs": 2, "t_max": 8}


def rollout(**overrides: Any) -> dict[str, torch.Tensor]:
    """A rollout of a PPO CartPole run of PPO's shapes: every step valid, log-probabilities of a
    uniform policy."""
    cfg = train_config(**{**PPO, **overrides})
    tensors = {
        name: torch.zeros(e.shape, dtype=e.dtypes[0])
        for name, e in expected_tensors(cfg, model_for(cfg), ("log_probs",)).items()
    }
    tensors["valid"][:] = True
    tensors["log_probs"][:] = -0.69
    tensors["rewards"][:] = 1.0
    return tensors


def push(
    c: TestClient,
    tensors: dict[str, torch.Tensor],
    version: int,
    worker_id: str = "w1",
    seq: int | None = None,
    episodes: list | None = None,
):
    report = {"episodes": episodes or [], "stats": None}
    headers = {**OCTET, "X-Worker-Id": worker_id, "X-Model-Version": str(version)}
    if seq is not None:
        headers["X-A3C-Seq"] = str(seq)
    body = encode_tensors(tensors, {"a3c": json.dumps(report)})
    return c.post("/experience", content=body, headers=headers)


def learner(c: TestClient) -> dict[str, Any]:
    return status(c)["learner"]


def test_rollouts_reach_the_learner_and_the_reply_brings_newer_weights(
    client: TestClient, launched: list
) -> None:
    start_run(client, **PPO, queue_size=1)
    version = status(client)["model_version"]
    first = push(client, rollout(), version, episodes=[[12.0, 12]])
    assert first.status_code == 204, first.text
    assert int(first.headers["X-Model-Version"]) == version
    assert first.headers["X-A3C-Global-Episode"] == "1"
    wait_for(lambda: learner(client)["updates"] >= 1, 60, "the learner's first update")
    seen = status(client)
    assert seen["model_version"] == version + 1
    assert seen["learner"]["device"] == "cpu"
    assert {"train/clip_fraction", "train/approx_kl"} <= set(seen["learner"]["metrics"])
    # It forked from the master's fork server (torch imported there once), whose environment
    # keeps its OpenMP threads spinning (learner_needs.child_context).
    pid = seen["learner"]["pid"]
    policy = os.environ.get("OMP_WAIT_POLICY", "ACTIVE")  # a policy of the environment's is kept
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert f"OMP_WAIT_POLICY={policy}".encode() in environ
    parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    assert b"forkserver" in Path(f"/proc/{parent}/cmdline").read_bytes()
    newer = push(client, rollout(), version)
    assert newer.status_code == 200, newer.text
    assert int(newer.headers["X-Model-Version"]) >= version + 1
    assert set(st_load(newer.content)) == set(model_for(train_config(**PPO)).state_dict())


def test_workers_that_wait_for_each_reply_get_the_update_their_rollouts_made(
    client: TestClient, launched: list
) -> None:
    """max_in_flight 0 (synchronous PPO): a push that does not complete the learner's batch is
    held until the update that takes it is published, so both workers act on with its weights."""
    start_run(client, **PPO, queue_size=2, max_in_flight=0, sync_timeout_s=20)
    for worker_id in ("w1", "w2"):  # both running: a batch can fill
        r = client.post("/heartbeat", json={"worker_id": worker_id})
        assert r.status_code == 200, r.text
    version = status(client)["model_version"]
    replies: dict[str, Any] = {}
    first = threading.Thread(target=lambda: replies.update(w1=push(client, rollout(), version)))
    first.start()
    try:
        wait_for(lambda: learner(client)["queued"] == 1, 30, "w1's rollout in the queue")
        assert first.is_alive()  # no update without w2's rollout: its reply is held
        second = push(client, rollout(), version, worker_id="w2")
    finally:
        first.join(60)
    for reply in (replies["w1"], second):
        assert reply.status_code == 200, reply.text
        assert int(reply.headers["X-Model-Version"]) == version + 1


def test_a_retry_is_taken_once(client: TestClient, launched: list) -> None:
    start_run(client, **PPO, queue_size=2)  # one rollout waits for a second one
    version = status(client)["model_version"]
    assert push(client, rollout(), version, seq=7, episodes=[[10.0, 10]]).status_code == 204
    again = push(client, rollout(), version, seq=7, episodes=[[10.0, 10]])
    assert again.status_code == 204
    assert again.headers["X-A3C-Duplicate"] == "1"
    s = status(client)
    assert s["global_episode"] == 1
    assert s["learner"]["queued"] == 1


def _missing(t: dict) -> None:
    t.pop("obs")


def _wrong_shape(t: dict) -> None:
    t["rewards"] = t["rewards"][:, :1]


def _non_finite(t: dict) -> None:
    t["log_probs"][0, 0] = float("inf")


def _extreme_reward(t: dict[str, torch.Tensor]) -> None:
    t["rewards"][0, 0] = 3e38  # finite, and its square in a loss is not


@pytest.mark.parametrize(
    ("spoil", "worker_id", "version_delta", "code", "words"),
    [
        (_missing, "w1", 0, 422, "missing tensors ['obs']"),
        (_wrong_shape, "w1", 0, 422, "'rewards' has shape [8, 1], expected [8, 2]"),
        (_non_finite, "w1", 0, 422, "'log_probs' holds NaN or infinite values"),
        (_extreme_reward, "w1", 0, 422, "'rewards' holds 3e+38 at [0, 0], outside the rewards"),
        (None, "w1", 5, 422, "newer than the master's weights"),
        (None, "nobody", 0, 409, "nobody"),
    ],
    ids=["missing", "shape", "non-finite", "extreme", "future-version", "unregistered"],
)
def test_what_does_not_fit_is_refused_and_nothing_counted(
    client: TestClient, launched: list, spoil, worker_id: str, version_delta: int, code: int,
    words: str,
) -> None:  # fmt: skip
    start_run(client, **PPO, queue_size=2)
    before = status(client)
    tensors = rollout()
    if spoil is not None:
        spoil(tensors)
    r = push(client, tensors, before["model_version"] + version_delta, worker_id, seq=1,
             episodes=[[10.0, 10]])  # fmt: skip
    assert r.status_code == code, r.text
    assert words in r.json()["detail"]
    after = status(client)
    assert after["global_episode"] == before["global_episode"] == 0
    assert after["learner"]["queued"] == 0
    # A retry of a refused push is judged afresh: once it fits, it is taken.
    if worker_id == "w1" and version_delta == 0:
        fixed = push(client, rollout(), before["model_version"], seq=1, episodes=[[10.0, 10]])
        assert fixed.status_code == 204 and "X-A3C-Duplicate" not in fixed.headers


def test_an_update_of_extreme_values_is_undone_and_leaves_status_readable(
    client: TestClient, launched: list
) -> None:
    """Behaviour log-probabilities of -3e38 pass every check (finite, at most 0) and make PPO's
    probability ratios, and so its policy loss, infinite: its steps are undone and counted, the
    figures that are not finite left out of /status (JSON has no infinity), and the run goes on."""
    start_run(client, **PPO, queue_size=1, n_epochs=1, batch_size=16)
    version = status(client)["model_version"]
    extreme = rollout()
    extreme["log_probs"][:] = -3e38
    assert push(client, extreme, version).status_code == 204
    wait_for(lambda: learner(client)["updates"] == 1, 60, "the learner's update")
    seen = status(client)  # a 200: nothing infinite in it
    assert seen["state"] == "running" and seen["learner"]["nonfinite_steps"] >= 1
    assert "train/policy_gradient_loss" not in seen["learner"]["metrics"]
    assert "train/clip_range" in seen["learner"]["metrics"]


def test_a_failed_learner_starts_again_from_the_newest_weights_until_it_fails_in_a_row(
    client: TestClient, launched: list, monkeypatch: pytest.MonkeyPatch,
    captured_events: CapturedEvents,
) -> None:  # fmt: skip
    """A learner process that dies is started again from the version it last published, and the
    run learns on from there; only failures with no update between them end the run."""
    monkeypatch.setattr(learner_runs, "MAX_FAILURES_IN_A_ROW", 2)
    start_run(client, **PPO, queue_size=1)
    version = status(client)["model_version"]
    assert push(client, rollout(), version).status_code == 204
    wait_for(lambda: learner(client)["updates"] == 1, 60, "the learner's first update")

    def kill_learner() -> None:
        pid = learner(client)["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: learner(client)["pid"] not in (pid, None) or
                 status(client)["state"] != "running", 60, "the learner started again")  # fmt: skip

    kill_learner()
    again = learner(client)
    assert (again["restarts"], again["updates"]) == (1, 1)
    assert "exit code -9" in again["error"]
    restarted = captured_events.one("learner_restarted")
    assert f"started again from version {version + 1}" in restarted.message
    assert push(client, rollout(), version + 1).status_code == 204
    wait_for(lambda: learner(client)["updates"] == 2, 60, "the restarted learner's update")
    assert status(client)["model_version"] == version + 2  # on from the newest, not the start
    kill_learner()  # a failure after an update: started again
    kill_learner()  # a second in a row: the run ends
    ended = status(client)
    assert ended["state"] == "finished", ended["learner"]
    assert ended["finish_reason"].startswith("the learner failed 2 times in a row")
    assert ended["model_version"] == version + 2


def test_a_learner_run_takes_neither_gradients_nor_global_weights(
    client: TestClient, launched: list
) -> None:
    """The learner owns the weights: a gradient push or a worker's global weights would be lost
    at its next publication, so they are refused (409) and the weights stay."""
    start_run(client, **PPO)
    r = client.get("/global_model_weights")
    tensors, version = st_load(r.content), int(r.headers["X-Model-Version"])
    body = encode_tensors(gradients_like(tensors), None)
    refused = push_gradients(client, body, version)
    assert refused.status_code == 409 and "POST /experience" in refused.json()["detail"]
    put = client.post(
        "/local_model_weights", params={"worker_id": "w1", "temporary": "false"},
        content=encode_tensors(tensors, None), headers=OCTET,
    )  # fmt: skip
    assert put.status_code == 409 and "owns the global weights" in put.json()["detail"]
    assert client.get("/global_model_weights").content == r.content


def test_an_a3c_run_refuses_experience(client: TestClient, launched: list) -> None:
    start_run(client)
    r = push(client, rollout(), status(client)["model_version"])
    assert r.status_code == 409 and "POST /gradients" in r.json()["detail"]


def test_a_learner_whose_slots_do_not_fit_in_shared_memory_is_refused(
    client: TestClient, launched: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slots are in /dev/shm, where writing past its end kills the process (SIGBUS)
    instead of raising: POST /train measures first, with nothing started."""
    full = os.statvfs_result((4096, 4096, 1000, 0, 0, 100, 90, 90, 0, 255))  # no block free
    monkeypatch.setattr(learner_needs.os, "statvfs", lambda path: full)
    r = client.post("/train", json={"workers": ["127.0.0.1:9001"], **PPO})
    assert r.status_code == 422, r.text
    assert "/dev/shm on the master host has 0 MiB free" in r.json()["detail"]
    assert status(client)["state"] == "idle" and launched == []


def test_where_no_fork_server_starts_the_learner_is_spawned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_socket() -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(learner_needs.forkserver, "ensure_running", no_socket)
    assert learner_needs.child_context().get_start_method() == "spawn"


def _hold_for_ever(lock: Any, held: Any) -> None:
    lock.acquire()
    held.set()
    threading.Event().wait()  # until killed


def test_the_weights_lock_of_a_process_killed_holding_it_is_given_up_not_waited_for() -> None:
    """learner_loop.holding, which both ends of the shared weights use: a process killed while it
    holds the lock never releases it (a master killed so left its learner waiting for ever). The
    other waits while the holder lives, and raises PeerGone once it has ended."""
    context = multiprocessing.get_context("fork")
    lock, held = context.Lock(), context.Event()
    holder = context.Process(target=_hold_for_ever, args=(lock, held), daemon=True)
    holder.start()
    assert held.wait(30)
    seen: list[bool] = []

    def alive() -> bool:
        seen.append(holder.is_alive())
        if len(seen) == 3:
            os.kill(holder.pid, signal.SIGKILL)
            holder.join(30)
        return holder.is_alive()

    raised: list[BaseException] = []

    def wait() -> None:  # in a thread: a wait for ever fails the test instead of hanging it
        try:
            with holding(lock, alive, poll_s=0.01):
                pass
        except BaseException as exc:
            raised.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(30)
    assert not waiter.is_alive(), "still waiting for the lock of a killed holder"
    assert [type(e) for e in raised] == [PeerGone]
    assert seen[:3] == [True, True, True] and holder.exitcode == -signal.SIGKILL


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a CUDA GPU")
def test_a_device_the_master_host_lacks_is_refused(client: TestClient, launched: list) -> None:
    r = client.post("/train", json={"workers": ["127.0.0.1:9001"], **PPO, "device": "cuda"})
    assert r.status_code == 422 and "no CUDA GPU" in r.json()["detail"]
    assert status(client)["state"] == "idle"
