"""The worker's training loop against a master stand-in (httpx.MockTransport): no HTTP server."""

from __future__ import annotations

import threading

import httpx
import torch

from a3c_http import wire
from a3c_http.client import MasterClient
from a3c_http.config import TrainConfig
from a3c_http.model import build_model
from worker.trainer import Progress, Trainer

CONFIG = TrainConfig(seed=3, num_envs=2, t_max=4, heartbeat_interval_s=0.01, heartbeat_timeout_s=10)


def make_trainer(handler) -> tuple[Trainer, Progress]:
    client = MasterClient(
        "http://master",
        transport=httpx.MockTransport(handler),
        retry_deadline_s=0.1,
        backoff_s=0.01,
        run_id="r1",
    )
    progress = Progress()
    return Trainer(CONFIG, client, "w1", "http://w1", threading.Event(), progress), progress


def test_a_stop_answered_to_registration_ends_cleanly() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(409, json={"detail": "run r0 is over"}, headers={"X-A3C-Stop": "1"})

    trainer, progress = make_trainer(handler)
    trainer.run()  # returns, no exception: the run is over, which is not a failure
    assert progress.episodes == 0


def test_the_loop_pushes_gradients_reports_episodes_and_stops_when_told() -> None:
    model = build_model(CONFIG.env_id, CONFIG.env_kwargs, CONFIG.hidden_sizes)
    weights = wire.encode(model.state_dict())
    seen: dict[str, int] = {}
    pushed_versions: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        seen[path] = seen.get(path, 0) + 1
        if path == "/gradients":
            grads = wire.decode(request.content, wire.spec_of(model))
            assert all(torch.isfinite(g).all() for g in grads.values())
            version = int(request.headers["X-Model-Version"])
            pushed_versions.append(version)
            return httpx.Response(
                200, content=weights, headers={"X-Model-Version": str(version + 1)}
            )
        if path == "/global_model_weights":
            return httpx.Response(200, content=weights, headers={"X-Model-Version": "0"})
        if path == "/episode":
            n = seen[path]
            return httpx.Response(200, json={"data": {"improved": n == 1, "stop": n >= 5}})
        if path == "/heartbeat":
            return httpx.Response(200, json={"data": {"stop": False}})
        return httpx.Response(200, json={"data": {}})

    trainer, progress = make_trainer(handler)
    trainer.run()
    assert seen["/worker_started"] == 1
    assert progress.episodes == 5  # stopped by the fifth episode's reply
    assert pushed_versions == list(range(len(pushed_versions))) and pushed_versions
    assert {"train/policy_loss", "train/value_loss", "train/entropy"} <= set(progress.metrics)
