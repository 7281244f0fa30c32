"""The worker's training loop against a master stand-in (httpx.MockTransport): no HTTP server."""

from __future__ import annotations

import math
import threading

import httpx
import torch

from a3c_http import wire
from a3c_http.client import MasterClient
from a3c_http.config import TrainConfig
from a3c_http.model import build_model
from worker.trainer import Progress, Trainer

CONFIG = TrainConfig(seed=3, num_envs=2, t_max=4, heartbeat_interval_s=0.01, heartbeat_timeout_s=10)


def make_trainer(handler, config: TrainConfig = CONFIG) -> tuple[Trainer, Progress]:
    client = MasterClient(
        "http://master",
        transport=httpx.MockTransport(handler),
        retry_deadline_s=0.1,
        backoff_s=0.01,
        run_id="r1",
    )
    progress = Progress()
    return Trainer(config, client, "w1", "http://w1", threading.Event(), progress), progress


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


def test_pushes_report_loss_and_norm_and_a_refused_one_is_dropped_for_the_weights() -> None:
    """Each push carries the rollout's loss and the norm before clipping; a 409 without stop (an
    outlier, stale gradients) makes the worker pull the weights and go on. In sync mode the push
    may wait sync_timeout_s longer than other requests (the client's 10 s)."""
    config = CONFIG.model_copy(update={"sync_mode": "sync", "sync_timeout_s": 5.0})
    model = build_model(config.env_id, config.env_kwargs, config.hidden_sizes)
    weights = wire.encode(model.state_dict())
    paths: list[str] = []
    pushes: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        paths.append(path)
        if path == "/gradients":
            pushes.append(request)
            if len(pushes) == 1:
                return httpx.Response(409, json={"detail": "gradient norm 1e+09 refused"})
            return httpx.Response(200, content=weights, headers={"X-Model-Version": "2"})
        if path == "/global_model_weights":
            return httpx.Response(200, content=weights, headers={"X-Model-Version": "1"})
        if path == "/episode":
            return httpx.Response(200, json={"data": {"improved": False, "stop": False}})
        if path == "/heartbeat":
            return httpx.Response(200, json={"data": {"stop": len(pushes) >= 2}})
        return httpx.Response(200, json={"data": {}})

    trainer, progress = make_trainer(handler, config)
    trainer.run()
    first = paths.index("/gradients")
    assert paths[first + 1] == "/global_model_weights"  # the refused rollout is dropped
    assert progress.updates == len(pushes) - 1
    for request in pushes:
        assert math.isfinite(float(request.headers["X-A3C-Loss"]))
        assert float(request.headers["X-A3C-Grad-Norm"]) >= 0
        assert request.extensions["timeout"]["read"] == 10.0 + 5.0
