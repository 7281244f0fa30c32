"""Load, auth and bad input on real processes: a master (and a worker) under uvicorn with a token.
Each test prints the figures it measured (`pytest -s`)."""

from __future__ import annotations

import io
import json
import pickle
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from a3c_http.localcluster import ServiceProcess, free_port
from a3c_http.store import RunStore
from tests.support import StandInWorker

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
OCTET = {"Content-Type": "application/octet-stream"}
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
SMALL_LIMIT = 256 * 1024
# What counts for "nothing changed": every counter and the weights.
COUNTERS = (
    "state",
    "global_episode",
    "global_steps",
    "best_score",
    "moving_average",
    "mean_return_100",
    "model_version",
    "updates_applied",
    "queue_length",
    "queue_dropped",
)


@dataclass
class Master:
    proc: ServiceProcess
    http: httpx.Client
    run_dir: Path

    @property
    def url(self) -> str:
        return self.proc.url

    def status(self) -> dict:
        return self.http.get(f"{self.url}/status").json()

    def weights(self) -> httpx.Response:
        return self.http.get(f"{self.url}/global_model_weights")


@contextmanager
def running_master(folder: Path) -> Iterator[Master]:
    """A master with a token and a small body limit, running a run whose only worker is a
    stand-in that never reports: the run stays running and the test plays the workers."""
    standin = StandInWorker()
    proc = ServiceProcess(
        "master.app:app",
        free_port(),
        folder / "master.log",
        token=TOKEN,
        env={
            "A3C_RUN_DIR": str(folder / "run"),
            "A3C_WORKERS_FILE": str(folder / "none.txt"),
            "A3C_MAX_BODY_BYTES": str(SMALL_LIMIT),
            "A3C_PERSIST_INTERVAL_S": "3600",
        },
    ).start()
    http = httpx.Client(headers=AUTH, timeout=30)
    try:
        proc.wait_healthy()
        body = {"workers": [standin.url], "seed": 3, "max_staleness": 100_000,
                "heartbeat_timeout_s": 3600}
        assert http.post(f"{proc.url}/train", json=body).status_code == 202
        yield Master(proc, http, folder / "run")
    finally:
        http.close()
        proc.stop()
        standin.close()
        assert not proc.running()


@pytest.fixture
def master(tmp_path: Path) -> Iterator[Master]:
    """A master of this test's own, for tests that change its state."""
    with running_master(tmp_path) as m:
        yield m


@pytest.fixture(scope="module")
def shared_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Master]:
    """One master for the tests whose requests must all be refused: they leave it as it was."""
    with running_master(tmp_path_factory.mktemp("shared")) as m:
        yield m


# -- no lost updates -----------------------------------------------------------------------------


def test_concurrent_clients_lose_no_update(master: Master) -> None:
    threads, per_thread = 16, 40
    rewards = {
        (t, i): float((t * 7919 + i * 104729) % 1000) / 4 for t in range(threads)
        for i in range(per_thread)
    }
    initial = master.weights()
    spec = {name: t.shape for name, t in st_load(initial.content).items()}
    grads = st_save({name: torch.full(shape, 1e-3) for name, shape in spec.items()})
    accepted = {"episodes": 0, "updates": 0, "increments": 0}
    lock = threading.Lock()

    def reporter(t: int) -> None:
        with httpx.Client(headers=AUTH, timeout=30) as c:
            for i in range(per_thread):
                r = c.post(
                    f"{master.url}/episode",
                    json={"worker_id": f"load{t}", "reward": rewards[(t, i)], "length": i + 1},
                    headers={"X-A3C-Seq": str(i + 1)},
                )
                assert r.status_code == 200, r.text
                with lock:
                    accepted["episodes"] += 1

    def pusher(t: int) -> None:
        version = int(initial.headers["X-Model-Version"])
        with httpx.Client(headers=AUTH, timeout=30) as c:
            for i in range(25):
                headers = {**OCTET, "X-Worker-Id": f"push{t}", "X-Model-Version": str(version),
                           "X-A3C-Seq": str(i + 1)}
                r = c.post(f"{master.url}/gradients", content=grads, headers=headers)
                assert r.status_code == 200, r.text
                version = int(r.headers["X-Model-Version"])
                with lock:
                    accepted["updates"] += 1

    def incrementer(t: int) -> None:
        with httpx.Client(headers=AUTH, timeout=30) as c:
            for _ in range(25):
                assert c.post(f"{master.url}/global_episode").status_code == 200
                with lock:
                    accepted["increments"] += 1

    jobs = [(reporter, t) for t in range(threads)] + [(pusher, t) for t in range(4)]
    jobs += [(incrementer, t) for t in range(4)]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        for future in [pool.submit(fn, t) for fn, t in jobs]:
            future.result(timeout=300)

    s = master.status()
    sent = sum(accepted.values())
    expected_episodes = accepted["episodes"] + accepted["increments"]
    lost = (
        expected_episodes - s["global_episode"]
        + accepted["updates"] - s["updates_applied"]
    )
    print(f"\n[load] {sent} requests from {len(jobs)} concurrent clients, {lost} updates lost")
    assert accepted["episodes"] == threads * per_thread
    assert s["global_episode"] == expected_episodes
    assert s["global_steps"] == threads * sum(range(1, per_thread + 1))
    assert s["best_score"] == max(rewards.values())
    assert s["queue_length"] == threads * per_thread
    assert s["updates_applied"] == accepted["updates"] == 100
    assert s["model_version"] == int(initial.headers["X-Model-Version"]) + 100
    for t in range(threads):
        record = next(w for w in s["workers"] if w["worker_id"] == f"load{t}")
        assert (record["episodes"], record["last_seq"]) == (per_thread, per_thread)

    # The history holds every report once, in the order the master took them: folding it again
    # gives exactly the moving average and the mean of the last 100 the master has.
    assert master.proc.stop() in (0, -signal.SIGTERM)  # SIGTERM persists
    rows = RunStore(master.run_dir).read_episodes()
    assert len(rows) == threads * per_thread
    assert sorted((r["worker_id"], r["reward"]) for r in rows) == sorted(
        (f"load{t}", reward) for (t, _), reward in rewards.items()
    )
    average = None
    for r in rows:
        average = r["reward"] if average is None else 0.99 * average + 0.01 * r["reward"]
    assert average == s["moving_average"]
    last100 = [r["reward"] for r in rows[-100:]]
    assert sum(last100) / 100 == s["mean_return_100"]


# -- auth -----------------------------------------------------------------------------------------


def routes_of(url: str) -> list[tuple[str, str]]:
    schema = httpx.get(f"{url}/openapi.json", headers=AUTH, timeout=30).json()
    return [
        (method.upper(), path)
        for path, ops in schema["paths"].items()
        for method in ops
    ]


def assert_refused(reply: httpx.Response, what: str) -> None:
    assert reply.status_code == 401, f"{what}: {reply.status_code} {reply.text[:200]}"
    assert reply.headers.get("www-authenticate") == "Bearer", what
    if reply.request.method != "HEAD":
        assert "A3C_TOKEN" in reply.json()["detail"], what


def test_every_route_and_method_needs_the_token(
    shared_master: Master, tmp_path: Path
) -> None:
    master = shared_master
    worker = ServiceProcess(
        "worker.app:app", free_port(), tmp_path / "worker.log", token=TOKEN
    ).start()
    anonymous = httpx.Client(timeout=30)  # one client: its connections are reused
    try:
        worker.wait_healthy()
        tried = 0
        for url in (master.url, worker.url):
            paths = {path for _, path in routes_of(url)} | {"/no/such/path", "/openapi.json",
                                                            "/docs"}
            for path in sorted(paths):
                for method in METHODS:
                    if path == "/healthz" and method in ("GET", "HEAD"):
                        continue
                    for headers in (
                        {},
                        {"Authorization": "Bearer wrong"},
                        {"Authorization": f"Basic {TOKEN}"},
                        {"Authorization": TOKEN},
                    ):
                        reply = anonymous.request(
                            method, f"{url}{path}", headers=headers, content=b"{}"
                        )
                        assert_refused(reply, f"{method} {url}{path} with {headers}")
                        tried += 1
            assert httpx.get(f"{url}/healthz", timeout=30).status_code == 200
            assert httpx.get(f"{url}/status", headers=AUTH, timeout=30).status_code == 200
        print(f"\n[auth] {tried} requests without the right token, every one 401")
    finally:
        anonymous.close()
        worker.stop()
    # Nothing of it reached the state.
    assert master.status()["global_episode"] == 0


def test_the_master_does_not_start_a_worker_that_refuses_its_token(
    master: Master, tmp_path: Path
) -> None:
    other = ServiceProcess(
        "worker.app:app", free_port(), tmp_path / "other.log", token="another-token"
    ).start()
    try:
        other.wait_healthy()
        master.http.post(f"{master.url}/stop")
        reply = master.http.post(f"{master.url}/train", json={"workers": [other.url]})
        assert reply.status_code == 202, reply.text
        (started,) = reply.json()["data"]["workers"]
        assert started["started"] is False
        assert "401" in started["error"] and "A3C_TOKEN" in started["error"]
        s = master.status()
        assert s["state"] == "finished" and s["finish_reason"] == "no worker could be started"
        assert s["workers"][0]["state"] == "failed" and "401" in s["workers"][0]["error"]
        assert httpx.get(f"{other.url}/status", headers={"Authorization": "Bearer another-token"},
                         timeout=30).json()["state"] == "idle"
    finally:
        other.stop()


# -- bounded, validated input --------------------------------------------------------------------


def snapshot(master: Master) -> tuple[dict, bytes, str]:
    s = master.status()
    w = master.weights()
    return {k: s[k] for k in COUNTERS}, w.content, w.headers["X-Model-Version"]


def test_oversized_bodies_are_413_with_or_without_a_length(shared_master: Master) -> None:
    master = shared_master
    before = snapshot(master)
    big = b"\0" * (SMALL_LIMIT + 1)

    def chunks() -> Iterator[bytes]:
        for _ in range(8):
            yield b"\0" * (SMALL_LIMIT // 4)

    headers = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": "0"}
    for content in (big, chunks()):
        reply = master.http.post(f"{master.url}/gradients", content=content, headers=headers)
        assert reply.status_code == 413, reply.text
        assert "A3C_MAX_BODY_BYTES" in reply.json()["detail"]
    reply = master.http.post(f"{master.url}/episode", content=b"[" * (SMALL_LIMIT + 1),
                             headers={"Content-Type": "application/json"})
    assert reply.status_code == 413
    assert snapshot(master) == before


def bad_tensor_bodies(good: dict[str, torch.Tensor]) -> dict[str, bytes]:
    name, first = next(iter(good.items()))
    encoded = st_save(good)
    bodies = {
        "empty": b"",
        "not safetensors": b"hello, weights",
        "json": json.dumps({"weights": [1, 2, 3]}).encode(),
        "pickle": pickle.dumps({k: v.tolist() for k, v in good.items()}),
        "torch.save": _torch_save(good),
        "truncated": encoded[: len(encoded) // 2],
        "header only": encoded[:8],
        "huge header length": (2**40).to_bytes(8, "little") + b"{}",
        "a name missing": st_save({k: v for k, v in good.items() if k != name}),
        "an extra name": st_save({**good, "extra.weight": torch.zeros(2)}),
        "wrong shape": st_save({**good, name: torch.zeros(first.numel() + 1)}),
        "float64": st_save({**good, name: first.double()}),
        "int32": st_save({**good, name: first.int()}),
        "NaN": st_save({**good, name: torch.full_like(first, float("nan"))}),
        "Inf": st_save({**good, name: torch.full_like(first, float("inf"))}),
    }
    return bodies


def _torch_save(tensors: dict[str, torch.Tensor]) -> bytes:
    buf = io.BytesIO()
    torch.save(tensors, buf)
    return buf.getvalue()


JSON_CASES = [
    ("/episode", b"{not json"),
    ("/episode", b'{"worker_id": "w1", "reward": NaN, "length": 3}'),
    ("/episode", b'{"worker_id": "w1", "reward": Infinity, "length": 3}'),
    ("/episode", b'{"worker_id": "w1", "reward": 1e999, "length": 3}'),
    ("/episode", b'{"worker_id": "w1", "reward": 1.0, "length": 0}'),
    ("/episode", b'{"worker_id": "w1", "reward": 1.0, "length": -5}'),
    ("/episode", b'{"worker_id": "w1", "reward": "1.0", "length": 3}'),
    ("/episode", b'{"worker_id": "w1", "reward": true, "length": 3}'),
    ("/episode", b'{"worker_id": "", "reward": 1.0, "length": 3}'),
    ("/episode", b'{"worker_id": "w1", "reward": 1.0, "length": 3, "extra": 1}'),
    ("/episode", b'{"worker_id": "w1", "length": 3}'),
    ("/episode", b"[]"),
    ("/episode", b"\xff\xfe"),
    ("/best_score", b'{"data": NaN}'),
    ("/best_score", b'{"data": false}'),
    ("/global_moving_average", b'{"data": -Infinity}'),
    ("/global_moving_average", b'{"data": null}'),
    ("/queue", b'{"data": "x"}'),
    ("/global_episode", b'{"data": 0}'),
    ("/global_episode", b'{"data": -3}'),
    ("/global_episode", b'{"data": 1e20}'),
    ("/heartbeat", b'{"worker_id": "w1", "steps_per_s": -1}'),
    ("/heartbeat", b'{"worker_id": "w1", "metrics": {"x": NaN}}'),
    ("/worker_started", b'{"worker_id": "bad id with spaces"}'),
    ("/worker_done", b'{"worker_id": "w1", "error": 5}'),
    ("/train", b'{"lr": -1}'),
    ("/train", b'{"num_envs": 0}'),
    ("/train", b'{"hidden_sizes": [0]}'),
    ("/train", b'{"unknown_field": 1}'),
    ("/train", b'{"gamma": 2}'),
    ("/train", b'{"sync_mode": "telepathy"}'),
]


def test_malformed_bodies_are_4xx_that_say_why_and_change_nothing(
    shared_master: Master,
) -> None:
    master = shared_master
    before = snapshot(master)
    good = st_load(master.weights().content)
    tried = server_errors = 0
    version = before[2]
    for what, body in bad_tensor_bodies(good).items():
        for path, params in (
            ("/gradients", {}),
            ("/local_model_weights", {"worker_id": "w1", "temporary": "false"}),
            ("/local_model_weights", {"worker_id": "w1", "temporary": "true"}),
        ):
            headers = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": version}
            reply = master.http.post(
                f"{master.url}{path}", params=params, content=body, headers=headers
            )
            tried += 1
            server_errors += reply.status_code >= 500
            assert 400 <= reply.status_code < 500, f"{what} to {path}: {reply.status_code}"
            assert reply.json()["detail"], f"{what} to {path}: no reason given"
    for path, body in JSON_CASES:
        reply = master.http.post(
            f"{master.url}{path}", content=body, headers={"Content-Type": "application/json"}
        )
        tried += 1
        server_errors += reply.status_code >= 500
        assert 400 <= reply.status_code < 500, f"{body!r} to {path}: {reply.status_code}"
        assert reply.json()["detail"], f"{body!r} to {path}: no reason given"
    # Headers that are not what they should be.
    encoded = st_save(good)
    for headers in (
        {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": "abc"},
        {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": "-1"},
        {**OCTET, "X-Model-Version": version},
        {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": version, "X-A3C-Seq": "0"},
    ):
        reply = master.http.post(f"{master.url}/gradients", content=encoded, headers=headers)
        tried += 1
        server_errors += reply.status_code >= 500
        assert reply.status_code == 422, headers
    print(f"\n[bad input] {tried} malformed requests, {server_errors} answered 5xx")
    assert snapshot(master) == before


def test_a_named_problem_for_each_kind_of_bad_tensor(shared_master: Master) -> None:
    master = shared_master
    rejected = master.status()["updates_rejected"]
    good = st_load(master.weights().content)
    version = master.weights().headers["X-Model-Version"]
    expected_words = {
        "pickle": "safetensors",
        "torch.save": "safetensors",
        "truncated": "safetensors",
        "a name missing": "missing",
        "an extra name": "extra",
        "wrong shape": "shape",
        "float64": "float32",
        "int32": "float32",
        "NaN": "finite",
        "Inf": "finite",
    }
    bodies = bad_tensor_bodies(good)
    for what, word in expected_words.items():
        headers = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": version}
        reply = master.http.post(f"{master.url}/gradients", content=bodies[what], headers=headers)
        assert reply.status_code == 422, what
        assert word in reply.json()["detail"].lower(), (what, reply.json()["detail"])
    assert master.status()["updates_rejected"] == rejected + len(expected_words)
