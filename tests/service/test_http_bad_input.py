"""Bad input to both services, in-process (TestClient): bodies over the limit, with and without
a Content-Length, get 413, and one that does not arrive in time 408; malformed bodies, headers,
queries and configs get a 4xx that names the problem; none of them changes anything.

One real-process check of the body limit is in test_integration.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from a3c_http.config.settings import WorkerSettings
from a3c_http.testing.standin import StandInWorker
from master.app import create_app as create_master
from tests.support.common import AUTH, OCTET, bad_tensor_bodies, snapshot, without_box2d
from tests.support.http_layer import LIMIT, LOOPBACK, settings
from tests.support.http_layer import _clean_env as _clean_env
from tests.support.http_layer import master as master
from tests.support.http_layer import worker as worker
from worker.app import create_app as create_worker

JSON = {"Content-Type": "application/json"}


# -- the body limit ------------------------------------------------------------------------------


def chunks(total: int, size: int = 8192) -> Iterator[bytes]:
    """`total` bytes without a Content-Length (chunked)."""
    for start in range(0, total, size):
        yield b"\0" * min(size, total - start)


def json_chunks(prefix: dict[str, Any], total: int) -> Iterator[bytes]:
    """A valid JSON object (`prefix` plus a long "pad" string) sent chunked: only its size is
    wrong."""
    yield json.dumps(prefix)[:-1].encode() + b', "pad": "'
    yield from (b"x" * 8192 for _ in range(total // 8192))
    yield b'"}'


def assert_413(reply: Any, what: str) -> None:
    assert reply.status_code == 413, (what, reply.status_code, reply.text[:200])
    assert "A3C_MAX_BODY_BYTES" in reply.json()["detail"], what


def test_bodies_over_the_limit_are_413_with_or_without_a_length(master: TestClient) -> None:
    before = snapshot(master)
    version = master.get("/global_model_weights").headers["X-Model-Version"]
    big = 2 * LIMIT
    grad = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": version}
    weights = "/local_model_weights?worker_id=w1&temporary=false"
    episode = {"worker_id": "w1", "reward": 1.0, "length": 1}
    cases = [
        ("/gradients", grad, b"\0" * big),
        ("/gradients", grad, chunks(big)),
        (weights, OCTET, b"\0" * big),
        (weights, OCTET, chunks(big)),
        ("/episode", JSON, json.dumps({**episode, "x": "y" * big}).encode()),
        ("/episode", JSON, json_chunks(episode, big)),
        ("/episode", JSON, b"[" * (LIMIT + 1)),
        ("/train", JSON, json_chunks({"num_envs": 2}, 4 * big)),
        ("/heartbeat", JSON, b" " * big),
    ]
    for path, headers, content in cases:
        assert_413(master.post(path, content=content, headers=headers), path)
    assert snapshot(master) == before
    # A body within the limit is served, chunked too: the limit is not "no chunked bodies".
    valid = master.get("/global_model_weights").content
    assert len(valid) < LIMIT
    reply = master.post("/local_model_weights?worker_id=w1&temporary=true",
                        content=iter([valid[:5000], valid[5000:]]), headers=OCTET)
    assert reply.status_code == 200, reply.text


def test_a_body_that_does_not_arrive_in_time_is_408() -> None:
    # The worker's app called as uvicorn calls it, with a body whose second half never comes.
    app = create_worker(settings=WorkerSettings(token=None, body_timeout_s=0.2))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/start_worker", "raw_path": b"/start_worker",
             "query_string": b"", "root_path": "", "client": LOOPBACK,
             "server": ("127.0.0.1", 8001),
             "headers": [(b"host", b"127.0.0.1:8001"), (b"content-type", b"application/json"),
                         (b"content-length", b"200")]}
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def call() -> None:
        parts = [{"type": "http.request", "body": b'{"master_url": ', "more_body": True}]

        async def receive() -> dict:
            if parts:
                return parts.pop()
            await asyncio.Event().wait()  # the client stalls
            raise AssertionError("unreachable")

        await app(scope, receive, send)

    asyncio.run(asyncio.wait_for(call(), 10))
    assert sent[0]["status"] == 408, sent
    assert (b"connection", b"close") in sent[0]["headers"]
    assert "A3C_BODY_TIMEOUT_S" in json.loads(sent[1]["body"])["detail"]


def test_a_body_that_is_not_json_says_so_and_where(worker: TestClient) -> None:
    reply = worker.post("/start_worker", content=b'{"worker_id": "w1" "config": {}}',
                        headers=JSON)
    assert reply.status_code == 422, reply.text
    assert reply.json()["detail"] == (
        "the body is not valid JSON (Expecting ',' delimiter at position 19): send a JSON "
        "object with Content-Type: application/json"
    )


def test_the_worker_has_the_same_limit(worker: TestClient) -> None:
    body = {"master_url": "http://127.0.0.1:9", "worker_id": "big", "config": {"num_envs": 1}}
    assert_413(worker.post("/start_worker", json={**body, "pad": "x" * (2 * LIMIT)}), "length")
    assert_413(worker.post("/start_worker", content=json_chunks(body, 2 * LIMIT), headers=JSON),
               "chunked")
    status = worker.get("/status").json()
    assert status["state"] == "idle" and status["worker_id"] != "big", status


# -- malformed input -----------------------------------------------------------------------------


def assert_refused(
    reply: Any, what: str, names: tuple[str, ...], status: int | None = None
) -> None:
    """A 4xx (or exactly `status`) whose JSON detail names the problem: one of `names`."""
    if status is None:
        assert 400 <= reply.status_code < 500, (what, reply.status_code, reply.text[:200])
    else:
        assert reply.status_code == status, (what, reply.status_code, reply.text[:200])
    detail = reply.json().get("detail")
    assert detail, (what, reply.text[:200])
    text = json.dumps(reply.json()).lower()
    assert any(n.lower() in text for n in names), (what, names, reply.text[:300])


def j(obj: Any) -> bytes:
    return json.dumps(obj).encode()


BAD_JSON = ("the body is not valid JSON",)
EP = {"worker_id": "w1", "reward": 10.0, "length": 10}
COMMON = [("bad JSON", b'{"data": ', BAD_JSON), ("JSON array", b"[1]", ("object", "dict", "valid")),
          ("text", b"hello", BAD_JSON), ("not UTF-8", b"\xff\xfe", BAD_JSON + ("utf",))]
BAD_JSON_BODIES: dict[str, list[tuple[str, bytes, tuple[str, ...]]]] = {
    "/episode": [
        *COMMON,
        ("empty body", b"", ("body", "required", "missing", "json")),
        ("missing worker_id", j({"reward": 1, "length": 1}), ("worker_id",)),
        ("missing reward", j({"worker_id": "w1", "length": 1}), ("reward",)),
        ("missing length", j({"worker_id": "w1", "reward": 1}), ("length",)),
        ("reward string", j({**EP, "reward": "lots"}), ("reward",)),
        ("reward a numeric string", j({**EP, "reward": "1.0"}), ("reward",)),
        ("reward true", j({**EP, "reward": True}), ("reward",)),
        ("reward NaN", b'{"worker_id": "w1", "reward": NaN, "length": 3}', ("reward",)),
        ("reward Infinity", b'{"worker_id": "w1", "reward": Infinity, "length": 3}', ("reward",)),
        ("reward 1e999", b'{"worker_id": "w1", "reward": 1e999, "length": 3}', ("reward",)),
        ("reward null", j({**EP, "reward": None}), ("reward",)),
        ("length 0", j({**EP, "length": 0}), ("length",)),
        ("length negative", j({**EP, "length": -5}), ("length",)),
        ("length float", j({**EP, "length": 2.5}), ("length",)),
        ("length list", j({**EP, "length": [3]}), ("length",)),
        ("worker_id int", j({**EP, "worker_id": 7}), ("worker_id",)),
        ("worker_id null", j({**EP, "worker_id": None}), ("worker_id",)),
        ("worker_id empty", j({**EP, "worker_id": ""}), ("worker_id",)),
        ("unknown field", j({**EP, "bogus": 1}), ("bogus",)),
    ],
    "/heartbeat": [
        *COMMON,
        ("missing worker_id", j({"steps_per_s": 3.0}), ("worker_id",)),
        ("worker_id int", j({"worker_id": 5}), ("worker_id",)),
        ("steps_per_s string", j({"worker_id": "w1", "steps_per_s": "fast"}), ("steps_per_s",)),
        ("steps_per_s NaN", b'{"worker_id": "w1", "steps_per_s": NaN}', ("steps_per_s",)),
        ("steps_per_s negative", j({"worker_id": "w1", "steps_per_s": -5}), ("steps_per_s",)),
        ("last_reward Infinity", b'{"worker_id": "w1", "last_reward": Infinity}',
         ("last_reward",)),
        ("metrics list", j({"worker_id": "w1", "metrics": [1, 2]}), ("metrics",)),
        ("metrics NaN", b'{"worker_id": "w1", "metrics": {"x": NaN}}', ("metrics",)),
        # Past what a float holds exactly: /metrics would overflow converting the sum.
        ("env_steps 10**400", j({"worker_id": "w1", "env_steps": 10**400}), ("env_steps",)),
        ("episodes 2**53 + 1", j({"worker_id": "w1", "episodes": 2**53 + 1}), ("episodes",)),
    ],
    "/best_score": [
        *COMMON,
        ("missing data", j({"worker_id": "w1"}), ("data",)),
        ("data string", j({"data": "high", "worker_id": "w1"}), ("data",)),
        ("data NaN", b'{"data": NaN, "worker_id": "w1"}', ("data",)),
        ("data Infinity", b'{"data": Infinity, "worker_id": "w1"}', ("data",)),
        ("data -Infinity", b'{"data": -Infinity, "worker_id": "w1"}', ("data",)),
        ("data null", j({"data": None, "worker_id": "w1"}), ("data",)),
        ("data false", j({"data": False}), ("data",)),
        ("data list", j({"data": [1e9], "worker_id": "w1"}), ("data",)),
        ("worker_id int", j({"data": 1e9, "worker_id": 3}), ("worker_id",)),
        ("unknown field", j({"data": 1e9, "worker_id": "w1", "bogus": 1}), ("bogus",)),
    ],
    "/global_moving_average": [
        *COMMON,
        ("missing data", j({}), ("data",)),
        ("data string", j({"data": "x"}), ("data",)),
        ("data NaN", b'{"data": NaN}', ("data",)),
        ("data -Infinity", b'{"data": -Infinity}', ("data",)),
        ("data null", j({"data": None}), ("data",)),
        ("unknown field", j({"data": 5.0, "bogus": 1}), ("bogus",)),
    ],
    "/queue": [
        *COMMON,
        ("missing data", j({}), ("data",)),
        ("data string", j({"data": "x"}), ("data",)),
        ("data NaN", b'{"data": NaN}', ("data",)),
        ("data Infinity", b'{"data": Infinity}', ("data",)),
        ("data dict", j({"data": {"a": 1}}), ("data",)),
        ("unknown field", j({"data": 5.0, "bogus": 1}), ("bogus",)),
    ],
    "/global_episode": [
        *COMMON,
        ("data 0", j({"data": 0}), ("data",)),
        ("data negative", j({"data": -3}), ("data",)),
        ("data float", j({"data": 1.5}), ("data",)),
        ("data 1e20", b'{"data": 1e20}', ("data",)),
        ("data string", j({"data": "x"}), ("data",)),
        ("data NaN", b'{"data": NaN}', ("data",)),
        ("data null", j({"data": None}), ("data",)),
        ("unknown field", j({"data": 1, "bogus": 1}), ("bogus",)),
    ],
    "/worker_started": [
        *COMMON,
        ("missing worker_id", j({"url": "http://127.0.0.1:9"}), ("worker_id",)),
        ("worker_id int", j({"worker_id": 4, "url": "http://127.0.0.1:9"}), ("worker_id",)),
        ("worker_id with spaces", j({"worker_id": "bad id with spaces"}), ("worker_id",)),
        ("url int", j({"worker_id": "w1", "url": 9}), ("url",)),
        ("unknown field", j({"worker_id": "w1", "url": "http://x:1", "bogus": 1}), ("bogus",)),
    ],
    "/worker_done": [
        *COMMON,
        ("missing worker_id", j({}), ("worker_id",)),
        ("worker_id list", j({"worker_id": ["w1"]}), ("worker_id",)),
        ("error int", j({"worker_id": "w1", "error": 5}), ("error",)),
        ("unknown field", j({"worker_id": "w1", "bogus": 1}), ("bogus",)),
    ],
    "/train": [
        *COMMON,
        ("JSON null", b"null", ("object", "dict", "body", "null", "valid")),
        ("unknown field", j({"bogus_field": 1}), ("bogus_field", "running")),
        ("num_envs 0", j({"num_envs": 0}), ("num_envs", "running")),
    ],
}


def test_malformed_bodies_headers_and_queries_are_refused_naming_the_problem(
    master: TestClient,
) -> None:
    # w1 sends the requests below; a refused one still shows it alive, so it is running first.
    assert master.post("/heartbeat", json={"worker_id": "w1"}).status_code == 200
    before = snapshot(master)
    version = before["weights"][0]
    good = st_load(master.get("/global_model_weights").content)
    rejected = master.get("/status").json()["updates_rejected"]
    catalogue = bad_tensor_bodies(good)
    grad = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": version}
    for label, (body, names) in catalogue.items():
        assert_refused(master.post("/gradients", content=body, headers=grad),
                       f"/gradients [{label}]", names, 422)
    # Each refused gradient is counted as one.
    assert master.get("/status").json()["updates_rejected"] == rejected + len(catalogue)
    for temporary in ("true", "false"):
        path = f"/local_model_weights?worker_id=w1&temporary={temporary}"
        for label, (body, names) in catalogue.items():
            assert_refused(master.post(path, content=body, headers=OCTET),
                           f"{path} [{label}]", names, 422)

    # Well-formed tensors with malformed headers or query parameters.
    zeros = st_save({k: torch.zeros_like(v) for k, v in good.items()})
    for label, headers in {
        "X-Model-Version missing": {"X-Worker-Id": "w1"},
        "X-Model-Version not an int": {"X-Worker-Id": "w1", "X-Model-Version": "abc"},
        "X-Model-Version negative": {"X-Worker-Id": "w1", "X-Model-Version": "-20"},
        "X-Model-Version from the future": {"X-Worker-Id": "w1",
                                            "X-Model-Version": str(int(version) + 1000)},
        "X-Worker-Id missing": {"X-Model-Version": version},
        "X-Worker-Id with a space": {"X-Worker-Id": "w 1", "X-Model-Version": version},
        "X-A3C-Seq 0": {"X-Worker-Id": "w1", "X-Model-Version": version, "X-A3C-Seq": "0"},
    }.items():
        reply = master.post("/gradients", content=zeros, headers={**OCTET, **headers})
        assert_refused(reply, label, ("x-model-version", "version", "x-worker-id", "x-a3c-seq"))
    for label, query in {"temporary not a bool": "worker_id=w1&temporary=maybe",
                         "worker_id missing": "temporary=false"}.items():
        reply = master.post(f"/local_model_weights?{query}", content=zeros, headers=OCTET)
        assert_refused(reply, label, ("temporary", "worker_id"), 422)

    tried = 0
    for path, cases in BAD_JSON_BODIES.items():
        for label, body, names in cases:
            assert_refused(master.post(path, content=body, headers=JSON), f"{path} [{label}]",
                           names)
            tried += 1
    assert tried > 80
    after = snapshot(master)
    assert after == before

    # The same routes take well-formed input: the checks are not "refuse everything".
    reply = master.post("/local_model_weights?worker_id=w1&temporary=true", content=zeros,
                        headers=OCTET)
    assert reply.status_code == 200, reply.text
    reply = master.post("/gradients", content=zeros, headers=grad)
    assert reply.status_code == 200, reply.text
    assert int(reply.headers["X-Model-Version"]) == int(version) + 1
    assert set(st_load(reply.content)) == set(good)


BAD_CONFIGS: list[tuple[str, Any, tuple[str, ...]]] = [
    ("unknown field", {"bogus_field": 1}, ("bogus_field",)),
    ("num_envs 0", {"num_envs": 0}, ("num_envs",)),
    ("num_envs negative", {"num_envs": -2}, ("num_envs",)),
    ("num_envs string", {"num_envs": "many"}, ("num_envs",)),
    ("num_envs float", {"num_envs": 1.5}, ("num_envs",)),
    ("lr negative", {"lr": -0.1}, ("lr",)),
    ("lr NaN", b'{"lr": NaN}', ("lr",)),
    ("lr Infinity", b'{"lr": Infinity}', ("lr",)),
    ("target_return Infinity", b'{"target_return": Infinity}', ("target_return",)),
    ("gamma > 1", {"gamma": 1.5}, ("gamma",)),
    ("gae_lambda > 1", {"gae_lambda": 2}, ("gae_lambda",)),
    ("t_max 0", {"t_max": 0}, ("t_max",)),
    ("max_grad_norm negative", {"max_grad_norm": -1}, ("max_grad_norm",)),
    ("algo unknown", {"algo": "telepathy"}, ("algo",)),
    ("sync_mode unknown", {"sync_mode": "telepathy"}, ("sync_mode",)),
    ("another algo's field", {"n_epochs": 4}, ("n_epochs",)),
    ("max_staleness negative", {"max_staleness": -1}, ("max_staleness",)),
    ("max_episodes negative", {"max_episodes": -5}, ("max_episodes",)),
    ("max_steps negative", {"max_steps": -1}, ("max_steps",)),
    ("hidden_sizes [0]", {"hidden_sizes": [0]}, ("hidden_sizes",)),
    ("hidden_sizes string", {"hidden_sizes": "64"}, ("hidden_sizes",)),
    ("env_kwargs list", {"env_kwargs": [1]}, ("env_kwargs",)),
    ("seed string", {"seed": "abc"}, ("seed",)),
    ("target_return string", {"target_return": "x"}, ("target_return",)),
    ("timeout below interval", {"heartbeat_interval_s": 5, "heartbeat_timeout_s": 1},
     ("heartbeat_timeout_s",)),
    ("heartbeat_interval_s 0", {"heartbeat_interval_s": 0}, ("heartbeat_interval_s",)),
    ("unknown env", {"env_id": "NoSuchEnv-v9"}, ("env_id",)),
    ("module not allowed", {"env_id": "os:Evil-v0"}, ("A3C_ENV_MODULES",)),
    ("workers not a list", {"workers": "127.0.0.1:1"}, ("workers",)),
    ("workers of ints", {"workers": [42]}, ("workers",)),
    ("master_url int", {"master_url": 5}, ("master_url",)),
    ("bad JSON", b'{"num_envs": ', BAD_JSON),
    ("JSON array", b"[1, 2]", ("object", "dict", "valid")),
    ("JSON null", b"null", ("object", "dict", "null", "valid")),
]


def test_an_environment_whose_packages_are_missing_says_how_to_install_them(
    tmp_path: Path, standin: StandInWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gymnasium's own hint (pip install "gymnasium[box2d]") is not how this project installs."""
    without_box2d(monkeypatch)
    with TestClient(create_master(settings(tmp_path)), client=LOOPBACK, headers=AUTH) as c:
        starts = len(standin.starts())
        reply = c.post("/train", json={"workers": [standin.url], "env_id": "LunarLander-v3"})
        assert reply.status_code == 422, reply.text
        detail = reply.json()["detail"]
        assert detail.startswith("env_id: LunarLander-v3 needs the packages of the box2d extra")
        assert "./scripts/setup_venv.sh box2d" in detail and "a3c-http[box2d]" in detail
        assert "gymnasium[box2d]" not in detail
        assert c.get("/status").json()["state"] == "idle"
    assert len(standin.starts()) == starts


def test_a_bad_config_is_422_naming_the_field_and_starts_nothing(
    tmp_path: Path, standin: StandInWorker
) -> None:
    with TestClient(create_master(settings(tmp_path)), client=LOOPBACK, headers=AUTH) as c:
        before = snapshot(c)
        starts = len(standin.starts())
        for label, body, names in BAD_CONFIGS:
            if isinstance(body, bytes):
                reply = c.post("/train", content=body, headers=JSON)
                assert_refused(reply, label, names)
            else:
                reply = c.post("/train", json={"workers": [standin.url], **body})
                assert_refused(reply, label, names, 422)
        assert snapshot(c) == before
        assert c.get("/status").json()["state"] == "idle"
    assert len(standin.starts()) == starts, "a refused /train started a worker"
