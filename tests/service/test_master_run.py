"""A run's life through the master's API, in-process (TestClient): POST /train (its workers,
master_url, seed and hidden_sizes checked before anything starts), POST /stop, and every field
of GET /status."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import save as st_save

from a3c_http.algos.registry import CONFIGS
from a3c_http.local.cluster import free_port
from a3c_http.models.actor_critic import build_model
from a3c_http.wire import tensors as wire
from master.api import run as routes_run
from tests.support.master_api import (
    TRAIN,
    WORKERS,
    episode,
    gradients_like,
    make_settings,
    master,
    push_gradients,
    start_run,
    status,
    weights,
)
from tests.support.master_api import _clean_env as _clean_env
from tests.support.master_api import client as client
from tests.support.master_api import launched as launched
from tests.support.master_api import running as running

STATUS_FIELDS = {
    "state",
    "run_id",
    "env_id",
    "global_episode",
    "global_steps",
    "best_score",
    "moving_average",
    "mean_return_100",
    "solved",
    "model_version",
    "updates_applied",
    "updates_rejected",
    "queue_length",
    "queue_dropped",
    "elapsed_s",
    "config",
    "workers",
}
WORKER_FIELDS = {"worker_id", "url", "state", "last_seen_s", "episodes", "steps"}


def test_status_idle_has_every_field(client: TestClient) -> None:
    s = status(client)
    assert set(s) >= STATUS_FIELDS
    assert s["state"] == "idle"
    assert s["run_id"] is None
    assert s["global_episode"] == 0 and s["global_steps"] == 0
    assert s["model_version"] == 0 and s["workers"] == []
    assert s["solved"] is False


def test_train_with_every_worker_down_is_503_naming_each_and_the_run_finishes(
    client: TestClient,
) -> None:
    port = free_port()
    r = client.post("/train", json={**TRAIN, "workers": [f"127.0.0.1:{port}"]})
    assert r.status_code == 503, r.text
    detail = r.json()["detail"]
    assert detail.startswith("no worker could be started"), detail
    assert f"w1 at http://127.0.0.1:{port}: cannot reach the worker" in detail
    assert "Start each worker that did not answer" in detail and "mend" not in detail
    # Scripts still read the run and each worker's result, as from a 202.
    data = r.json()["data"]
    assert data["run_id"]
    assert len(data["workers"]) == 1
    worker = data["workers"][0]
    assert worker["url"] == f"http://127.0.0.1:{port}"
    assert worker["started"] is False
    assert worker["error"]
    s = status(client)
    assert s["state"] == "finished"
    assert s["run_id"] == data["run_id"]
    assert "no worker could be started" in s["finish_reason"]
    assert s["workers"][0]["state"] == "failed"
    assert client.get("/workers_status").json()["data"]["done"] is True


def test_train_starts_a_run(running: TestClient, launched: list) -> None:
    s = status(running)
    assert set(s) >= STATUS_FIELDS
    assert s["state"] == "running"
    assert s["env_id"] == "CartPole-v1"
    assert s["config"]["seed"] == 1
    assert s["config"]["target_return"] == 475.0  # resolved from the env's reward_threshold
    assert s["model_version"] == 0
    assert [w["state"] for w in s["workers"]] == ["starting", "starting"]
    for w in s["workers"]:
        assert set(w) >= WORKER_FIELDS
    assert [w["url"] for w in s["workers"]] == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    (call,) = launched
    assert call["master_url"] == "http://127.0.0.1:33333"
    assert list(call["workers"].values()) == [w["url"] for w in s["workers"]]
    assert call["run_id"] == s["run_id"]


def test_train_reads_the_workers_file(tmp_path: Path, launched: list) -> None:
    settings = make_settings(tmp_path)
    settings.workers_file.write_text(
        "# the cluster\n\n127.0.0.1:9001  # first\nhttp://127.0.0.1:9002\n   \n"
    )
    with master(settings) as c:
        r = c.post("/train", json={"master_url": "http://127.0.0.1:33333"})
        assert r.status_code == 202, r.text
        urls = [w["url"] for w in r.json()["data"]["workers"]]
        assert urls == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
        assert list(launched[0]["workers"].values()) == urls


def test_train_without_workers_file_names_it(client: TestClient, tmp_path: Path) -> None:
    r = client.post("/train", json={"master_url": "http://127.0.0.1:33333"})
    assert 400 <= r.status_code < 500
    assert str(tmp_path / "workers.txt") in r.json()["detail"]
    assert status(client)["state"] == "idle"


def test_train_default_master_url_is_the_request_base_url(
    client: TestClient, launched: list
) -> None:
    r = client.post("/train", json={"workers": WORKERS})  # TestClient: http://testserver/
    assert r.status_code == 202, r.text
    assert r.json()["data"]["master_url"].startswith("http://testserver")


def test_train_sent_to_loopback_refuses_to_give_it_to_workers_elsewhere(
    tmp_path: Path, launched: list
) -> None:
    """A master bound to 0.0.0.0, POST /train sent to localhost: the workers on other hosts
    would get a URL that names themselves. Refused before anything starts; `master_url` or
    A3C_MASTER_URL say where the master is, and loopback workers may have the loopback URL."""
    remote = ["10.0.0.11:8001", "127.0.0.1:9001"]
    with master(make_settings(tmp_path)) as c:
        r = c.post("http://localhost:33333/train", json={"workers": remote})
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert detail.startswith(
            "the workers at http://10.0.0.11:8001 could not reach the master at "
            "http://localhost:33333"), detail
        assert '"master_url"' in detail and "A3C_MASTER_URL" in detail
        # 0.0.0.0, where a master bound to every interface can be reached, names their host too.
        r = c.post("http://0.0.0.0:33333/train", json={"workers": remote})
        assert r.status_code == 422 and "http://0.0.0.0:33333" in r.json()["detail"], r.text
        assert status(c)["state"] == "idle" and launched == []
        local = c.post("http://127.0.0.1:33333/train", json={"workers": ["127.0.0.1:9001"]})
        assert local.status_code == 202, local.text
        assert c.post("/stop", json={}).status_code == 200
        given = {"workers": remote, "master_url": "http://10.0.0.10:33333"}
        assert c.post("http://localhost:33333/train", json=given).status_code == 202
    settings = make_settings(tmp_path / "2", master_url="http://10.0.0.10:33333")
    with master(settings) as c:
        assert c.post("http://[::1]:33333/train", json={"workers": remote}).status_code == 202
    assert [call["master_url"] for call in launched] == [
        "http://127.0.0.1:33333", "http://10.0.0.10:33333", "http://10.0.0.10:33333"]


@pytest.mark.parametrize("master_url", ["ftp://127.0.0.1:1", "nonsense"])
def test_train_bad_master_url_names_the_field(
    client: TestClient, launched: list, master_url: str
) -> None:
    r = client.post("/train", json={**TRAIN, "master_url": master_url})
    assert r.status_code == 422
    assert "master_url" in r.json()["detail"]


# The algorithms of continuous actions only: a run of theirs on an env with a Box of actions.
BOX_ONLY = {"sac": "Pendulum-v1", "apex_dpg": "Pendulum-v1"}


@pytest.mark.parametrize("algo", sorted(CONFIGS))  # every algorithm the registry has
def test_a_second_train_is_refused_and_leaves_the_running_run_alone(
    client: TestClient, launched: list, algo: str
) -> None:
    """409 naming the running run, which goes on as it was: its id, its weights and, for the
    algorithms with one, the same learner process still running."""
    run = {"algo": algo, "env_id": BOX_ONLY.get(algo, "CartPole-v1")}
    start_run(client, **run)
    before = status(client)
    r = client.post("/train", json={**TRAIN, **run})
    assert r.status_code == 409
    assert before["run_id"] in r.json()["detail"]
    after = status(client)
    keys = ("state", "run_id", "model_version", "global_episode", "learner")
    assert {k: after[k] for k in keys} == {k: before[k] for k in keys}
    if after["learner"] is not None:
        assert after["learner"]["running"] and after["learner"]["pid"] is not None


def test_train_refuses_a_seed_torch_cannot_take(client: TestClient, launched: list) -> None:
    r = client.post("/train", json={**TRAIN, "seed": 2**64})
    assert r.status_code == 422, r.text
    assert "seed" in r.json()["detail"] and "env_id" not in r.json()["detail"]
    assert launched == []
    assert status(client)["state"] == "idle"
    assert start_run(client, seed=2**64 - 1)["run_id"]  # the largest torch takes


def _encoded_size(hidden_sizes: list[int], wire_dtype: str = "float32") -> int:
    model = build_model("CartPole-v1", {}, hidden_sizes)
    layout = wire.Layout.of(model, wire_dtype)
    return len(layout.encode(torch.cat([p.reshape(-1) for p in model.parameters()])))


def test_train_refuses_hidden_sizes_whose_weights_exceed_the_body_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launched: list
) -> None:
    """Every push of such weights (or of their gradients) would get 413: refuse the run."""
    limit = 1024 * 1024
    monkeypatch.setenv("A3C_MAX_BODY_BYTES", str(limit))
    with master(make_settings(tmp_path)) as c:
        assert _encoded_size([1024, 1024]) > limit
        r = c.post("/train", json={**TRAIN, "hidden_sizes": [1024, 1024]})
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert "hidden_sizes" in detail and str(limit) in detail and "A3C_MAX_BODY_BYTES" in detail
        assert launched == []
        assert status(c)["state"] == "idle"


@pytest.mark.parametrize("wire_dtype", ["float32", "bfloat16"])
def test_the_body_limit_check_is_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launched: list, wire_dtype: str
) -> None:
    """The bodies of the run's wire_dtype must fit: bfloat16's are about half the size."""
    size = _encoded_size([64, 32], wire_dtype)
    monkeypatch.setenv("A3C_MAX_BODY_BYTES", str(size - 1))
    run = {**TRAIN, "hidden_sizes": [64, 32], "wire_dtype": wire_dtype}
    with master(make_settings(tmp_path)) as c:
        r = c.post("/train", json=run)
        assert r.status_code == 422, r.text
        assert f"{size} bytes on the wire ({wire_dtype})" in r.json()["detail"]
    monkeypatch.setenv("A3C_MAX_BODY_BYTES", str(size))
    with master(make_settings(tmp_path / "2")) as c:
        start_run(c, hidden_sizes=[64, 32], wire_dtype=wire_dtype)
        # Weights of exactly the limit go through, as will their gradients.
        tensors, version, body = weights(c)
        assert len(body) == size
        r = push_gradients(c, st_save(gradients_like(tensors)), version)
        assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "workers",
    [
        ["ftp://127.0.0.1:9001"],
        ["127.0.0.1"],
        ["127.0.0.1:99999"],
        ["127.0.0.1:9001", "http://127.0.0.1:9001"],
    ],
)
def test_train_bad_workers_entry_is_422(client: TestClient, launched: list, workers) -> None:
    r = client.post("/train", json={**TRAIN, "workers": workers})
    assert r.status_code == 422, r.text
    assert "workers" in r.json()["detail"]
    assert launched == []
    assert status(client)["state"] == "idle"


def test_stop_finishes_the_run(running: TestClient) -> None:
    r = running.post("/stop", json={})
    assert r.status_code == 200
    assert r.json()["data"]["state"] == "finished"
    s = status(running)
    assert s["state"] == "finished"
    assert "stop" in s["finish_reason"]
    again = running.post("/stop", json={})
    assert again.status_code == 200
    assert again.json()["data"]["stopped"] is False
    assert status(running)["finish_reason"] == s["finish_reason"]


def test_stop_is_idempotent_when_nothing_runs(client: TestClient) -> None:
    r = client.post("/stop", json={})
    assert r.status_code == 200
    assert r.json()["data"] == {"run_id": None, "state": "idle", "stopped": False}
    assert status(client)["state"] == "idle"


def test_a_new_run_after_stop_starts_fresh(running: TestClient) -> None:
    first = status(running)["run_id"]
    episode(running, 5.0)
    tensors, version, _ = weights(running)
    assert push_gradients(running, wire.encode(gradients_like(tensors)), version).status_code == 200
    running.post("/stop", json={})
    second = start_run(running)["run_id"]
    assert second != first
    s = status(running)
    assert s["state"] == "running" and s["run_id"] == second
    assert s["global_episode"] == 0 and s["best_score"] is None
    # The fresh weights are a change of the global weights: the version goes on rising.
    assert s["model_version"] == version + 2 and s["updates_applied"] == 0


def test_train_whose_workers_answer_but_refuse_says_to_mend_what_they_said(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers that run but refuse the run (here: an environment module they cannot import) are
    not told to be started: the advice is to mend what they said."""
    refusal = "the worker answered 422: env_id: module 'my_envs' is not in A3C_ENV_MODULES"

    def refusing(state, workers, *args: object, **kwargs: object) -> list[dict]:
        return [{"url": u, "worker_id": w, "started": False, "error": refusal}
                for w, u in workers.items()]  # fmt: skip

    monkeypatch.setattr(routes_run, "launch", refusing)
    r = client.post("/train", json=TRAIN)
    assert r.status_code == 503, r.text
    detail = r.json()["detail"]
    assert refusal in detail and "The workers that answered are running: mend" in detail
    assert "Start each worker" not in detail


def test_train_says_how_the_run_will_end(client: TestClient, launched: list) -> None:
    r = client.post("/train", json={**TRAIN, "env_id": "Pendulum-v1", "preset": None})
    assert r.status_code == 202, r.text
    assert "Pendulum-v1 has no reward_threshold" in r.json()["data"]["ends"]
