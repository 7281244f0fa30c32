"""The worker's training loop against a master stand-in (httpx.MockTransport): no HTTP server."""

from __future__ import annotations

import json
import math
import threading

import httpx
import torch

from a3c_http.algos.registry import train_config
from a3c_http.config.training import TrainConfig
from a3c_http.models.actor_critic import build_model
from a3c_http.net.client import MasterClient
from a3c_http.wire import tensors as wire
from worker.trainer import Progress, Trainer

CONFIG = train_config(
    seed=3, num_envs=2, t_max=4, heartbeat_interval_s=0.01, heartbeat_timeout_s=10
)


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


def test_one_round_trip_per_update_carries_the_episodes_and_the_stop() -> None:
    """Each push carries the rollout's finished episodes and the worker's statistics in the
    body's metadata; the reply's X-A3C-Stop ends the run. No /episode, no /heartbeat while the
    replies come."""
    config = CONFIG.model_copy(update={"max_in_flight": 0, "heartbeat_interval_s": 60.0})
    model = build_model(config.env_id, config.env_kwargs, config.hidden_sizes)
    layout = wire.Layout.of(model)
    weights = layout.encode(layout.flatten(model.state_dict()))
    paths: list[str] = []
    reports: list[dict] = []
    pushed_versions: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        if request.url.path == "/gradients":
            vector, metadata = layout.decode(request.content)
            assert torch.isfinite(vector).all()
            reports.append(json.loads(metadata["a3c"]))
            version = int(request.headers["X-Model-Version"])
            pushed_versions.append(version)
            done = sum(len(r["episodes"]) for r in reports) >= 5
            headers = {"X-Model-Version": str(version + 1), "X-A3C-Stop": "1" if done else "0"}
            return httpx.Response(200, content=weights, headers=headers)
        if request.url.path == "/global_model_weights":
            return httpx.Response(200, content=weights, headers={"X-Model-Version": "0"})
        return httpx.Response(200, json={"data": {}})

    trainer, progress = make_trainer(handler, config)
    trainer.run()
    assert set(paths) == {"/worker_started", "/global_model_weights", "/gradients"}
    episodes = [e for r in reports for e in r["episodes"]]
    assert len(episodes) >= 5 and progress.episodes == len(episodes)
    assert all(length >= 1 and math.isfinite(ret) for ret, length in episodes)
    assert progress.steps == sum(length for _, length in episodes)
    env_steps = [r["stats"]["env_steps"] for r in reports]
    assert env_steps == sorted(env_steps) and env_steps[0] > 0
    assert reports[-1]["stats"]["episodes"] == progress.episodes
    assert pushed_versions == list(range(len(pushed_versions)))  # each on the newest weights
    assert {"train/policy_loss", "train/value_loss", "train/entropy"} <= set(progress.metrics)


def test_pushes_report_loss_and_norm_and_a_refused_one_is_dropped_for_the_weights() -> None:
    """Each push carries the rollout's loss and the norm before clipping; a 409 without stop (an
    outlier, stale gradients) makes the worker pull the weights and go on. In sync mode the push
    may wait sync_timeout_s longer than other requests (the client's 10 s)."""
    a2c = train_config(CONFIG.model_dump(exclude={"shards"}), algo="a2c", sync_timeout_s=5.0)
    config = a2c.model_copy(update={"heartbeat_interval_s": 60.0})
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
            headers = {"X-Model-Version": "2", "X-A3C-Stop": "1"}
            return httpx.Response(200, content=weights, headers=headers)
        if path == "/global_model_weights":
            return httpx.Response(200, content=weights, headers={"X-Model-Version": "1"})
        return httpx.Response(200, json={"data": {}})

    trainer, progress = make_trainer(handler, config)
    trainer.run()
    first = paths.index("/gradients")
    assert paths[first + 1] == "/global_model_weights"  # the refused rollout is dropped
    assert progress.updates == len(pushes) - 1 and progress.refused == 1
    for request in pushes:
        assert math.isfinite(float(request.headers["X-A3C-Loss"]))
        assert float(request.headers["X-A3C-Grad-Norm"]) >= 0
        assert request.extensions["timeout"]["read"] == 10.0 + 5.0


def _header(body: bytes) -> dict:
    size = int.from_bytes(body[:8], "little")
    return json.loads(body[8 : 8 + size])


def test_a_bfloat16_run_pushes_bfloat16_gradients_and_loads_the_bfloat16_weights() -> None:
    config = CONFIG.model_copy(
        update={"wire_dtype": "bfloat16", "max_in_flight": 0, "heartbeat_interval_s": 60.0}
    )
    torch.manual_seed(11)  # weights of another model than the worker's own
    model = build_model(config.env_id, config.env_kwargs, config.hidden_sizes)
    layout = wire.Layout.of(model, "bfloat16")
    weights = layout.encode(layout.flatten(model.state_dict()))
    pushes: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/gradients":
            pushes.append(request.content)
            headers = {"X-Model-Version": "1", "X-A3C-Stop": "1"}
            return httpx.Response(200, content=weights, headers=headers)
        if request.url.path == "/global_model_weights":
            return httpx.Response(200, content=weights, headers={"X-Model-Version": "0"})
        return httpx.Response(200, json={"data": {}})

    trainer, _ = make_trainer(handler, config)
    trainer.run()
    assert len(pushes) == 1
    assert {e["dtype"] for n, e in _header(pushes[0]).items() if n != "__metadata__"} == {"BF16"}
    assert torch.isfinite(layout.decode(pushes[0])[0]).all()
    assert torch.equal(trainer.flat, layout.decode(weights)[0])  # what it acted with


def test_a_bfloat16_run_pushes_its_weights_in_bfloat16() -> None:
    """best_weights mode: the weights a worker pushes (here its temporary slot, at a heartbeat)
    follow the run's dtype."""
    config = train_config(
        CONFIG.model_dump(exclude={"shards"}), wire_dtype="bfloat16", algo="best_weights"
    )
    model = build_model(config.env_id, config.env_kwargs, config.hidden_sizes)
    layout = wire.Layout.of(model, "bfloat16")
    weights = layout.encode(layout.flatten(model.state_dict()))
    pushed: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/local_model_weights":
            pushed.append(request.content)
            return httpx.Response(200, json={"data": {"model_version": 0}})
        if path == "/global_model_weights":
            return httpx.Response(200, content=weights, headers={"X-Model-Version": "0"})
        if path == "/heartbeat":
            return httpx.Response(200, json={"data": {"stop": bool(pushed)}})
        if path == "/episode":
            return httpx.Response(200, json={"data": {"improved": False, "stop": False}})
        return httpx.Response(200, json={"data": {}})

    trainer, _ = make_trainer(handler, config)
    trainer.run()
    assert pushed
    assert _header(pushed[0])["policy_head.weight"]["dtype"] == "BF16"
    assert torch.isfinite(layout.decode(pushed[0])[0]).all()


def test_a_refused_push_brings_the_weights_at_once_even_with_pushes_in_flight() -> None:
    """Refused gradients mean the worker's weights are too old, and so are those of its pushes
    in flight and of every rollout it computes on them: it pulls the current weights at the
    first refusal, not once nothing is in flight (which a busy master may never leave)."""
    config = CONFIG.model_copy(update={"max_in_flight": 4, "heartbeat_interval_s": 60.0})
    model = build_model(config.env_id, config.env_kwargs, config.hidden_sizes)
    layout = wire.Layout.of(model)
    weights = layout.encode(layout.flatten(model.state_dict()))
    sent_2, answered_2, pulled = threading.Event(), threading.Event(), threading.Event()
    pushes: list[int] = []  # the version of each push, in arrival order
    lock = threading.Lock()
    pulled_while_second_waited: list[bool] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/global_model_weights":
            version = 5 if pushes else 0
            if pushes and not pulled.is_set():  # the first pull after a refusal
                pulled_while_second_waited.append(sent_2.is_set() and not answered_2.is_set())
                pulled.set()
            return httpx.Response(200, content=weights, headers={"X-Model-Version": str(version)})
        if request.url.path != "/gradients":
            return httpx.Response(200, json={"data": {}})
        version = int(request.headers["X-Model-Version"])
        with lock:  # two sender threads
            pushes.append(version)
            n = len(pushes)
        # The bounds only turn the old behaviour into a failure instead of a hang.
        if n == 1:  # refused once the second push is on its way
            sent_2.wait(10)
        elif n == 2:  # answered only once the worker pulled the weights
            sent_2.set()
            pulled.wait(10)
            answered_2.set()
        if version < 5:
            return httpx.Response(409, json={"detail": "gradients 40 versions old"})
        headers = {"X-Model-Version": str(version + 1), "X-A3C-Stop": "1"}
        return httpx.Response(200, content=weights, headers=headers)

    client = MasterClient(
        "http://master", transport=httpx.MockTransport(handler), run_id="r1", push_threads=2
    )
    progress = Progress()
    Trainer(config, client, "w1", "http://w1", threading.Event(), progress).run()
    assert pulled_while_second_waited == [True]
    assert pushes[:2] == [0, 0] and pushes[-1] == 5 and progress.updates >= 1
    assert progress.refused == pushes.count(0)
