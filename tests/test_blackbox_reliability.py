"""Black-box reliability and security tests: real uvicorn processes, HTTP only.

Written from the contract (../shared/API.md) and the README (configuration, "Security", "What
happens when"), never from the implementation. Every process is started as a user would
(``python -m uvicorn master.app:app`` / ``worker.app:app`` with the README's environment
variables) and ended by its pid at teardown.

Run with ``pytest tests/test_blackbox_reliability.py -q -s`` to see the figures it prints.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from bb_support import (
    Service,
    Services,
    StubWorker,
    load_safetensors,
    pickle_bytes,
    poll,
    safetensors_bytes,
    torch_save_bytes,
)

pytestmark = pytest.mark.integration

MAX_BODY = 65536
POLL_S = 60.0  # generous: the machine has two cores and other suites may run at once

# A short CartPole run for real workers. target_return is out of reach so that only the test
# (or max_episodes) ends it.
SHORT_RUN: dict[str, Any] = {
    "num_envs": 2,
    "max_steps": None,
    "heartbeat_interval_s": 0.5,
    "heartbeat_timeout_s": 3,
    "target_return": 1e9,
    "seed": 7,
}


def say(msg: str) -> None:
    print(f"\n[bb-reliability] {msg}", flush=True)


# ----------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    svcs = Services(tmp_path)
    try:
        yield svcs
    finally:
        svcs.close()


def _master_env(run_dir: Path, **extra: str) -> dict[str, str]:
    workers_file = run_dir.parent / f"{run_dir.name}-workers.txt"
    workers_file.write_text("# no worker: every run of this suite names its workers\n")
    env = {"A3C_RUN_DIR": str(run_dir), "A3C_WORKERS_FILE": str(workers_file)}
    env.update(extra)
    return env


class TokenCluster:
    def __init__(self, master: Service, worker: Service, other: Service, token: str) -> None:
        self.master = master
        self.worker = worker  # same token as the master
        self.other = other  # a different token
        self.token = token


@pytest.fixture(scope="module")
def token_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenCluster]:
    tmp = tmp_path_factory.mktemp("token-cluster")
    token = secrets.token_urlsafe(32)
    svcs = Services(tmp)
    try:
        master = svcs.master(_master_env(tmp / "run", A3C_TOKEN=token), name="master")
        worker = svcs.worker(
            {"A3C_TOKEN": token, "A3C_MAX_BODY_BYTES": str(MAX_BODY)}, name="worker-good"
        )
        other = svcs.worker({"A3C_TOKEN": secrets.token_urlsafe(32)}, name="worker-other")
        for svc in (master, worker, other):
            svc.wait_healthy()
        yield TokenCluster(master, worker, other, token)
    finally:
        svcs.close()


class Hardened:
    """A master with a token and a small body limit, holding a running run whose only worker
    is an in-process stub (so that no real worker changes any counter)."""

    def __init__(self, master: Service, stub: StubWorker, client: httpx.Client) -> None:
        self.master = master
        self.stub = stub
        self.c = client


@pytest.fixture(scope="module")
def hardened(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hardened]:
    tmp = tmp_path_factory.mktemp("hardened")
    token = secrets.token_urlsafe(32)
    svcs = Services(tmp)
    stub = StubWorker()
    client: httpx.Client | None = None
    try:
        master = svcs.master(
            _master_env(tmp / "run", A3C_TOKEN=token, A3C_MAX_BODY_BYTES=str(MAX_BODY))
        )
        master.wait_healthy()
        client = master.client()
        cfg = dict(SHORT_RUN, heartbeat_timeout_s=300, workers=[stub.url])
        r = client.post("/train", json=cfg)
        assert r.status_code == 202, r.text
        started = r.json()["data"]["workers"]
        assert [w["started"] for w in started] == [True], started
        assert client.get("/status").json()["state"] == "running"
        yield Hardened(master, stub, client)
    finally:
        if client is not None:
            client.close()
        stub.close()
        svcs.close()


# ----------------------------------------------------------------------------------------------
# helpers

COUNTERS = (
    "state",
    "run_id",
    "finish_reason",
    "global_episode",
    "global_steps",
    "best_score",
    "moving_average",
    "mean_return_100",
    "solved",
    "model_version",
    "updates_applied",
    "queue_length",
    "queue_dropped",
)


def snapshot(c: httpx.Client) -> dict[str, Any]:
    """Everything a bad request must leave untouched: counters, registry, global weights."""
    st = c.get("/status")
    assert st.status_code == 200, st.text
    s = st.json()
    snap = {k: s.get(k) for k in COUNTERS}
    snap["workers"] = sorted(
        (w["worker_id"], w["state"], w["episodes"], w["steps"]) for w in s["workers"]
    )
    w = c.get("/global_model_weights")
    assert w.status_code == 200, w.text
    snap["weights_version"] = w.headers.get("x-model-version")
    snap["weights_sha256"] = hashlib.sha256(w.content).hexdigest()
    return snap


def diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {k: (before[k], after.get(k)) for k in before if before[k] != after.get(k)}


def weights(c: httpx.Client) -> tuple[dict[str, torch.Tensor], int]:
    r = c.get("/global_model_weights")
    assert r.status_code == 200, r.text
    return load_safetensors(r.content), int(r.headers["x-model-version"])


def status(c: httpx.Client) -> dict[str, Any]:
    r = c.get("/status")
    assert r.status_code == 200, r.text
    return r.json()


def registry(s: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {w["worker_id"]: w for w in s["workers"]}


class Tally:
    """Counts the bad requests sent and collects every way they were mishandled."""

    def __init__(self) -> None:
        self.tried = 0
        self.server_errors = 0
        self.problems: list[str] = []

    def check(
        self,
        label: str,
        resp: httpx.Response,
        expect_any: tuple[str, ...] = (),
        statuses: tuple[int, ...] | None = None,
    ) -> None:
        self.tried += 1
        code = resp.status_code
        if code >= 500:
            self.server_errors += 1
        ok_status = code in statuses if statuses else 400 <= code < 500
        if not ok_status:
            want = statuses or "4xx"
            self.problems.append(f"{label}: status {code} (want {want}): {resp.text[:200]}")
            return
        try:
            body = resp.json()
        except ValueError:
            self.problems.append(f"{label}: {code} without a JSON body: {resp.text[:200]!r}")
            return
        if not isinstance(body, dict) or not body.get("detail"):
            self.problems.append(f"{label}: {code} body has no message: {resp.text[:200]}")
            return
        text = json.dumps(body).lower()
        if expect_any and not any(word.lower() in text for word in expect_any):
            self.problems.append(
                f"{label}: {code} message does not name the problem "
                f"(expected one of {expect_any}): {resp.text[:300]}"
            )


# ----------------------------------------------------------------------------------------------
# 1. authentication

CREDENTIALS_WRONG = {
    "no header": None,
    "wrong token": "Bearer not-the-token",
    "token + suffix": "Bearer {t}x",
    "token prefix": "Bearer {t_short}",
    "basic scheme": "Basic {basic}",
    "token scheme": "Token {t}",
    "raw token": "{t}",
    "empty bearer": "Bearer",
}
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")
MASTER_PATHS = (
    "/status",
    "/train",
    "/stop",
    "/best_score",
    "/global_episode",
    "/global_moving_average",
    "/create_queue",
    "/queue",
    "/worker_started",
    "/worker_done",
    "/workers_status",
    "/local_model_weights?worker_id=w1&temporary=false",
    "/global_model_weights",
    "/gradients",
    "/episode",
    "/heartbeat",
    "/openapi.json",
    "/docs",
    "/redoc",
    "/",
    "/no/such/route",
    "/healthz/../status",
    "/STATUS",
)
WORKER_PATHS = (
    "/status",
    "/start_worker",
    "/stop",
    "/openapi.json",
    "/docs",
    "/",
    "/no/such/route",
)
# A well-formed body per mutating route: a service that validated before it authenticated
# would answer these with 2xx instead of 401.
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
}


def _auth_header(template: str | None, token: str) -> dict[str, str]:
    if template is None:
        return {}
    basic = base64.b64encode(f"user:{token}".encode()).decode()
    value = template.format(t=token, t_short=token[:-1], basic=basic)
    return {"Authorization": value}


def _check_401(resp: httpx.Response, label: str, problems: list[str]) -> None:
    if resp.status_code != 401:
        problems.append(f"{label}: {resp.status_code} instead of 401: {resp.text[:120]}")
        return
    www = resp.headers.get("www-authenticate", "")
    if www.split(" ")[0].lower() != "bearer":
        problems.append(f"{label}: 401 without 'WWW-Authenticate: Bearer' (got {www!r})")


def _hammer_without_token(
    svc: Service, paths: tuple[str, ...], token: str, bodies: dict[str, Any]
) -> tuple[int, list[str]]:
    problems: list[str] = []
    sent = 0
    with httpx.Client(base_url=svc.url, timeout=30) as raw:
        # every method on every path, without a token
        for path in (*paths, "/healthz"):
            for method in METHODS:
                if path == "/healthz" and method in ("GET", "HEAD"):
                    continue  # GET /healthz is open; HEAD /healthz is not in the contract
                body = bodies.get(path.split("?")[0])
                kwargs: dict[str, Any] = {}
                if body is not None and method in ("POST", "PUT", "PATCH"):
                    kwargs["json"] = body
                resp = raw.request(method, path, **kwargs)
                sent += 1
                _check_401(resp, f"{svc.name} {method} {path} (no token)", problems)
        # every wrong credential on every path, with the method that would mutate
        for path in paths:
            method = "POST" if path.split("?")[0] in bodies or "weights" in path else "GET"
            body = bodies.get(path.split("?")[0])
            for label, template in CREDENTIALS_WRONG.items():
                resp = raw.request(method, path, headers=_auth_header(template, token), json=body)
                sent += 1
                _check_401(resp, f"{svc.name} {method} {path} ({label})", problems)
        # the token in the query string is not a credential
        resp = raw.get(f"/status?token={token}&access_token={token}")
        sent += 1
        _check_401(resp, f"{svc.name} GET /status?token=... (token in query)", problems)
    return sent, problems


def test_auth_master_every_route_and_method(token_cluster: TokenCluster) -> None:
    master, token = token_cluster.master, token_cluster.token
    with master.client() as c:
        before = snapshot(c) if status(c)["run_id"] else None
        first = status(c)

    sent, problems = _hammer_without_token(master, MASTER_PATHS, token, GOOD_BODIES)
    say(f"master auth: {sent} unauthenticated requests, {len(problems)} not refused properly")

    with httpx.Client(base_url=master.url, timeout=30) as raw:
        r = raw.get("/healthz")
        assert r.status_code == 200 and r.json() == {"status": "ok"}, r.text

    with master.client() as c:
        # nothing the refused requests carried had any effect
        after = status(c)
        for key in ("global_episode", "best_score", "moving_average", "queue_length", "run_id"):
            if after[key] != first[key]:
                problems.append(
                    f"unauthenticated requests changed {key}: {first[key]} -> {after[key]}"
                )
        if "intruder" in registry(after):
            problems.append("an unauthenticated POST registered worker 'intruder'")
        if before is not None and diff(before, snapshot(c)):
            problems.append(f"state changed: {diff(before, snapshot(c))}")

        # with the right token the routes work: read-only ones answer 200, and no route
        # answers 401 (mutations may be refused for their own reasons: no run yet, ...)
        for path in (
            "/status",
            "/openapi.json",
            "/docs",
            "/workers_status",
            "/best_score",
            "/global_episode",
            "/global_moving_average",
            "/global_model_weights",
        ):
            r = c.get(path)
            must_be_200 = path in ("/status", "/openapi.json", "/docs", "/workers_status")
            if (must_be_200 and r.status_code != 200) or r.status_code in (401, 403, 500):
                problems.append(f"GET {path} with the token: {r.status_code} {r.text[:100]}")
        for path in ("/global_episode", "/best_score", "/queue", "/heartbeat", "/episode"):
            r = c.post(
                path,
                json={"data": 1.0, "worker_id": "me", "reward": 1, "length": 1}
                if path != "/global_episode"
                else None,
            )
            if r.status_code in (401, 403) or r.status_code >= 500:
                problems.append(f"POST {path} with the token: {r.status_code} {r.text[:100]}")
        r = c.get("/no/such/route")
        assert r.status_code == 404, f"unknown path with the token: {r.status_code}"
        # the scheme is case-insensitive (RFC 9110 11.1)... not asserted: the README is silent

    assert not problems, "\n".join(problems)


def test_auth_worker_every_route_and_method(token_cluster: TokenCluster) -> None:
    worker, token = token_cluster.worker, token_cluster.token
    bodies = {
        "/start_worker": {
            "master_url": token_cluster.master.url,
            "worker_id": "intruder",
            "config": {"num_envs": 1},
        }
    }
    sent, problems = _hammer_without_token(worker, WORKER_PATHS, token, bodies)
    say(f"worker auth: {sent} unauthenticated requests, {len(problems)} not refused properly")

    with httpx.Client(base_url=worker.url, timeout=30) as raw:
        r = raw.get("/healthz")
        assert r.status_code == 200 and r.json() == {"status": "ok"}, r.text

    with worker.client() as c:
        st = c.get("/status")
        assert st.status_code == 200, st.text
        if st.json()["worker_id"] == "intruder" or st.json()["state"] == "running":
            problems.append(f"an unauthenticated /start_worker started the worker: {st.text}")
        assert c.get("/openapi.json").status_code == 200
        assert c.get("/no/such/route").status_code == 404

    assert not problems, "\n".join(problems)


def test_master_refuses_worker_with_other_token(token_cluster: TokenCluster) -> None:
    tc = token_cluster
    with tc.master.client() as c, tc.other.client() as oc, tc.worker.client() as wc:
        # (a long heartbeat timeout: this test is about the token, not about heartbeats)
        cfg = dict(
            SHORT_RUN, max_episodes=6, heartbeat_timeout_s=30, workers=[tc.worker.url, tc.other.url]
        )
        r = c.post("/train", json=cfg)
        assert r.status_code == 202, r.text
        data = r.json()["data"]
        run_id = data["run_id"]
        by_url = {w["url"].rstrip("/"): w for w in data["workers"]}
        good, bad = by_url[tc.worker.url], by_url[tc.other.url]
        assert good["started"] is True, good
        assert bad["started"] is False, f"a worker answering 401 was reported started: {bad}"
        err = (bad.get("error") or "").lower()
        assert "401" in err or "token" in err, f"error does not say 401/token: {bad}"

        def entry(s: dict[str, Any], url: str) -> dict[str, Any]:
            return next(w for w in s["workers"] if (w.get("url") or "").rstrip("/") == url)

        s = status(c)
        assert entry(s, tc.other.url)["state"] not in ("starting", "running"), s["workers"]

        # the run goes on with the good worker and ends; the refused one never runs
        def finished() -> dict[str, Any] | None:
            s = status(c)
            assert entry(s, tc.other.url)["state"] not in ("starting", "running"), s["workers"]
            return s if s["state"] == "finished" else None

        s = poll(finished, POLL_S, "the run with one refused worker to finish", interval=0.3)
        assert s["run_id"] == run_id
        assert s["global_episode"] >= 6
        assert entry(s, tc.other.url)["episodes"] == 0
        ost = oc.get("/status").json()
        assert ost["state"] == "idle" and not ost.get("episodes"), ost
        assert wc.get("/status").json().get("episodes", 0) > 0


def test_train_rejects_bad_configs_and_changes_nothing(token_cluster: TokenCluster) -> None:
    tc = token_cluster
    cases: list[tuple[str, Any, tuple[str, ...]]] = [
        ("unknown field", {"bogus_field": 1}, ("bogus_field",)),
        ("num_envs 0", {"num_envs": 0}, ("num_envs",)),
        ("num_envs negative", {"num_envs": -2}, ("num_envs",)),
        ("num_envs string", {"num_envs": "many"}, ("num_envs",)),
        ("num_envs float", {"num_envs": 1.5}, ("num_envs",)),
        ("lr negative", {"lr": -0.1}, ("lr",)),
        ("lr NaN", b'{"lr": NaN}', ("lr",)),
        ("lr Infinity", b'{"lr": Infinity}', ("lr",)),
        ("gamma > 1", {"gamma": 1.5}, ("gamma",)),
        ("gae_lambda > 1", {"gae_lambda": 2}, ("gae_lambda",)),
        ("t_max 0", {"t_max": 0}, ("t_max",)),
        ("max_grad_norm negative", {"max_grad_norm": -1}, ("max_grad_norm",)),
        ("sync_mode unknown", {"sync_mode": "magic"}, ("sync_mode",)),
        ("max_staleness negative", {"max_staleness": -1}, ("max_staleness",)),
        ("max_episodes negative", {"max_episodes": -5}, ("max_episodes",)),
        ("max_steps negative", {"max_steps": -1}, ("max_steps",)),
        ("hidden_sizes [0]", {"hidden_sizes": [0]}, ("hidden_sizes",)),
        ("hidden_sizes string", {"hidden_sizes": "64"}, ("hidden_sizes",)),
        ("env_kwargs list", {"env_kwargs": [1]}, ("env_kwargs",)),
        ("seed string", {"seed": "abc"}, ("seed",)),
        ("target_return string", {"target_return": "x"}, ("target_return",)),
        (
            "timeout below interval",
            {"heartbeat_interval_s": 5, "heartbeat_timeout_s": 1},
            ("heartbeat",),
        ),
        ("heartbeat_interval_s 0", {"heartbeat_interval_s": 0}, ("heartbeat_interval_s",)),
        ("unknown env", {"env_id": "NoSuchEnv-v9"}, ("env_id", "NoSuchEnv")),
        ("module not allowed", {"env_id": "os:Evil-v0"}, ("env_id", "A3C_ENV_MODULES")),
        ("workers not a list", {"workers": "127.0.0.1:1"}, ("workers",)),
        ("workers of ints", {"workers": [42]}, ("workers",)),
        ("master_url int", {"master_url": 5}, ("master_url",)),
        ("bad JSON", b'{"num_envs": ', ("json", "decode", "body")),
        ("JSON array", b"[1, 2]", ("object", "dict", "body")),
        ("JSON null", b"null", ("object", "dict", "body", "null")),
    ]
    tally = Tally()
    with tc.master.client() as c, tc.worker.client() as wc:
        poll(lambda: status(c)["state"] != "running", POLL_S, "the master not running a run")
        before = snapshot(c)
        wbefore = wc.get("/status").json()
        for label, body, names in cases:
            if isinstance(body, bytes):
                r = c.post("/train", content=body, headers={"Content-Type": "application/json"})
                tally.check(f"/train {label}", r, names)
            else:
                r = c.post("/train", json=dict(body, workers=body.get("workers", [tc.worker.url])))
                tally.check(f"/train {label}", r, names, statuses=(422,))
        after = snapshot(c)
        wafter = wc.get("/status").json()
    say(f"/train: {tally.tried} bad configs tried, {tally.server_errors} answered 5xx")
    assert tally.server_errors == 0
    assert not tally.problems, "\n".join(tally.problems)
    assert not diff(before, after), (
        f"rejected /train calls changed the master: {diff(before, after)}"
    )
    assert wafter.get("run_id") == wbefore.get("run_id"), "a rejected /train started the worker"


# ----------------------------------------------------------------------------------------------
# 2. bounded input and malformed bodies


def _chunks(total: int, size: int = 8192) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        n = min(size, total - sent)
        sent += n
        yield b"\x00" * n


def _json_chunks(prefix: dict[str, Any], total: int) -> Iterator[bytes]:
    """A valid JSON object (``prefix`` plus a long "pad" string), sent in chunks: only its
    size is wrong."""
    yield json.dumps(prefix)[:-1].encode() + b', "pad": "'
    yield from (b"x" * 8192 for _ in range(total // 8192))
    yield b'"}'


def test_oversize_bodies_get_413_and_change_nothing(hardened: Hardened) -> None:
    c = hardened.c
    before = snapshot(c)
    tensors, version = weights(c)
    big = 2 * MAX_BODY
    oct_h = {"Content-Type": "application/octet-stream"}
    grad_h = dict(oct_h, **{"X-Worker-Id": "w1", "X-Model-Version": str(version)})
    json_h = {"Content-Type": "application/json"}
    pad_episode = json.dumps({"worker_id": "w1", "reward": 1.0, "length": 1, "x": "y" * big})
    cases: list[tuple[str, str, dict[str, str], Any]] = [
        ("/gradients content-length", "/gradients", grad_h, b"\x00" * big),
        ("/gradients chunked", "/gradients", grad_h, _chunks(big)),
        (
            "/local_model_weights content-length",
            "/local_model_weights?worker_id=w1&temporary=false",
            oct_h,
            b"\x00" * big,
        ),
        (
            "/local_model_weights chunked",
            "/local_model_weights?worker_id=w1&temporary=false",
            oct_h,
            _chunks(big),
        ),
        ("/episode content-length", "/episode", json_h, pad_episode.encode()),
        (
            "/episode chunked",
            "/episode",
            json_h,
            _json_chunks({"worker_id": "w1", "reward": 1.0, "length": 1}, big),
        ),
        ("/train chunked", "/train", json_h, _json_chunks({"num_envs": 2}, 4 * big)),
        ("/heartbeat content-length", "/heartbeat", json_h, b" " * big),
    ]
    problems: list[str] = []
    server_errors = 0
    for label, path, headers, content in cases:
        try:
            r = c.post(path, content=content, headers=headers)
        except httpx.HTTPError as exc:
            problems.append(f"{label}: no response ({type(exc).__name__}: {exc})")
            continue
        server_errors += r.status_code >= 500
        if r.status_code != 413:
            problems.append(f"{label}: {r.status_code} instead of 413: {r.text[:150]}")
    # Judged before the valid request below, which is a message from w1 and rightly marks it
    # running.
    after = snapshot(c)
    # a body within the limit, sent chunked, is served (the limit is not "no chunked bodies")
    valid = safetensors_bytes(tensors)
    assert len(valid) < MAX_BODY
    r = c.post(
        "/local_model_weights?worker_id=w1&temporary=true",
        content=iter([valid[:5000], valid[5000:]]),
        headers=oct_h,
    )
    if r.status_code != 200:
        problems.append(f"chunked valid weights within the limit: {r.status_code}: {r.text[:150]}")
    say(f"oversize bodies: {len(cases)} sent, {server_errors} answered 5xx")
    assert server_errors == 0
    assert not problems, "\n".join(problems)
    assert not diff(before, after), f"oversize bodies changed the state: {diff(before, after)}"


def test_worker_oversize_bodies_get_413(token_cluster: TokenCluster) -> None:
    """A3C_MAX_BODY_BYTES is read by both apps: the worker refuses larger bodies too."""
    worker = token_cluster.worker
    body = {"master_url": "http://127.0.0.1:9", "worker_id": "big", "config": {"num_envs": 1}}
    problems: list[str] = []
    with worker.client() as c:
        before = c.get("/status").json()
        r = c.post("/start_worker", json=dict(body, pad="x" * (2 * MAX_BODY)))
        if r.status_code != 413:
            problems.append(f"worker, Content-Length: {r.status_code} instead of 413: {r.text}")
        r = c.post(
            "/start_worker",
            content=_json_chunks(body, 2 * MAX_BODY),
            headers={"Content-Type": "application/json"},
        )
        if r.status_code != 413:
            problems.append(f"worker, chunked: {r.status_code} instead of 413: {r.text}")
        after = c.get("/status").json()
    say(f"worker oversize bodies: 2 sent, {len(problems)} not answered 413")
    assert after["state"] == before["state"] and after.get("worker_id") != "big", after
    assert not problems, "\n".join(problems)


def _bad_tensor_bodies(good: dict[str, torch.Tensor]) -> list[tuple[str, bytes, tuple[str, ...]]]:
    names = sorted(good)
    first = names[0]
    matrix = next(n for n in names if good[n].dim() == 2)
    valid = safetensors_bytes(good)
    size_words = ("safetensors", "header", "parse", "invalid", "corrupt", "decode", "truncat")

    renamed = {(k + "_x" if k == first else k): v for k, v in good.items()}
    extra = dict(good, **{"extra.weight": torch.zeros(3)})
    missing = {k: v for k, v in good.items() if k != first}
    t = good[matrix]
    reshaped = dict(good, **{matrix: torch.zeros(t.shape[1], t.shape[0] + 1)})
    flat = dict(good, **{matrix: t.flatten()})
    nan = {k: v.clone() for k, v in good.items()}
    nan[matrix][0, 0] = float("nan")
    inf = {k: v.clone() for k, v in good.items()}
    inf[first][0] = float("inf")
    ninf = {k: v.clone() for k, v in good.items()}
    ninf[matrix][-1, -1] = float("-inf")
    header = json.dumps(
        {first: {"dtype": "F32", "shape": list(good[first].shape), "data_offsets": [0, 10**12]}}
    ).encode()
    lying_offsets = len(header).to_bytes(8, "little") + header + b"\x00" * 16
    huge_header = (2**62).to_bytes(8, "little") + b"{}"
    dtype_cases = [
        (name, safetensors_bytes({k: v.to(dt) for k, v in good.items()}), ("dtype", short, name))
        for name, short, dt in (
            ("float64", "f64", torch.float64),
            ("float16", "f16", torch.float16),
            ("bfloat16", "bf16", torch.bfloat16),
            ("int64", "i64", torch.int64),
            ("int32", "i32", torch.int32),
        )
    ]
    return [
        ("empty body", b"", size_words + ("empty",)),
        ("plain text", b"this is not a safetensors file", size_words),
        ("random bytes", bytes(range(256)) * 8, size_words),
        ("JSON", b'{"data": [1, 2, 3]}', size_words),
        ("pickle of tensors", pickle_bytes({k: v for k, v in good.items()}), size_words),
        ("torch.save zip", torch_save_bytes(dict(good)), size_words),
        ("truncated half", valid[: len(valid) // 2], size_words),
        ("truncated tail", valid[:-7], size_words),
        ("truncated header", valid[:12], size_words),
        ("offsets past the end", lying_offsets, size_words + ("offset",)),
        ("huge header length", huge_header, size_words + ("large", "big")),
        ("no tensors", safetensors_bytes({}), ("missing", "names", "tensor", first)),
        ("renamed tensor", safetensors_bytes(renamed), (first, "names", "missing", "unexpected")),
        ("extra tensor", safetensors_bytes(extra), ("extra.weight", "unexpected", "names")),
        ("missing tensor", safetensors_bytes(missing), (first, "missing", "names")),
        ("wrong shape", safetensors_bytes(reshaped), ("shape",)),
        ("flattened", safetensors_bytes(flat), ("shape",)),
        ("NaN", safetensors_bytes(nan), ("finite", "nan")),
        ("+Inf", safetensors_bytes(inf), ("finite", "inf")),
        ("-Inf", safetensors_bytes(ninf), ("finite", "inf")),
        *dtype_cases,
    ]


def _bad_json_bodies() -> dict[str, list[tuple[str, bytes, tuple[str, ...]]]]:
    def j(obj: Any) -> bytes:
        return json.dumps(obj).encode()

    bad_json = ("json", "decode", "body", "expecting")
    ep = {"worker_id": "w1", "reward": 10.0, "length": 10}
    common = [
        ("bad JSON", b'{"data": ', bad_json),
        ("JSON array", b"[1]", ("object", "dict", "body", "valid")),
        ("text", b"hello", bad_json),
    ]
    return {
        "/episode": [
            *common,
            ("empty body", b"", ("body", "required", "missing", "json")),
            ("missing worker_id", j({"reward": 1, "length": 1}), ("worker_id",)),
            ("missing reward", j({"worker_id": "w1", "length": 1}), ("reward",)),
            ("missing length", j({"worker_id": "w1", "reward": 1}), ("length",)),
            ("reward string", j(dict(ep, reward="lots")), ("reward",)),
            ("reward NaN", b'{"worker_id": "w1", "reward": NaN, "length": 3}', ("reward",)),
            (
                "reward Infinity",
                b'{"worker_id": "w1", "reward": Infinity, "length": 3}',
                ("reward",),
            ),
            ("reward 1e999", b'{"worker_id": "w1", "reward": 1e999, "length": 3}', ("reward",)),
            ("reward null", j(dict(ep, reward=None)), ("reward",)),
            ("length negative", j(dict(ep, length=-1)), ("length",)),
            ("length float", j(dict(ep, length=2.5)), ("length",)),
            ("length list", j(dict(ep, length=[3])), ("length",)),
            ("worker_id int", j(dict(ep, worker_id=7)), ("worker_id",)),
            ("worker_id null", j(dict(ep, worker_id=None)), ("worker_id",)),
            ("unknown field", j(dict(ep, bogus=1)), ("bogus",)),
        ],  # fmt: skip
        "/heartbeat": [
            *common,
            ("missing worker_id", j({"steps_per_s": 3.0}), ("worker_id",)),
            ("worker_id int", j({"worker_id": 5}), ("worker_id",)),
            ("steps_per_s string", j({"worker_id": "w1", "steps_per_s": "fast"}), ("steps_per_s",)),
            ("steps_per_s NaN", b'{"worker_id": "w1", "steps_per_s": NaN}', ("steps_per_s",)),
            ("steps_per_s negative", j({"worker_id": "w1", "steps_per_s": -5}), ("steps_per_s",)),
            (
                "last_reward Infinity",
                b'{"worker_id": "w1", "last_reward": Infinity}',
                ("last_reward",),
            ),
            ("metrics list", j({"worker_id": "w1", "metrics": [1, 2]}), ("metrics",)),
        ],  # fmt: skip
        "/best_score": [
            *common,
            ("missing data", j({"worker_id": "w1"}), ("data",)),
            ("data string", j({"data": "high", "worker_id": "w1"}), ("data",)),
            ("data NaN", b'{"data": NaN, "worker_id": "w1"}', ("data",)),
            ("data Infinity", b'{"data": Infinity, "worker_id": "w1"}', ("data",)),
            ("data -Infinity", b'{"data": -Infinity, "worker_id": "w1"}', ("data",)),
            ("data null", j({"data": None, "worker_id": "w1"}), ("data",)),
            ("data list", j({"data": [1e9], "worker_id": "w1"}), ("data",)),
            ("worker_id int", j({"data": 1e9, "worker_id": 3}), ("worker_id",)),
            ("unknown field", j({"data": 1e9, "worker_id": "w1", "bogus": 1}), ("bogus",)),
        ],
        "/global_moving_average": [
            *common,
            ("missing data", j({}), ("data",)),
            ("data string", j({"data": "x"}), ("data",)),
            ("data NaN", b'{"data": NaN}', ("data",)),
            ("data Infinity", b'{"data": Infinity}', ("data",)),
            ("data null", j({"data": None}), ("data",)),
            ("unknown field", j({"data": 5.0, "bogus": 1}), ("bogus",)),
        ],
        "/queue": [
            *common,
            ("missing data", j({}), ("data",)),
            ("data string", j({"data": "x"}), ("data",)),
            ("data NaN", b'{"data": NaN}', ("data",)),
            ("data Infinity", b'{"data": Infinity}', ("data",)),
            ("data dict", j({"data": {"a": 1}}), ("data",)),
            ("unknown field", j({"data": 5.0, "bogus": 1}), ("bogus",)),
        ],
        "/global_episode": [
            *common,
            ("data negative", j({"data": -3}), ("data",)),
            ("data float", j({"data": 1.5}), ("data",)),
            ("data string", j({"data": "x"}), ("data",)),
            ("data NaN", b'{"data": NaN}', ("data",)),
            ("data null", j({"data": None}), ("data",)),
            ("unknown field", j({"data": 1, "bogus": 1}), ("bogus",)),
        ],
        "/worker_started": [
            *common,
            ("missing worker_id", j({"url": "http://127.0.0.1:9"}), ("worker_id",)),
            ("worker_id int", j({"worker_id": 4, "url": "http://127.0.0.1:9"}), ("worker_id",)),
            ("url int", j({"worker_id": "w1", "url": 9}), ("url",)),
            ("unknown field", j({"worker_id": "w1", "url": "http://x:1", "bogus": 1}), ("bogus",)),
        ],  # fmt: skip
        "/worker_done": [
            *common,
            ("missing worker_id", j({}), ("worker_id",)),
            ("worker_id list", j({"worker_id": ["w1"]}), ("worker_id",)),
            ("error int", j({"worker_id": "w1", "error": 5}), ("error",)),
            ("unknown field", j({"worker_id": "w1", "bogus": 1}), ("bogus",)),
        ],
        "/train": [
            *common,
            ("unknown field", j({"bogus_field": 1}), ("bogus_field", "running", "409")),
            ("num_envs 0", j({"num_envs": 0}), ("num_envs", "running")),
        ],
    }


def test_malformed_bodies_get_4xx_and_change_nothing(hardened: Hardened) -> None:
    c = hardened.c
    good, version = weights(c)
    before = snapshot(c)
    before_status = status(c)
    tally = Tally()

    oct_h = {"Content-Type": "application/octet-stream"}
    tensor_targets = {
        "/gradients": lambda: dict(oct_h, **{"X-Worker-Id": "w1", "X-Model-Version": str(version)}),
        "/local_model_weights?worker_id=w1&temporary=false": lambda: oct_h,
        "/local_model_weights?worker_id=w1&temporary=true": lambda: oct_h,
    }
    for path, headers in tensor_targets.items():
        for label, body, names in _bad_tensor_bodies(good):
            r = c.post(path, content=body, headers=headers())
            tally.check(f"POST {path.split('&')[0]} [{label}]", r, names)

    # well-formed tensors with malformed headers or query parameters
    zeros = safetensors_bytes({k: torch.zeros_like(v) for k, v in good.items()})
    header_cases = {
        "X-Model-Version missing": {"X-Worker-Id": "w1"},
        "X-Model-Version not an int": {"X-Worker-Id": "w1", "X-Model-Version": "abc"},
        "X-Model-Version negative": {"X-Worker-Id": "w1", "X-Model-Version": "-20"},
        "X-Model-Version from the future": {
            "X-Worker-Id": "w1",
            "X-Model-Version": str(version + 1000),
        },
    }
    for label, extra in header_cases.items():
        r = c.post("/gradients", content=zeros, headers=dict(oct_h, **extra))
        tally.check(f"POST /gradients [{label}]", r, ("x-model-version", "version"))
    for label, query in {
        "temporary not a bool": "worker_id=w1&temporary=maybe",
        "worker_id missing": "temporary=false",
    }.items():
        r = c.post(f"/local_model_weights?{query}", content=zeros, headers=oct_h)
        tally.check(f"POST /local_model_weights [{label}]", r, ("temporary", "worker_id"))

    json_h = {"Content-Type": "application/json"}
    for path, cases in _bad_json_bodies().items():
        for label, body, names in cases:
            r = c.post(path, content=body, headers=json_h)
            tally.check(f"POST {path} [{label}]", r, names)

    after = snapshot(c)
    after_status = status(c)
    say(
        f"malformed bodies: {tally.tried} bad inputs tried, {tally.server_errors} answered 5xx, "
        f"{len(tally.problems)} mishandled"
    )
    assert tally.server_errors == 0, "\n".join(tally.problems)
    assert not tally.problems, "\n".join(tally.problems)
    assert not diff(before, after), f"bad inputs changed the state: {diff(before, after)}"
    assert after_status["updates_rejected"] >= before_status["updates_rejected"]

    # and the same routes do accept well-formed input (the checks are not "refuse everything")
    r = c.post("/local_model_weights?worker_id=w1&temporary=true", content=zeros, headers=oct_h)
    assert r.status_code == 200, r.text
    r = c.post(
        "/gradients",
        content=zeros,
        headers=dict(oct_h, **{"X-Worker-Id": "w1", "X-Model-Version": str(version)}),
    )
    assert r.status_code == 200, r.text
    assert int(r.headers["x-model-version"]) == version + 1
    assert set(load_safetensors(r.content)) == set(good)
    assert status(c)["updates_applied"] == before_status["updates_applied"] + 1


# ----------------------------------------------------------------------------------------------
# 3. no lost updates under load

THREADS = 16
EPISODES_PER_THREAD = 25
INCREMENTS_PER_THREAD = 15


def _run_threads(target: Any, n: int) -> None:
    errors: list[BaseException] = []

    def wrap(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "load threads did not finish within 120 s"
    assert not errors, f"load threads raised: {errors[:3]}"


def test_no_lost_updates_under_concurrent_load(hardened: Hardened) -> None:
    m = hardened.master
    c = hardened.c
    r = c.post("/create_queue")
    assert r.status_code == 200, r.text
    base = status(c)
    assert base["state"] == "running"
    assert base["queue_length"] == 0
    base_avg = base["moving_average"]

    def reward(t: int, i: int) -> float:
        return 3.0 + 0.5 * (t * EPISODES_PER_THREAD + i)  # all distinct

    def length(t: int, i: int) -> int:
        return 1 + (t * 7 + i * 3) % 40

    accepted = [0] * THREADS
    rejected: list[str] = []
    started_at = time.monotonic()

    def episodes(t: int) -> None:
        with m.client(timeout=60) as cl:
            for i in range(EPISODES_PER_THREAD):
                body = {"worker_id": f"load-{t}", "reward": reward(t, i), "length": length(t, i)}
                resp = cl.post("/episode", json=body)
                if resp.status_code == 200:
                    accepted[t] += 1
                else:
                    rejected.append(f"{resp.status_code} {resp.text[:100]}")

    _run_threads(episodes, THREADS)
    sent = THREADS * EPISODES_PER_THREAD
    s = status(c)
    n_ok = sum(accepted)
    lost = n_ok - (s["global_episode"] - base["global_episode"])
    say(
        f"/episode load: {sent} requests from {THREADS} threads in "
        f"{time.monotonic() - started_at:.1f} s, {n_ok} accepted, {len(rejected)} refused, "
        f"{lost} updates lost"
    )
    assert not rejected, rejected[:5]
    assert lost == 0
    all_rewards = [reward(t, i) for t in range(THREADS) for i in range(EPISODES_PER_THREAD)]
    all_lengths = [length(t, i) for t in range(THREADS) for i in range(EPISODES_PER_THREAD)]
    assert s["global_steps"] - base["global_steps"] == sum(all_lengths)
    expected_best = max(all_rewards + ([base["best_score"]] if base["best_score"] else []))
    assert s["best_score"] == expected_best
    reg = registry(s)
    for t in range(THREADS):
        w = reg.get(f"load-{t}")
        assert w is not None, f"load-{t} missing from the registry"
        assert w["episodes"] == EPISODES_PER_THREAD, w
        assert w["steps"] == sum(length(t, i) for i in range(EPISODES_PER_THREAD)), w
    assert s["queue_length"] == sent, "the FIFO should hold one moving average per report"
    assert s["queue_dropped"] == base["queue_dropped"]

    # The FIFO, in order, must be the fold of the rewards one at a time: each step of it gives
    # back exactly one of the rewards sent, every reward once (no interleaved read-modify-write).
    averages: list[float] = []
    for _ in range(sent + 5):
        q = c.get("/queue")
        assert q.status_code == 200, q.text
        if q.json().get("empty"):
            break
        averages.append(q.json()["data"])
    assert len(averages) == sent
    assert math.isclose(averages[-1], s["moving_average"], rel_tol=1e-9, abs_tol=1e-9)
    recovered: list[float] = []
    prev = base_avg
    for a in averages:
        r_i = a if prev is None else (a - 0.99 * prev) / 0.01
        recovered.append(round(r_i * 2) / 2)
        assert abs(r_i - recovered[-1]) < 1e-3, f"average {a} after {prev} is no single fold"
        prev = a
    assert sorted(recovered) == sorted(all_rewards), "the FIFO does not fold each reward once"
    if sent >= 100:
        assert math.isclose(s["mean_return_100"], sum(recovered[-100:]) / 100, rel_tol=1e-9)

    # concurrent POST /global_episode: every increment counted, every reply distinct
    g0 = c.get("/global_episode").json()["data"]
    replies: list[int] = []
    lock = threading.Lock()

    def increments(t: int) -> None:
        with m.client(timeout=60) as cl:
            for i in range(INCREMENTS_PER_THREAD):
                n = (t + i) % 3  # 0: no body (add one); else {"data": n}
                resp = (
                    cl.post("/global_episode")
                    if n == 0
                    else cl.post("/global_episode", json={"data": n})
                )
                assert resp.status_code == 200, resp.text
                with lock:
                    replies.append(resp.json()["data"])

    _run_threads(increments, THREADS)
    added = sum(max(1, (t + i) % 3) for t in range(THREADS) for i in range(INCREMENTS_PER_THREAD))
    g1 = c.get("/global_episode").json()["data"]
    n_inc = THREADS * INCREMENTS_PER_THREAD
    say(f"/global_episode load: {n_inc} requests, {added - (g1 - g0)} increments lost")
    assert g1 == g0 + added
    assert len(set(replies)) == n_inc, "two increments answered the same count"
    assert max(replies) == g1

    # concurrent POST /best_score: the maximum wins
    def best(t: int) -> None:
        with m.client(timeout=60) as cl:
            for i in range(10):
                v = 10_000.0 + t * 10 + i
                resp = cl.post("/best_score", json={"data": v, "worker_id": f"load-{t}"})
                assert resp.status_code == 200, resp.text

    _run_threads(best, THREADS)
    assert c.get("/best_score").json()["data"] == 10_000.0 + (THREADS - 1) * 10 + 9


# ----------------------------------------------------------------------------------------------
# 4. workers that die


def test_a_slow_starting_worker_is_not_lost_before_it_accepted(
    services: Services, tmp_path: Path
) -> None:
    """heartbeat_timeout_s=3, start_timeout_s unset (README: then the heartbeat timeout).

    The only worker is a slow host: it answers POST /start_worker 3.5 s later, then registers
    and heart-beats every 0.5 s like a live worker. README: a worker "that accepted POST
    /start_worker but has sent nothing for longer" than the start timeout is `lost`; this one
    has never been silent for 3 s since it accepted, so it must end up `running` and the run
    must not finish for want of workers.
    """
    master = services.master(_master_env(tmp_path / "run"))
    master.wait_healthy()
    slow = StubWorker(start_delay_s=3.5, beat_s=0.5)
    try:
        with master.client() as c:
            t0 = time.monotonic()
            r = c.post("/train", json=dict(SHORT_RUN, workers=[slow.url]))
            train_s = time.monotonic() - t0
            assert r.status_code == 202, r.text
            assert r.json()["data"]["workers"][0]["started"] is True, r.text
            # Watch for 4 s (longer than the timeout) after POST /train answered.
            seen: list[tuple[float, str, str]] = []
            t_train = time.monotonic()
            while time.monotonic() - t_train < 4.0:
                s = status(c)
                w1 = registry(s)["w1"]
                seen.append((round(time.monotonic() - t_train, 2), s["state"], w1["state"]))
                if s["state"] != "running" or w1["state"] == "lost":
                    break
                time.sleep(0.2)  # pacing of an observation window, not a synchronisation
            s = status(c)
        w1 = registry(s)["w1"]
        say(
            f"slow-starting worker: POST /train took {train_s:.2f} s; then run {s['state']!r} "
            f"({s.get('finish_reason')!r}), w1 {w1['state']!r} ({w1.get('error')!r})"
        )
        events = [(round(t - t0, 2), what, code) for t, what, code in slow.events]
        assert w1["state"] == "running", f"w1: {w1}; seen {seen}; worker's side {events}"
        assert s["state"] == "running", f"{s.get('finish_reason')}; {seen}; {events}"
    finally:
        slow.close()


def test_killed_workers_are_marked_lost_and_the_run_finishes(
    services: Services, tmp_path: Path
) -> None:
    master = services.master(_master_env(tmp_path / "run"))
    w1 = services.worker(name="worker-1")
    w2 = services.worker(name="worker-2")
    for svc in (master, w1, w2):
        svc.wait_healthy()
    timeout_s = SHORT_RUN["heartbeat_timeout_s"]
    with master.client() as c:
        r = c.post("/train", json=dict(SHORT_RUN, workers=[w1.url, w2.url]))
        assert r.status_code == 202, r.text
        assert all(w["started"] for w in r.json()["data"]["workers"]), r.text

        def both_running() -> dict[str, Any] | None:
            s = status(c)
            reg = registry(s)
            assert s["state"] == "running" and all(w["state"] != "lost" for w in reg.values()), (
                f"healthy workers lost before any was killed: {s}"
            )
            ok = all(reg.get(w, {}).get("state") == "running" for w in ("w1", "w2"))
            return s if ok and s["global_episode"] >= 4 else None

        poll(both_running, POLL_S, "both workers running and a few episodes", interval=0.2)

        s_read = status(c)
        t_read = time.monotonic()
        silent_at_read = registry(s_read)["w1"]["last_seen_s"]
        w1.kill9()
        t_kill = time.monotonic()

        def w1_lost() -> dict[str, Any] | None:
            s = status(c)
            assert s["state"] == "running", f"the run ended with one worker alive: {s}"
            return s if registry(s)["w1"]["state"] == "lost" else None

        s_lost = poll(w1_lost, timeout_s + POLL_S, "the killed worker w1 to be marked lost", 0.1)
        t_lost = time.monotonic()
        say(
            f"killed worker marked lost {t_lost - t_kill:.2f} s after SIGKILL "
            f"(heartbeat_timeout_s={timeout_s})"
        )
        assert t_lost - t_read >= timeout_s - silent_at_read - 0.3, "marked lost too early"
        assert t_lost - t_kill <= timeout_s + 15

        # the run goes on with the other worker
        g_lost = s_lost["global_episode"]

        def progressing() -> dict[str, Any] | None:
            s = status(c)
            assert s["state"] == "running", s
            assert registry(s)["w2"]["state"] == "running", s["workers"]
            return s if s["global_episode"] >= g_lost + 4 else None

        s_on = poll(progressing, POLL_S, "episodes from the surviving worker")
        assert registry(s_on)["w1"]["state"] == "lost"
        assert registry(s_on)["w2"]["episodes"] > registry(s_lost)["w2"]["episodes"]

        # the last worker dies: nothing waits on it, the run finishes
        w2.kill9()
        t_kill2 = time.monotonic()
        s_end = poll(
            lambda: (s := status(c))["state"] == "finished" and s,
            timeout_s + POLL_S,
            "the run to finish once no worker is alive",
            0.2,
        )
        say(
            f"run finished {time.monotonic() - t_kill2:.2f} s after the last worker was killed "
            f"(finish_reason={s_end.get('finish_reason')!r})"
        )
        assert time.monotonic() - t_kill2 <= timeout_s + 20
        assert {registry(s_end)[w]["state"] for w in ("w1", "w2")} == {"lost"}


# ----------------------------------------------------------------------------------------------
# 5. a master that dies


def test_killed_master_resumes_the_same_run(services: Services, tmp_path: Path) -> None:
    """kill -9 the master of a running run, restart it on the same folder and port.

    Workers w1 and w2 retry (default A3C_MASTER_RETRY_S) and continue the same run; w3 has
    A3C_MASTER_RETRY_S=3 and the master stays away longer than that: it must end `failed`,
    saying the master is unreachable.
    """
    persist_s = 1.0
    retry_s = 3.0
    env = _master_env(tmp_path / "run", A3C_PERSIST_INTERVAL_S=str(persist_s))
    master = services.master(env)
    w1 = services.worker(name="worker-1")
    w2 = services.worker(name="worker-2")
    w3 = services.worker({"A3C_MASTER_RETRY_S": str(retry_s)}, name="worker-3-short-retry")
    for svc in (master, w1, w2, w3):
        svc.wait_healthy()
    cfg = dict(SHORT_RUN, heartbeat_timeout_s=30)
    problems: list[str] = []
    with master.client() as c, w1.client() as c1, w2.client() as c2, w3.client() as c3:
        r = c.post("/train", json=dict(cfg, workers=[w1.url, w2.url, w3.url]))
        assert r.status_code == 202, r.text
        run_id = r.json()["data"]["run_id"]

        def warm() -> bool:
            s = status(c)
            assert s["state"] == "running", s
            reg = registry(s)
            running = all(reg.get(w, {}).get("state") == "running" for w in ("w1", "w2", "w3"))
            return running and s["global_episode"] >= 20 and s["model_version"] >= 10

        poll(warm, POLL_S, "a run with some progress", interval=0.3)

        # Read /status for longer than the persist interval plus a margin, then kill -9. The
        # reference is the last status read at least persist_s + margin before the kill: the
        # restarted master must be at least there.
        margin_s = 1.0
        reads: list[tuple[float, dict[str, Any]]] = []
        t_first = time.monotonic()
        w_early = {1: c1.get("/status").json(), 2: c2.get("/status").json()}
        while time.monotonic() - t_first < persist_s + margin_s + 1.0:
            reads.append((time.monotonic(), status(c)))
            time.sleep(0.05)  # pacing of the reads, not synchronisation
        s_last = reads[-1][1]
        assert s_last["state"] == "running"
        master.kill9()
        t_kill = time.monotonic()
        s_early = [s for t, s in reads if t <= t_kill - persist_s - margin_s][-1]

        # w3 gives up once its retry deadline has passed (the master stays away until then)
        ws3 = poll(
            lambda: (ws := c3.get("/status").json())["state"] == "failed" and ws,
            retry_s + POLL_S,
            "the short-retry worker to give up as failed",
            0.1,
        )
        waited = time.monotonic() - t_kill
        say(f"worker gave up {waited:.1f} s after the master died (A3C_MASTER_RETRY_S={retry_s})")
        err = (ws3.get("error") or "").lower()
        if not ("master" in err and ("unreachable" in err or "reach" in err)):
            problems.append(f"w3's error does not say the master is unreachable: {ws3}")
        if waited < retry_s - 0.1:
            problems.append(
                f"w3 gave up {waited:.2f} s after the master died, before its "
                f"A3C_MASTER_RETRY_S={retry_s} s"
            )

        # the others keep trying: they neither crash nor give up within their retry deadline
        for wc in (c1, c2):
            ws = wc.get("/status").json()
            assert ws["state"] in ("running", "stopping"), ws

        master.start().wait_healthy()
        s_new = status(c)
        lost = s_last["global_episode"] - s_new["global_episode"]
        # how old the state found on disk was: the last read that it covers
        covered = [t for t, s in reads if s["global_episode"] <= s_new["global_episode"]]
        age = f"{t_kill - covered[-1]:.1f} s" if covered else "older than every read"
        say(
            f"master killed: {s_last['global_episode']} episodes seen before the kill, "
            f"{s_new['global_episode']} right after the restart -> progress lost: {lost} "
            f"episodes ({s_last['global_steps'] - s_new['global_steps']} steps, "
            f"{s_last['model_version'] - s_new['model_version']} versions); the resumed state "
            f"is what /status showed {age} before the kill (A3C_PERSIST_INTERVAL_S={persist_s}); "
            f"master down {time.monotonic() - t_kill:.1f} s"
        )
        assert s_new["run_id"] == run_id
        assert s_new["state"] == "running", s_new
        for key in ("global_episode", "global_steps", "model_version", "updates_applied"):
            assert s_new[key] >= s_early[key], (
                f"{key}: {s_new[key]} < {s_early[key]} (older than the persist interval)"
            )
        assert s_new["best_score"] >= s_early["best_score"]
        _, version = weights(c)
        assert version >= s_early["model_version"]

        # the same run goes on: counters rise again, w1 and w2 are back
        def resumed() -> dict[str, Any] | None:
            s = status(c)
            assert s["run_id"] == run_id and s["state"] == "running", s
            reg = registry(s)
            back = all(reg[w]["state"] == "running" for w in ("w1", "w2"))
            ok = s["global_episode"] >= s_new["global_episode"] + 5
            return s if ok and back and s["model_version"] > s_new["model_version"] else None

        s_after = poll(resumed, POLL_S, "the restarted master's run to progress again", 0.3)
        for i, wc in ((1, c1), (2, c2)):
            ws = wc.get("/status").json()
            assert ws["state"] == "running", ws
            assert ws.get("run_id") in (None, run_id), ws
            assert ws["episodes"] >= w_early[i]["episodes"], "the worker started over"
        # counters and registry are persisted together: they agree after the resume
        for s in (s_new, s_after):
            reg = registry(s)
            assert sum(reg[w]["episodes"] for w in reg) == s["global_episode"], s
            assert sum(reg[w]["steps"] for w in reg) == s["global_steps"], s
        assert c3.get("/status").json()["state"] == "failed"
    assert not problems, "\n".join(problems)


def test_sigterm_and_stop_persist_everything(services: Services, tmp_path: Path) -> None:
    # A persist interval far longer than the test: only the SIGTERM handler and POST /stop can
    # explain what is found on disk.
    env = _master_env(tmp_path / "run", A3C_PERSIST_INTERVAL_S="600")
    master = services.master(env)
    master.wait_healthy()
    stub = StubWorker()
    try:
        with master.client() as c:
            cfg = dict(SHORT_RUN, heartbeat_timeout_s=300, workers=[stub.url])
            r = c.post("/train", json=cfg)
            assert r.status_code == 202, r.text
            run_id = r.json()["data"]["run_id"]
            good, version = weights(c)
            pushed: list[float] = []
            for i in range(7):
                r = c.post("/episode", json={"worker_id": "w1", "reward": 10.0 + i, "length": 9})
                assert r.status_code == 200, r.text
                pushed.append(r.json()["data"]["moving_average"])
            for v in (1.5, 2.5):
                assert c.post("/queue", json={"data": v}).status_code == 200
                pushed.append(v)
            assert c.post("/global_episode", json={"data": 3}).status_code == 200
            assert c.post("/best_score", json={"data": 99.5, "worker_id": "w1"}).status_code == 200
            assert c.post("/global_moving_average", json={"data": 40.0}).status_code == 200
            new = {k: v + 0.25 for k, v in good.items()}
            r = c.post(
                "/local_model_weights?worker_id=w1&temporary=false",
                content=safetensors_bytes(new),
                headers={"Content-Type": "application/octet-stream"},
            )
            assert r.status_code == 200, r.text
            grads = {k: torch.full_like(v, 0.01) for k, v in good.items()}
            _, v_now = weights(c)
            r = c.post(
                "/gradients",
                content=safetensors_bytes(grads),
                headers={
                    "Content-Type": "application/octet-stream",
                    "X-Worker-Id": "w1",
                    "X-Model-Version": str(v_now),
                },
            )
            assert r.status_code == 200, r.text
            before = snapshot(c)
            assert int(before["weights_version"]) > version

        t_term = time.monotonic()
        code = master.terminate()
        say(f"master SIGTERM: exited in {time.monotonic() - t_term:.1f} s (code {code})")
        master.start().wait_healthy()
        with master.client() as c:
            after = snapshot(c)
            assert after["run_id"] == run_id
            assert not diff(before, after), f"not persisted on SIGTERM: {diff(before, after)}"
            popped = []
            for _ in range(len(pushed) + 3):
                q = c.get("/queue").json()
                if q.get("empty"):
                    break
                popped.append(q["data"])
            assert popped == pushed, "the FIFO was not persisted in order"

            # POST /stop persists at once: kill -9 right after it loses nothing
            for i in range(3):
                r = c.post("/episode", json={"worker_id": "w1", "reward": 50.0 + i, "length": 4})
                assert r.status_code == 200, r.text
            r = c.post("/stop")
            assert r.status_code == 200, r.text
            d = r.json()["data"]
            assert d["stopped"] is True and d["state"] == "finished" and d["run_id"] == run_id, d
            stopped = snapshot(c)
        master.kill9()
        master.start().wait_healthy()
        with master.client() as c:
            again = snapshot(c)
            assert not diff(stopped, again), f"POST /stop did not persist: {diff(stopped, again)}"
            r = c.post("/stop")
            assert r.status_code == 200 and r.json()["data"]["stopped"] is False, r.text
    finally:
        stub.close()
