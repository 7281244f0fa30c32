"""The master's HTTP API, in-process through TestClient, checked against /work/shared/API.md.

Runs that need workers use a fake `master.routes_run.launch` (no HTTP): the workers stay
`starting` and the tests play the worker side themselves. Runs started against a closed port
exercise the real launcher and finish with "no worker could be started".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.openapi.utils import get_openapi
from fastapi.testclient import TestClient
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from a3c_http import wire
from a3c_http.config import Settings, TrainConfig
from a3c_http.localcluster import free_port
from a3c_http.model import build_model
from master import routes_run
from master.app import create_app
from master.state import VERSIONS_SKIPPED_AFTER_A_CRASH, ClusterState, StateConflict
from tests.schema_checks import assert_bearer_everywhere_but_healthz, assert_errors_declared

LOOPBACK = ("127.0.0.1", 50000)
REMOTE = ("10.1.2.3", 5)
OCTET = {"content-type": "application/octet-stream"}
WORKERS = ["127.0.0.1:9001", "127.0.0.1:9002"]
TRAIN = {"workers": WORKERS, "master_url": "http://127.0.0.1:33333", "seed": 1}

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


# -- helpers ---------------------------------------------------------------------------------


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "run_dir": tmp_path / "run",
        "workers_file": tmp_path / "workers.txt",
    }
    values.update(overrides)
    return Settings(**values)


@contextmanager
def master(
    settings: Settings, client: tuple[str, int] = LOOPBACK, **kwargs: Any
) -> Iterator[TestClient]:
    with TestClient(create_app(settings), client=client, **kwargs) as c:
        yield c


def start_run(c: TestClient, **overrides: Any) -> dict[str, Any]:
    r = c.post("/train", json={**TRAIN, **overrides})
    assert r.status_code == 202, r.text
    return r.json()["data"]


def weights(c: TestClient) -> tuple[dict[str, torch.Tensor], int, bytes]:
    r = c.get("/global_model_weights")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/octet-stream")
    return st_load(r.content), int(r.headers["X-Model-Version"]), r.content


def push_gradients(c: TestClient, body: bytes, version: int, worker_id: str = "w1"):
    headers = {**OCTET, "X-Worker-Id": worker_id, "X-Model-Version": str(version)}
    return c.post("/gradients", content=body, headers=headers)


def ones_like(tensors: dict[str, torch.Tensor], value: float = 1.0) -> dict[str, torch.Tensor]:
    return {name: torch.full_like(t, value) for name, t in tensors.items()}


def episode(c: TestClient, reward: float, length: int = 10, worker_id: str = "w1"):
    r = c.post("/episode", json={"worker_id": worker_id, "reward": reward, "length": length})
    assert r.status_code == 200, r.text
    return r.json()["data"]


def status(c: TestClient) -> dict[str, Any]:
    r = c.get("/status")
    assert r.status_code == 200, r.text
    return r.json()


def raw_json(c: TestClient, path: str, text: str):
    return c.post(path, content=text.encode(), headers={"content-type": "application/json"})


def api_routes(c: TestClient) -> list[tuple[str, str]]:
    """Every (method, path) of the API but /healthz, from the app's OpenAPI schema."""
    paths = c.app.openapi()["paths"]
    return [
        (method.upper(), path)
        for path, operations in paths.items()
        if path != "/healthz"
        for method in operations
    ]


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("A3C_TOKEN", "A3C_MAX_BODY_BYTES", "A3C_MASTER_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with master(make_settings(tmp_path)) as c:
        yield c


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Replace the launcher: every worker 'starts' without HTTP. Returns the calls."""
    calls: list[dict[str, Any]] = []

    def fake_launch(state, workers, run_id, config, master_url, token, timeout_s=10.0):
        calls.append(
            {
                "workers": dict(workers),
                "run_id": run_id,
                "config": config,
                "master_url": master_url,
                "token": token,
            }
        )
        for wid in workers:
            state.worker_accepted(wid)
        return [
            {"url": url, "worker_id": wid, "started": True, "error": None}
            for wid, url in workers.items()
        ]

    monkeypatch.setattr(routes_run, "launch", fake_launch)
    return calls


@pytest.fixture
def running(client: TestClient, launched: list) -> TestClient:
    start_run(client)
    return client


# -- health and auth -------------------------------------------------------------------------


def test_healthz_needs_no_auth(tmp_path: Path) -> None:
    with master(make_settings(tmp_path, token="s3cret"), client=REMOTE) as c:
        r = c.get("/healthz")
        assert r.status_code == 200
        assert r.json() == {"status": "ok"}
    with master(make_settings(tmp_path), client=REMOTE) as c:
        assert c.get("/healthz").json() == {"status": "ok"}


def test_the_right_token_is_served_from_anywhere(tmp_path: Path) -> None:
    auth = {"Authorization": "Bearer s3cret"}
    with master(make_settings(tmp_path, token="s3cret"), client=REMOTE, headers=auth) as c:
        for method, path in api_routes(c):
            r = c.request(method, path)
            assert r.status_code not in (401, 403), (method, path, r.text)
        assert status(c)["state"] == "idle"
        assert c.get("/global_episode").json() == {"data": 1}  # the loop's POST counted
        assert c.post("/global_episode").json() == {"data": 2}


def test_without_token_remote_clients_get_403(tmp_path: Path) -> None:
    with master(make_settings(tmp_path), client=REMOTE) as c:
        for method, path in api_routes(c):
            r = c.request(method, path)
            assert r.status_code == 403, (method, path, r.text)
            assert "A3C_TOKEN" in r.json()["detail"]


def test_without_token_ipv6_loopback_is_served(tmp_path: Path) -> None:
    with master(make_settings(tmp_path), client=("::1", 5)) as c:
        assert c.get("/global_episode").status_code == 200


def test_malformed_json_without_token_is_401_not_422(tmp_path: Path) -> None:
    with master(make_settings(tmp_path, token="s3cret")) as c:
        r = raw_json(c, "/episode", "{not json")
        assert r.status_code == 401, r.text


# -- seed-compatible scalars -----------------------------------------------------------------


def test_best_score_only_rises(client: TestClient) -> None:
    assert client.get("/best_score").json() == {"data": None}
    r = client.post("/best_score", json={"data": 10.0, "worker_id": "w1"})
    assert r.status_code == 200
    assert r.json() == {"data": 10.0, "raised": True}
    assert client.post("/best_score", json={"data": 3.5}).json() == {"data": 10.0, "raised": False}
    assert client.post("/best_score", json={"data": 10.0}).json()["raised"] is False
    assert client.get("/best_score").json() == {"data": 10.0}
    assert client.post("/best_score", json={"data": 12.5}).json() == {"data": 12.5, "raised": True}
    assert client.get("/best_score").json()["data"] == 12.5
    assert status(client)["best_score"] == 12.5


@pytest.mark.parametrize(
    "body", [{}, {"data": "high"}, {"data": 1.0, "worker_id": "bad id!"}, {"data": None}]
)
def test_best_score_rejects_bad_bodies(client: TestClient, body: dict) -> None:
    r = client.post("/best_score", json=body)
    assert r.status_code == 422
    assert r.json()["detail"]
    assert client.get("/best_score").json()["data"] is None


def test_global_episode_counts(client: TestClient) -> None:
    assert client.get("/global_episode").json() == {"data": 0}
    assert client.post("/global_episode").json() == {"data": 1}
    assert client.post("/global_episode", json={"data": 5}).json() == {"data": 6}
    assert client.post("/global_episode", json={}).json() == {"data": 7}
    assert client.get("/global_episode").json() == {"data": 7}
    for bad in ({"data": 0}, {"data": -2}, {"data": "many"}):
        r = client.post("/global_episode", json=bad)
        assert r.status_code == 422, bad
        assert "data" in r.json()["detail"]
    assert client.get("/global_episode").json() == {"data": 7}
    assert status(client)["global_episode"] == 7


def test_global_moving_average_folds(client: TestClient) -> None:
    assert client.get("/global_moving_average").json() == {"data": None}
    assert client.post("/global_moving_average", json={"data": 10.0}).json() == {"data": 10.0}
    expected = 10.0
    for reward in (20.0, -5.0, 100.0):
        expected = 0.99 * expected + 0.01 * reward
        got = client.post("/global_moving_average", json={"data": reward}).json()["data"]
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert client.get("/global_moving_average").json()["data"] == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(10.84951, abs=1e-9)  # 10 -> 10.1 -> 9.949 -> 10.84951
    assert status(client)["moving_average"] == pytest.approx(expected, rel=1e-12)


def test_queue_is_fifo_and_empty_is_200(client: TestClient) -> None:
    assert client.get("/queue").json() == {"data": None, "empty": True}
    for i, value in enumerate((3.0, 1.0, 0.0, -2.5), start=1):
        r = client.post("/queue", json={"data": value})
        assert r.status_code == 200
        assert r.json()["data"]["length"] == i
    assert status(client)["queue_length"] == 4
    popped = [client.get("/queue").json() for _ in range(5)]
    assert popped == [
        {"data": 3.0, "empty": False},
        {"data": 1.0, "empty": False},
        {"data": 0.0, "empty": False},
        {"data": -2.5, "empty": False},
        {"data": None, "empty": True},
    ]


def test_create_queue_empties_it(client: TestClient) -> None:
    for value in (1.0, 2.0):
        client.post("/queue", json={"data": value})
    r = client.post("/create_queue")
    assert r.status_code == 200
    assert r.json()["data"]["length"] == 0
    assert status(client)["queue_length"] == 0
    assert client.get("/queue").json() == {"data": None, "empty": True}


def test_queue_is_bounded_and_counts_drops(tmp_path: Path) -> None:
    with master(make_settings(tmp_path, queue_max=3)) as c:
        for value in range(5):
            assert c.post("/queue", json={"data": float(value)}).json()["data"]["length"] <= 3
        s = status(c)
        assert s["queue_length"] == 3
        assert s["queue_dropped"] == 2
        assert [c.get("/queue").json()["data"] for _ in range(4)] == [2.0, 3.0, 4.0, None]


def test_a_fractional_queue_max_is_refused_or_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("A3C_QUEUE_MAX", "0.5")
    monkeypatch.setenv("A3C_RUN_DIR", str(tmp_path / "run"))
    try:
        settings = Settings.from_env()
    except ValueError as exc:  # refusing it at start-up, naming the variable, is fine too
        assert "A3C_QUEUE_MAX" in str(exc)
        return
    with TestClient(create_app(settings), client=LOOPBACK, raise_server_exceptions=False) as c:
        assert c.post("/queue", json={"data": 1.0}).status_code == 200


# -- /train, /stop, /status ------------------------------------------------------------------


def test_status_idle_has_every_field(client: TestClient) -> None:
    s = status(client)
    assert set(s) >= STATUS_FIELDS
    assert s["state"] == "idle"
    assert s["run_id"] is None
    assert s["global_episode"] == 0 and s["global_steps"] == 0
    assert s["model_version"] == 0 and s["workers"] == []
    assert s["solved"] is False


def test_train_with_unreachable_worker_finishes(client: TestClient) -> None:
    port = free_port()
    r = client.post("/train", json={**TRAIN, "workers": [f"127.0.0.1:{port}"]})
    assert r.status_code == 202, r.text
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


@pytest.mark.parametrize("master_url", ["ftp://127.0.0.1:1", "nonsense"])
def test_train_bad_master_url_names_the_field(
    client: TestClient, launched: list, master_url: str
) -> None:
    r = client.post("/train", json={**TRAIN, "master_url": master_url})
    assert r.status_code == 422
    assert "master_url" in r.json()["detail"]


def test_train_409_while_running(running: TestClient) -> None:
    run_id = status(running)["run_id"]
    r = running.post("/train", json=TRAIN)
    assert r.status_code == 409
    assert run_id in r.json()["detail"]
    assert status(running)["run_id"] == run_id


def test_train_refuses_a_seed_torch_cannot_take(client: TestClient, launched: list) -> None:
    r = client.post("/train", json={**TRAIN, "seed": 2**64})
    assert r.status_code == 422, r.text
    assert "seed" in r.json()["detail"] and "env_id" not in r.json()["detail"]
    assert launched == []
    assert status(client)["state"] == "idle"
    assert start_run(client, seed=2**64 - 1)["run_id"]  # the largest torch takes


def _encoded_size(hidden_sizes: list[int]) -> int:
    model = build_model("CartPole-v1", {}, hidden_sizes)
    return len(wire.Layout.of(model).encode(torch.cat([p.reshape(-1) for p in model.parameters()])))


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


def test_the_body_limit_check_is_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launched: list
) -> None:
    size = _encoded_size([64, 32])
    monkeypatch.setenv("A3C_MAX_BODY_BYTES", str(size - 1))
    with master(make_settings(tmp_path)) as c:
        r = c.post("/train", json={**TRAIN, "hidden_sizes": [64, 32]})
        assert r.status_code == 422, r.text
        assert f"{size} bytes" in r.json()["detail"]
    monkeypatch.setenv("A3C_MAX_BODY_BYTES", str(size))
    with master(make_settings(tmp_path / "2")) as c:
        start_run(c, hidden_sizes=[64, 32])
        # Weights of exactly the limit go through, as will their gradients.
        tensors, version, body = weights(c)
        assert len(body) == size
        r = push_gradients(c, st_save(ones_like(tensors, 0.001)), version)
        assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "workers",
    [
        ["ftp://127.0.0.1:9001"],
        ["127.0.0.1"],
        ["127.0.0.1:99999"],
        [],
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
    r = running.post("/stop")
    assert r.status_code == 200
    assert r.json()["data"]["state"] == "finished"
    s = status(running)
    assert s["state"] == "finished"
    assert "stop" in s["finish_reason"]
    again = running.post("/stop")
    assert again.status_code == 200
    assert again.json()["data"]["stopped"] is False
    assert status(running)["finish_reason"] == s["finish_reason"]


def test_stop_is_idempotent_when_nothing_runs(client: TestClient) -> None:
    r = client.post("/stop")
    assert r.status_code == 200
    assert r.json()["data"] == {"run_id": None, "state": "idle", "stopped": False}
    assert status(client)["state"] == "idle"


def test_a_new_run_after_stop_starts_fresh(running: TestClient) -> None:
    first = status(running)["run_id"]
    episode(running, 5.0)
    tensors, version, _ = weights(running)
    assert push_gradients(running, wire.encode(ones_like(tensors)), version).status_code == 200
    running.post("/stop")
    second = start_run(running)["run_id"]
    assert second != first
    s = status(running)
    assert s["state"] == "running" and s["run_id"] == second
    assert s["global_episode"] == 0 and s["best_score"] is None
    # The fresh weights are a change of the global weights: the version goes on rising.
    assert s["model_version"] == version + 2 and s["updates_applied"] == 0


# -- worker registry -------------------------------------------------------------------------


def test_worker_started_done_and_workers_status(running: TestClient) -> None:
    ws = running.get("/workers_status").json()["data"]
    assert ws["active"] == 2 and ws["done"] is False
    assert {w["worker_id"]: w["state"] for w in ws["workers"]} == {
        "w1": "starting",
        "w2": "starting",
    }

    r = running.post("/worker_started", json={"worker_id": "w1", "url": "http://10.0.0.1:8001"})
    assert r.status_code == 200
    assert r.json()["data"]["state"] == "running"
    ws = running.get("/workers_status").json()["data"]
    states = {w["worker_id"]: w for w in ws["workers"]}
    assert states["w1"]["state"] == "running"
    assert states["w1"]["url"] == "http://10.0.0.1:8001"
    assert ws["active"] == 2

    r = running.post("/worker_done", json={"worker_id": "w1"})
    assert r.status_code == 200
    assert r.json()["data"] == {"worker_id": "w1", "state": "done"}
    ws = running.get("/workers_status").json()["data"]
    assert ws["active"] == 1 and ws["done"] is False
    assert status(running)["state"] == "running"

    r = running.post("/worker_done", json={"worker_id": "w2", "error": "env exploded"})
    assert r.json()["data"]["state"] == "failed"
    ws = running.get("/workers_status").json()["data"]
    assert ws["active"] == 0 and ws["done"] is True
    w2 = next(w for w in ws["workers"] if w["worker_id"] == "w2")
    assert w2["state"] == "failed"
    assert w2["error"] == "env exploded"
    s = status(running)
    assert s["state"] == "finished"  # nobody is left to run it


def test_worker_started_without_a_run_registers_it(client: TestClient) -> None:
    # The seed's registry works on its own: register, see it active, mark it done.
    r = client.post("/worker_started", json={"worker_id": "w1", "url": "http://127.0.0.1:9"})
    assert r.status_code == 200
    data = client.get("/workers_status").json()["data"]
    assert data["active"] == 1 and data["done"] is False
    assert client.post("/worker_done", json={"worker_id": "w1"}).status_code == 200
    data = client.get("/workers_status").json()["data"]
    assert data["active"] == 0 and data["done"] is True
    assert status(client)["state"] == "idle"



def test_worker_started_of_another_run_is_409(running: TestClient) -> None:
    r = running.post("/worker_started", json={"worker_id": "w1", "run_id": "old-run"})
    assert r.status_code == 409
    assert "old-run" in r.json()["detail"]
    assert status(running)["workers"][0]["state"] == "starting"


@pytest.mark.parametrize("body", [{}, {"worker_id": ""}, {"worker_id": "a b"}])
def test_worker_registry_bodies_are_validated(running: TestClient, body: dict) -> None:
    assert running.post("/worker_started", json=body).status_code == 422
    assert running.post("/worker_done", json=body).status_code == 422
    assert running.get("/workers_status").json()["data"]["active"] == 2


def test_weights_after_the_run_do_not_revive_the_registry(client: TestClient) -> None:
    r = client.post("/train", json={**TRAIN, "workers": [f"127.0.0.1:{free_port()}"]})
    assert r.status_code == 202
    assert status(client)["state"] == "finished"
    _, _, body = weights(client)
    client.post("/local_model_weights?worker_id=ghost&temporary=true", content=body, headers=OCTET)
    ws = client.get("/workers_status").json()["data"]
    assert ws["active"] == 0 and ws["done"] is True


# -- heartbeat and episodes ------------------------------------------------------------------


def test_heartbeat_says_stop_after_post_stop(running: TestClient) -> None:
    r = running.post(
        "/heartbeat",
        json={
            "worker_id": "w1",
            "episodes": 3,
            "steps": 40,
            "steps_per_s": 100.0,
            "future_stat": "ignored",
        },
    )
    assert r.status_code == 200
    assert r.json() == {"data": {"stop": False}}
    w1 = next(w for w in status(running)["workers"] if w["worker_id"] == "w1")
    assert w1["state"] == "running"
    assert running.post("/stop").status_code == 200
    assert running.post("/heartbeat", json={"worker_id": "w1"}).json() == {"data": {"stop": True}}


def test_heartbeat_validation(running: TestClient) -> None:
    assert running.post("/heartbeat", json={}).status_code == 422
    assert running.post("/heartbeat", json={"worker_id": "w1", "steps": -1}).status_code == 422


def test_heartbeat_without_a_run_says_stop(client: TestClient) -> None:
    assert client.post("/heartbeat", json={"worker_id": "w1"}).json() == {"data": {"stop": True}}


def test_episode_folds_every_statistic(running: TestClient) -> None:
    rewards = [(10.0, 10), (4.0, 7), (25.0, 30)]
    expected_avg = None
    best = None
    for i, (reward, length) in enumerate(rewards, start=1):
        data = episode(running, reward, length, worker_id="w1")
        expected_avg = reward if expected_avg is None else 0.99 * expected_avg + 0.01 * reward
        improved = best is None or reward > best
        best = reward if improved else best
        assert set(data) >= {"global_episode", "moving_average", "best_score", "improved", "stop"}
        assert data["global_episode"] == i
        assert data["moving_average"] == pytest.approx(expected_avg, rel=1e-12)
        assert data["best_score"] == best
        assert data["improved"] is improved
        assert data["stop"] is False
    s = status(running)
    assert s["global_episode"] == 3
    assert s["global_steps"] == 47
    assert s["best_score"] == 25.0
    assert s["moving_average"] == pytest.approx(expected_avg, rel=1e-12)
    assert s["mean_return_100"] == pytest.approx(13.0)
    assert s["queue_length"] == 3
    w1 = next(w for w in s["workers"] if w["worker_id"] == "w1")
    assert (w1["episodes"], w1["steps"], w1["state"]) == (3, 47, "running")
    assert running.get("/global_episode").json()["data"] == 3
    assert running.get("/best_score").json()["data"] == 25.0
    # The FIFO holds the successive averages, oldest first.
    assert running.get("/queue").json()["data"] == 10.0
    assert running.get("/queue").json()["data"] == pytest.approx(0.99 * 10.0 + 0.01 * 4.0)


def test_episode_stops_the_run_at_max_episodes(client: TestClient, launched: list) -> None:
    start_run(client, max_episodes=3)
    assert episode(client, 1.0)["stop"] is False
    assert episode(client, 2.0)["stop"] is False
    last = episode(client, 3.0)
    assert last["stop"] is True and last["global_episode"] == 3
    s = status(client)
    assert s["state"] == "finished"
    assert "max_episodes" in s["finish_reason"]
    # An episode that ended just after the finish still happened: it is counted, once, and the
    # reply tells its worker to stop.
    late = client.post("/episode", json={"worker_id": "w1", "reward": 1.0, "length": 1})
    assert late.status_code == 200
    assert late.json()["data"]["stop"] is True
    assert status(client)["global_episode"] == 4
    assert status(client)["state"] == "finished"
    other = {"worker_id": "w1", "reward": 1.0, "length": 1, "run_id": "an-earlier-run"}
    assert client.post("/episode", json=other).status_code == 409
    assert status(client)["global_episode"] == 4
    assert client.post("/heartbeat", json={"worker_id": "w1"}).json()["data"]["stop"] is True


def test_episode_without_a_run_folds_the_counters(client: TestClient) -> None:
    r = client.post("/episode", json={"worker_id": "w1", "reward": 7.0, "length": 3})
    assert r.status_code == 200
    data = r.json()["data"]
    assert data["global_episode"] == 1 and data["best_score"] == 7.0 and data["stop"] is True
    s = status(client)
    assert s["global_episode"] == 1 and s["global_steps"] == 3 and s["state"] == "idle"


# -- weights ---------------------------------------------------------------------------------


def test_weights_need_a_run(client: TestClient) -> None:
    assert client.get("/global_model_weights").status_code == 409
    r = push_gradients(client, wire.encode({"x": torch.zeros(1)}), 0)
    assert r.status_code == 409


def test_global_model_weights_and_if_none_match(running: TestClient) -> None:
    tensors, version, _ = weights(running)
    assert version == 0
    assert "policy_torso.0.weight" in tensors and "value_head.bias" in tensors
    assert all(t.dtype == torch.float32 for t in tensors.values())
    r = running.get("/global_model_weights", headers={"If-None-Match": '"0"'})
    assert r.status_code == 304
    assert r.content == b""
    assert r.headers["X-Model-Version"] == "0"
    r = running.get("/global_model_weights", headers={"If-None-Match": '"7"'})
    assert r.status_code == 200 and r.headers["X-Model-Version"] == "0"


def test_gradients_apply_and_answer_new_weights(running: TestClient) -> None:
    before, version, _ = weights(running)
    r = push_gradients(running, wire.encode(ones_like(before)), version)
    assert r.status_code == 200, r.text
    assert int(r.headers["X-Model-Version"]) == version + 1
    answered = st_load(r.content)
    after, new_version, _ = weights(running)
    assert new_version == version + 1
    for name in before:
        assert torch.equal(answered[name], after[name])
        assert not torch.equal(before[name], after[name]), name
        # Adam's first step moves every weight against the gradient's sign by about lr.
        assert torch.all(after[name] < before[name]), name
    s = status(running)
    assert (s["model_version"], s["updates_applied"], s["updates_rejected"]) == (1, 1, 0)
    r = running.get("/global_model_weights", headers={"If-None-Match": '"0"'})
    assert r.status_code == 200


def test_stale_gradients_are_409(client: TestClient, launched: list) -> None:
    start_run(client, max_staleness=1)
    tensors, _, _ = weights(client)
    grads = wire.encode(ones_like(tensors, 0.1))
    assert push_gradients(client, grads, 0).status_code == 200
    assert push_gradients(client, grads, 0).status_code == 200  # 1 version old: allowed
    _, version, body = weights(client)
    assert version == 2
    for stale in (0, 99):  # too old, and from a version this master never had
        r = push_gradients(client, grads, stale)
        assert r.status_code == 409, stale
        assert "version" in r.json()["detail"]
    _, after_version, after_body = weights(client)
    assert after_version == 2 and after_body == body
    s = status(client)
    assert (s["updates_applied"], s["updates_rejected"]) == (2, 2)


def test_local_weights_temporary_keeps_the_global_ones(running: TestClient) -> None:
    tensors, version, body = weights(running)
    r = running.post(
        "/local_model_weights?worker_id=w1&temporary=true",
        content=wire.encode(ones_like(tensors, 0.5)),
        headers=OCTET,
    )
    assert r.status_code == 200, r.text
    assert r.json()["data"] == {"model_version": version, "temporary": True, "duplicate": False}
    _, after_version, after_body = weights(running)
    assert after_version == version and after_body == body


def test_local_weights_become_global(running: TestClient) -> None:
    tensors, version, _ = weights(running)
    r = running.post(
        "/local_model_weights",
        params={"worker_id": "w2", "temporary": "false"},
        content=wire.encode(ones_like(tensors, 0.5)),
        headers=OCTET,
    )
    assert r.status_code == 200, r.text
    assert r.json()["data"] == {
        "model_version": version + 1,
        "temporary": False,
        "duplicate": False,
    }
    after, after_version, _ = weights(running)
    assert after_version == version + 1
    for name, t in after.items():
        assert torch.equal(t, torch.full_like(t, 0.5)), name
    assert status(running)["model_version"] == version + 1


# -- liveness (a controlled clock) -----------------------------------------------------------


class Clock:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import master.ledger

        self.now = 1_000_000.0
        monkeypatch.setattr(master.ledger.time, "time", lambda: self.now)


def worker_states(c: TestClient) -> dict[str, str]:
    return {w["worker_id"]: w["state"] for w in status(c)["workers"]}


def test_silent_workers_are_lost_and_the_run_ends(
    client: TestClient, launched: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(monkeypatch)
    start_run(client, heartbeat_interval_s=1, heartbeat_timeout_s=5)
    clock.now += 4
    client.post("/heartbeat", json={"worker_id": "w1"})
    assert worker_states(client) == {"w1": "running", "w2": "starting"}
    clock.now += 2  # w2 silent for 6 s, w1 for 2 s
    s = status(client)
    assert {w["worker_id"]: w["state"] for w in s["workers"]} == {"w1": "running", "w2": "lost"}
    w2 = next(w for w in s["workers"] if w["worker_id"] == "w2")
    assert "heartbeat_timeout_s=5" in w2["error"]
    assert s["state"] == "running"
    # A late message of a lost worker brings it back while the run goes on, counted once.
    assert client.post("/episode", json={"worker_id": "w2", "reward": 1.0, "length": 3},
                       headers={"X-A3C-Seq": "1"}).status_code == 200
    assert worker_states(client)["w2"] == "running"
    clock.now += 6
    s = status(client)
    assert s["state"] == "finished" and s["finish_reason"] == "no worker is running any more"
    assert set(worker_states(client).values()) == {"lost"}
    assert s["global_episode"] == 1


def test_a_worker_is_not_judged_while_the_master_waits_for_its_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(monkeypatch)
    answered = []

    def slow_launch(state, workers, run_id, config, master_url, token, timeout_s=10.0):
        clock.now += 50  # /start_worker takes longer than the heartbeat timeout
        state.check_liveness()
        answered.append(dict(state.status()["workers"][0]))
        for wid in workers:
            state.worker_accepted(wid)
        return [{"url": u, "worker_id": w, "started": True, "error": None}
                for w, u in workers.items()]

    monkeypatch.setattr(routes_run, "launch", slow_launch)
    with master(make_settings(tmp_path)) as c:
        start_run(c, workers=["127.0.0.1:9001"], heartbeat_interval_s=1, heartbeat_timeout_s=5)
        assert answered[0]["state"] == "starting"
        assert status(c)["state"] == "running"
        clock.now += 6  # it accepted, then said nothing for longer than the timeout
        assert worker_states(c) == {"w1": "lost"}


def test_start_timeout_gives_starting_workers_longer(
    client: TestClient, launched: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(monkeypatch)
    start_run(client, heartbeat_interval_s=0.5, heartbeat_timeout_s=2, start_timeout_s=30)
    clock.now += 10
    assert worker_states(client) == {"w1": "starting", "w2": "starting"}
    client.post("/heartbeat", json={"worker_id": "w1"})
    clock.now += 3  # w1 now runs: its heartbeat timeout applies
    assert worker_states(client) == {"w1": "lost", "w2": "starting"}
    clock.now += 18
    assert worker_states(client) == {"w1": "lost", "w2": "lost"}
    assert "start_timeout_s=30" in status(client)["workers"][1]["error"]


# -- retries are counted once (X-A3C-Seq) ---------------------------------------------------


def seq_episode(c: TestClient, seq: int, reward: float, length: int = 10, worker_id: str = "w1"):
    return c.post(
        "/episode",
        json={"worker_id": worker_id, "reward": reward, "length": length},
        headers={"X-A3C-Seq": str(seq)},
    )


def worker_record(c: TestClient, worker_id: str) -> dict[str, Any]:
    return next(w for w in status(c)["workers"] if w["worker_id"] == worker_id)


def test_a_retried_episode_is_counted_once(running: TestClient) -> None:
    first = seq_episode(running, 1, 10.0, 12)
    assert first.status_code == 200
    assert first.json()["data"]["duplicate"] is False
    again = seq_episode(running, 1, 10.0, 12)  # the reply was lost; the worker retries
    assert again.status_code == 200
    assert again.json()["data"] == {**first.json()["data"], "duplicate": True}
    older = seq_episode(running, 1, 99.0, 50)  # any number already used is not counted
    assert older.json()["data"]["duplicate"] is True
    s = status(running)
    assert (s["global_episode"], s["global_steps"], s["best_score"]) == (1, 12, 10.0)
    assert s["queue_length"] == 1
    record = worker_record(running, "w1")
    assert (record["episodes"], record["last_seq"], record["duplicates"]) == (1, 1, 2)
    # The next number is counted, and numbers are per worker.
    assert seq_episode(running, 2, 20.0, 5).json()["data"]["global_episode"] == 2
    assert seq_episode(running, 1, 30.0, 5, worker_id="w2").json()["data"]["global_episode"] == 3
    assert status(running)["best_score"] == 30.0


def test_a_retried_gradient_is_applied_once(running: TestClient) -> None:
    tensors, version, _ = weights(running)
    body = wire.encode(ones_like(tensors))
    headers = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": str(version), "X-A3C-Seq": "5"}
    first = running.post("/gradients", content=body, headers=headers)
    assert first.status_code == 200 and "X-A3C-Duplicate" not in first.headers
    again = running.post("/gradients", content=body, headers=headers)
    assert again.status_code == 200
    assert again.headers["X-A3C-Duplicate"] == "1"
    assert again.headers["X-Model-Version"] == first.headers["X-Model-Version"] == "1"
    assert again.content == first.content
    s = status(running)
    assert (s["model_version"], s["updates_applied"], s["updates_rejected"]) == (1, 1, 0)
    assert worker_record(running, "w1")["duplicates"] == 1
    # Another worker's number 5 is its own.
    other = {**headers, "X-Worker-Id": "w2", "X-Model-Version": "1"}
    assert running.post("/gradients", content=body, headers=other).status_code == 200
    assert status(running)["updates_applied"] == 2


def test_a_retry_after_the_finish_still_learns_its_update_was_taken(running: TestClient) -> None:
    tensors, version, _ = weights(running)
    body = wire.encode(ones_like(tensors))
    headers = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": str(version), "X-A3C-Seq": "1"}
    assert running.post("/gradients", content=body, headers=headers).status_code == 200
    assert running.post("/stop").status_code == 200
    again = running.post("/gradients", content=body, headers=headers)
    assert again.status_code == 200 and again.headers["X-A3C-Duplicate"] == "1"
    later = running.post("/gradients", content=body, headers={**headers, "X-A3C-Seq": "2"})
    assert later.status_code == 409 and later.headers["X-A3C-Stop"] == "1"
    assert status(running)["updates_applied"] == 1


def test_a_retried_stale_gradient_is_refused_again(client: TestClient, launched: list) -> None:
    start_run(client, max_staleness=0)
    tensors, _, _ = weights(client)
    body = wire.encode(ones_like(tensors))
    headers = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": "0"}
    assert client.post("/gradients", content=body, headers=headers).status_code == 200
    stale = {**headers, "X-A3C-Seq": "2"}
    assert client.post("/gradients", content=body, headers=stale).status_code == 409
    assert client.post("/gradients", content=body, headers=stale).status_code == 409
    s = status(client)
    assert (s["updates_applied"], s["updates_rejected"]) == (1, 2)


def test_retried_global_weights_are_taken_once(running: TestClient) -> None:
    tensors, version, _ = weights(running)
    body = wire.encode(ones_like(tensors, 0.5))
    params = {"worker_id": "w1", "temporary": "false"}
    for duplicate in (False, True):
        r = running.post(
            "/local_model_weights", params=params, content=body, headers={**OCTET, "X-A3C-Seq": "3"}
        )
        assert r.status_code == 200, r.text
        assert r.json()["data"] == {
            "model_version": version + 1,
            "temporary": False,
            "duplicate": duplicate,
        }
    assert status(running)["updates_applied"] == 1


@pytest.mark.parametrize("seq", ["0", "-1", "x", "1.5", str(2**63)])
def test_a_bad_seq_is_422_and_counts_nothing(running: TestClient, seq: str) -> None:
    r = running.post(
        "/episode",
        json={"worker_id": "w1", "reward": 1.0, "length": 1},
        headers={"X-A3C-Seq": seq},
    )
    assert r.status_code == 422
    assert "X-A3C-Seq" in r.json()["detail"]
    assert status(running)["global_episode"] == 0


def test_sequence_numbers_survive_a_restart(tmp_path: Path, launched: list) -> None:
    settings = make_settings(tmp_path)
    with master(settings) as c:
        start_run(c)
        assert seq_episode(c, 1, 10.0).status_code == 200
        tensors, version, _ = weights(c)
        headers = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": str(version), "X-A3C-Seq": "2"}
        body = wire.encode(ones_like(tensors))
        assert c.post("/gradients", content=body, headers=headers).status_code == 200
    with master(settings) as c:
        assert seq_episode(c, 1, 10.0).json()["data"]["duplicate"] is True
        r = c.post("/gradients", content=body, headers=headers)
        assert r.headers["X-A3C-Duplicate"] == "1"
        s = status(c)
        assert (s["global_episode"], s["updates_applied"]) == (1, 1)


# -- persistence -----------------------------------------------------------------------------


def test_a_new_master_resumes_the_run(tmp_path: Path, launched: list) -> None:
    settings = make_settings(tmp_path)
    with master(settings) as c:
        start_run(c)
        c.post("/worker_started", json={"worker_id": "w1", "url": "http://127.0.0.1:9001"})
        for reward, length in ((10.0, 12), (30.0, 25), (20.0, 9)):
            episode(c, reward, length)
        tensors, version, _ = weights(c)
        assert push_gradients(c, wire.encode(ones_like(tensors)), version).status_code == 200
        c.get("/queue")  # pop the oldest, so the FIFO no longer matches the episodes
        before = status(c)
        _, before_version, before_body = weights(c)
    assert before_version == 1

    with master(settings) as c:
        after = status(c)
        for key in (
            "state",
            "run_id",
            "env_id",
            "global_episode",
            "global_steps",
            "best_score",
            "moving_average",
            "mean_return_100",
            "model_version",
            "updates_applied",
            "updates_rejected",
            "queue_length",
            "queue_dropped",
            "config",
        ):
            assert after[key] == before[key], key
        assert after["state"] == "running"
        assert after["elapsed_s"] >= before["elapsed_s"]
        assert {
            w["worker_id"]: (w["state"], w["episodes"], w["steps"]) for w in after["workers"]
        } == {w["worker_id"]: (w["state"], w["episodes"], w["steps"]) for w in before["workers"]}
        _, version, body = weights(c)
        assert version == before_version
        assert body == before_body
        avg1 = 0.99 * 10.0 + 0.01 * 30.0
        avg2 = 0.99 * avg1 + 0.01 * 20.0
        assert c.get("/queue").json()["data"] == pytest.approx(avg1)
        assert c.get("/queue").json()["data"] == pytest.approx(avg2)
        assert c.get("/queue").json() == {"data": None, "empty": True}
        # The resumed run goes on: counters and versions continue from where they were.
        assert episode(c, 5.0)["global_episode"] == 4
        tensors = st_load(body)
        r = push_gradients(c, wire.encode(ones_like(tensors)), version)
        assert r.status_code == 200
        assert r.headers["X-Model-Version"] == str(version + 1)


def test_a_master_resumed_after_a_crash_never_reuses_a_version(tmp_path: Path) -> None:
    """Versions handed out after the last save of a crashed master named weights that are lost:
    the resumed master skips past them (and saves that at once), so no version or ETag a worker
    holds from before the crash can name other weights. A clean shutdown skips nothing.
    (`close()` without a save is the crash: the process's end gives up the folder.)"""
    settings = make_settings(tmp_path)
    crashed = ClusterState(settings)
    crashed.start_run(TrainConfig(seed=1), ["http://127.0.0.1:9"])
    params = crashed.params
    grads = wire.encode(ones_like(wire.decode(params.weights()[0], params.spec)))
    crashed.apply_gradients("w1", 0, grads)
    crashed.persist()  # a periodic save; then more versions, lost with the crash
    saved, _ = params.weights()
    for version in (1, 2):
        crashed.apply_gradients("w1", version, grads)
    assert params.version == 3
    crashed.close()

    resumed = ClusterState(settings)
    assert resumed.params.version == 1 + VERSIONS_SKIPPED_AFTER_A_CRASH
    assert resumed.params.weights() == (saved, resumed.params.version)  # the saved weights
    with pytest.raises(StateConflict, match="versions old"):
        resumed.apply_gradients("w1", 3, grads)  # computed on lost weights: refused
    resumed.close()
    # Crashing again right away skips again from the save the resumed master made at once.
    again = ClusterState(settings)
    assert again.params.version == 1 + 2 * VERSIONS_SKIPPED_AFTER_A_CRASH
    again.persist(force=True, clean=True)
    again.close()
    assert ClusterState(settings).params.version == again.params.version


# -- the OpenAPI schema ----------------------------------------------------------------------------

# The operations that may answer 409, and only those declare it.
CONFLICT_OPERATIONS = {
    ("POST", "/train"),
    ("POST", "/worker_started"),
    ("POST", "/worker_done"),
    ("POST", "/episode"),
    ("GET", "/global_model_weights"),
    ("POST", "/local_model_weights"),
    ("POST", "/gradients"),
}


def test_the_routes_themselves_declare_every_error(tmp_path: Path) -> None:
    """The errors are declared with FastAPI's `responses=` on the routes: the schema FastAPI makes
    from the routes alone is the one the app serves, nothing patched on top."""
    app = create_app(make_settings(tmp_path))
    from_routes = get_openapi(title=app.title, version=app.version, routes=app.routes)
    served = app.openapi()
    assert served["paths"] == from_routes["paths"]
    assert served["components"] == from_routes["components"]
    assert_errors_declared(from_routes, CONFLICT_OPERATIONS)


def test_the_schema_offers_the_bearer_token_to_docs(tmp_path: Path) -> None:
    """/docs shows "Authorize" and sends `Authorization: Bearer ...` with every request it makes."""
    with master(make_settings(tmp_path, token="s3cret")) as c:
        r = c.get("/openapi.json", headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200
        assert_bearer_everywhere_but_healthz(r.json())
        assert c.get("/openapi.json").status_code == 401  # enforcement is unchanged
