"""What the tests of the master's API (test_master_*.py) share: the master in-process through
TestClient, checked against docs/http-api.md, and the calls they make to it.

Runs that need workers use a fake `master.api.run.launch` (the `launched` fixture, no HTTP):
the workers stay `starting` and the tests play the worker side themselves. Runs started against
a closed port exercise the real launcher and finish with "no worker could be started".
A test module imports the fixtures it uses, and always the autouse `_clean_env`, each as
`from tests.support.master_api import client as client`: pytest finds fixtures by name in the
module, and the redundant alias tells ruff that the import is meant."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load as st_load

from a3c_http.config.settings import Settings
from master.api import run as routes_run
from master.app import create_app

LOOPBACK = ("127.0.0.1", 50000)
OCTET = {"content-type": "application/octet-stream"}
WORKERS = ["127.0.0.1:9001", "127.0.0.1:9002"]
TRAIN = {"workers": WORKERS, "master_url": "http://127.0.0.1:33333", "seed": 1}


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


def gradients_like(
    tensors: dict[str, torch.Tensor], value: float = 1e-3
) -> dict[str, torch.Tensor]:
    """Gradients of one value everywhere, small enough that their norm is within the default
    max_grad_norm (0.5) for the default model (9,155 parameters: 1e-3 gives a norm of 0.1)."""
    return ones_like(tensors, value)


def episode(c: TestClient, reward: float, length: int = 10, worker_id: str = "w1"):
    r = c.post("/episode", json={"worker_id": worker_id, "reward": reward, "length": length})
    assert r.status_code == 200, r.text
    return r.json()["data"]


def status(c: TestClient) -> dict[str, Any]:
    r = c.get("/status")
    assert r.status_code == 200, r.text
    return r.json()


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

    def fake_launch(
        state, workers, run_id, config, master_url, token, timeout_s=10.0, **options
    ):
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
