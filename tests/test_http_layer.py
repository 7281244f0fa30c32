"""What the HTTP layer of both services does to every request before (or instead of) the routes:
the token on every route and method, the body limit with and without a Content-Length, malformed
bodies, headers and configs refused with a 4xx that names the problem and changes nothing, and
the master's calls to the workers it starts. In-process (TestClient); the workers a master starts
are stand-ins (`a3c_http.localcluster.StandInWorker`), reached over loopback by the real launcher.

One real-process check of the token and of the body limit is in test_integration.py."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from a3c_http.config import Settings
from a3c_http.localcluster import free_port
from a3c_http.standin import StandInWorker
from master.app import create_app as create_master
from master.routes_view import PUBLIC_PATHS
from tests.support import AUTH, OCTET, TOKEN, bad_tensor_bodies, registry, snapshot
from worker.app import create_app as create_worker

LOOPBACK = ("127.0.0.1", 50000)
LIMIT = 256 * 1024  # above every well-formed body of the default model, pickled ones too
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
JSON = {"Content-Type": "application/json"}
# Paths beyond the schema's that must be refused the same way: docs, unknown, tricky spellings.
EXTRA_PATHS = ("/openapi.json", "/docs", "/redoc", "/", "/no/such/route", "/healthz/../status",
               "/STATUS")
# Every way of not presenting the token.
WRONG_CREDENTIALS = {
    "wrong token": "Bearer not-the-token",
    "token + suffix": f"Bearer {TOKEN}x",
    "token prefix": f"Bearer {TOKEN[:-1]}",
    "basic scheme": "Basic " + base64.b64encode(f"user:{TOKEN}".encode()).decode(),
    "token scheme": f"Token {TOKEN}",
    "raw token": TOKEN,
    "empty bearer": "Bearer",
}
# A well-formed body per mutating route: a service that validated before it authenticated would
# act on these instead of answering 401.
GOOD_BODIES: dict[str, Any] = {
    "/episode": {"worker_id": "intruder", "reward": 1e6, "length": 5},
    "/best_score": {"data": 1e6, "worker_id": "intruder"},
    "/global_episode": {"data": 1000},
    "/global_moving_average": {"data": 1e6},
    "/queue": {"data": 1e6},
    "/worker_started": {"worker_id": "intruder", "url": "http://127.0.0.1:9"},
    "/worker_done": {"worker_id": "intruder"},
    "/heartbeat": {"worker_id": "intruder"},
    "/train": {"workers": ["127.0.0.1:9"]},
    "/start_worker": {"master_url": "http://127.0.0.1:9", "worker_id": "intruder",
                      "config": {"num_envs": 1}},
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("A3C_TOKEN", "A3C_MAX_BODY_BYTES", "A3C_MASTER_URL", "A3C_MASTER_RETRY_S"):
        monkeypatch.delenv(name, raising=False)


def settings(tmp_path: Path, **overrides: Any) -> Settings:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "workers.txt").write_text("")
    values: dict[str, Any] = {"token": TOKEN, "run_dir": tmp_path / "run",
                              "workers_file": tmp_path / "workers.txt", **overrides}
    return Settings(**values)


def start_run(c: TestClient, workers: list[str], **config: Any) -> dict[str, Any]:
    body = {"workers": workers, "heartbeat_timeout_s": 3600, "seed": 1, **config}
    reply = c.post("/train", json=body)
    assert reply.status_code == 202, reply.text
    return reply.json()["data"]


@pytest.fixture
def master(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, standin: StandInWorker
) -> Iterator[TestClient]:
    """A master with the token and a body limit of LIMIT, running a run whose only worker is the
    stand-in (it never reports: every counter is the test's)."""
    monkeypatch.setenv("A3C_MAX_BODY_BYTES", str(LIMIT))
    with TestClient(create_master(settings(tmp_path)), client=LOOPBACK, headers=AUTH) as c:
        start_run(c, [standin.url])
        yield c


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("A3C_MAX_BODY_BYTES", str(LIMIT))
    with TestClient(create_worker(token=TOKEN), client=LOOPBACK, headers=AUTH) as c:
        yield c


def open_paths(c: TestClient) -> set[str]:
    """The paths open to GET and HEAD: /healthz, and the master's dashboard page and files."""
    return {"/healthz", *(PUBLIC_PATHS if hasattr(c.app.state, "cluster") else ())}


def routes(c: TestClient) -> list[str]:
    """Every path but the open ones."""
    return sorted({*c.app.openapi()["paths"], *EXTRA_PATHS} - open_paths(c))


def refusals(c: TestClient) -> tuple[int, list[str]]:
    """Send, without the right token: every method to every path (with a well-formed body where
    one fits), every wrong credential to every path, and the token in the query string. Returns
    (requests sent, every answer that was not a proper 401)."""
    problems: list[str] = []
    sent = 0

    def check(method: str, path: str, label: str, **kwargs: Any) -> None:
        nonlocal sent
        sent += 1
        reply = c.request(method, path, **kwargs)
        what = f"{method} {path} ({label}): {reply.status_code} {reply.text[:100]}"
        if reply.status_code != 401:
            problems.append(what)
        elif reply.headers.get("www-authenticate") != "Bearer":
            problems.append(f"{what} without WWW-Authenticate: Bearer")
        elif method != "HEAD" and "A3C_TOKEN" not in reply.json()["detail"]:
            problems.append(f"{what}: the detail does not name A3C_TOKEN")

    none = {"Authorization": ""}  # overrides the client's own header: no credential at all
    opened = open_paths(c)
    for path in [*routes(c), *sorted(opened)]:
        body = GOOD_BODIES.get(path.split("?")[0])
        for method in METHODS:
            if path in opened and method in ("GET", "HEAD"):
                continue
            json_body = body if method in ("POST", "PUT", "PATCH") else None
            check(method, path, "no token", headers=none, json=json_body)
    for path in routes(c):
        body = GOOD_BODIES.get(path)
        method = "POST" if body is not None or "weights" in path or path == "/gradients" else "GET"
        for label, value in WRONG_CREDENTIALS.items():
            check(method, path, label, headers={"Authorization": value}, json=body)
    check("GET", f"/status?token={TOKEN}&access_token={TOKEN}", "token in the query",
          headers=none)
    return sent, problems


def test_every_route_and_method_of_the_master_needs_the_token(master: TestClient) -> None:
    before = snapshot(master)
    sent, problems = refusals(master)
    assert sent > 300 and not problems, "\n".join(problems)
    # Nothing they carried reached the state.
    after = snapshot(master)
    assert after == before
    assert "intruder" not in registry(master.get("/status").json())
    assert master.get("/healthz", headers={"Authorization": ""}).json() == {"status": "ok"}
    # With the token no route is refused for it (some for their own reasons), none fails.
    for path in master.app.openapi()["paths"]:
        for method in master.app.openapi()["paths"][path]:
            reply = master.request(method.upper(), path)
            assert reply.status_code not in (401, 403) and reply.status_code < 500, (
                method, path, reply.status_code, reply.text[:200])
    assert master.get("/no/such/route").status_code == 404


def test_every_route_and_method_of_the_worker_needs_the_token(worker: TestClient) -> None:
    sent, problems = refusals(worker)
    assert sent > 100 and not problems, "\n".join(problems)
    status = worker.get("/status").json()
    assert status["state"] == "idle" and status["worker_id"] != "intruder", status
    assert worker.get("/healthz", headers={"Authorization": ""}).json() == {"status": "ok"}
    assert worker.get("/openapi.json").status_code == 200
    assert worker.get("/no/such/route").status_code == 404


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


BAD_JSON = ("json", "decode", "body", "expecting")
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
    ("sync_mode unknown", {"sync_mode": "telepathy"}, ("sync_mode",)),
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


# -- the master's calls to its workers ---------------------------------------------------------


def test_train_calls_each_worker_with_the_token_the_run_and_its_own_url(
    tmp_path: Path, standin: StandInWorker
) -> None:
    with StandInWorker(token=TOKEN) as other, TestClient(
        create_master(settings(tmp_path)), client=LOOPBACK, headers=AUTH
    ) as c:
        before_a, before_b = len(standin.starts()), len(other.starts())
        bare = other.url.removeprefix("http://")  # both forms of a worker's address
        data = start_run(c, [standin.url, bare], seed=5)
        assert isinstance(data["run_id"], str) and data["run_id"]
        assert [(e["url"], e["started"], e["error"]) for e in data["workers"]] == [
            (standin.url, True, None), (other.url, True, None)], data
        (a,), (b,) = standin.starts()[before_a:], other.starts()[before_b:]
        for start in (a, b):
            assert start["headers"]["authorization"] == f"Bearer {TOKEN}", start["headers"]
            # Without A3C_MASTER_URL or "master_url", the URL /train was addressed to.
            assert start["body"]["master_url"].rstrip("/") in (
                "http://testserver", "http://testserver:80"), start
            assert start["body"]["run_id"] == data["run_id"]
            assert start["body"]["config"]["seed"] == 5
        assert [a["body"]["worker_id"], b["body"]["worker_id"]] == ["w1", "w2"]

        again = c.post("/train", json={"workers": [standin.url]})
        assert again.status_code == 409, again.text
        assert len(standin.starts()) == before_a + 1
        assert c.get("/status").json()["run_id"] == data["run_id"]

        # "master_url" in the body is what the workers are given.
        assert c.post("/stop").status_code == 200
        start_run(c, [standin.url], master_url="http://localhost:4321")
        assert standin.starts()[-1]["body"]["master_url"].rstrip("/") == "http://localhost:4321"
    # A3C_MASTER_URL, when set, is.
    alias = "http://master.example:4321"
    with TestClient(create_master(settings(tmp_path / "2", master_url=alias)), client=LOOPBACK,
                    headers=AUTH) as c:
        start_run(c, [standin.url])
        assert standin.starts()[-1]["body"]["master_url"].rstrip("/") == alias


def test_a_worker_that_cannot_be_started_is_reported_and_the_run_goes_on(
    tmp_path: Path, standin: StandInWorker
) -> None:
    unreachable = f"http://127.0.0.1:{free_port()}"
    with StandInWorker(token="another-token") as refusing, TestClient(
        create_master(settings(tmp_path)), client=LOOPBACK, headers=AUTH
    ) as c:
        ok, refused, dead = start_run(c, [standin.url, refusing.url, unreachable])["workers"]
        assert ok["started"] is True and ok["error"] is None, ok
        assert refused["started"] is False, refused
        assert "401" in refused["error"] and "A3C_TOKEN" in refused["error"], refused
        assert dead["started"] is False and dead["error"], dead
        s = c.get("/status").json()
        assert s["state"] == "running", s
        states = {w["url"]: w["state"] for w in s["workers"]}
        assert states == {standin.url: "starting", refusing.url: "failed", unreachable: "failed"}
        # A master whose only worker refuses its token has nobody to run the run.
        assert c.post("/stop").status_code == 200
        (only,) = start_run(c, [refusing.url])["workers"]
        assert only["started"] is False and "401" in only["error"], only
        s = c.get("/status").json()
        assert s["state"] == "finished" and s["finish_reason"] == "no worker could be started"
        assert s["workers"][0]["state"] == "failed" and "401" in s["workers"][0]["error"]
