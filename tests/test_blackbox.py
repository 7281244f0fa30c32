"""Black-box tests of the HTTP contract (../shared/API.md, then README.md where it is silent).

Everything here runs against real `uvicorn master.app:app` / `uvicorn worker.app:app` processes on
free loopback ports and talks to them only over HTTP. For checks that need a running run but no
real training (gradients, weights, counters), `POST /train` is pointed at tiny stand-in workers:
HTTP servers in this process that answer 202 to `POST /start_worker` and never report back.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load, save

from a3c_http.localcluster import LocalCluster, ServiceProcess, free_port

pytestmark = pytest.mark.integration

TOKEN = "black-box-token-0123456789abcdef"
QUEUE_MAX = 4
MAX_BODY = 100_000
HOST = "127.0.0.1"
MASTER_ALIAS = "http://master.example:4321"  # A3C_MASTER_URL of the token master

WORKER_STATES = {"starting", "running", "done", "lost", "failed"}
WORKER_PROCESS_STATES = {"idle", "running", "stopping", "done", "failed"}
STATUS_FIELDS = [
    "state", "run_id", "env_id", "global_episode", "global_steps", "best_score",
    "moving_average", "mean_return_100", "solved", "model_version", "updates_applied",
    "updates_rejected", "queue_length", "queue_dropped", "elapsed_s", "config", "workers",
]
# README "Training config": the defaults (target_return is filled in from CartPole-v1's threshold).
CONFIG_DEFAULTS = {
    "env_id": "CartPole-v1", "env_kwargs": {}, "num_envs": 8, "hidden_sizes": [64, 64],
    "lr": 0.001, "gamma": 0.99, "gae_lambda": 1.0, "t_max": 8, "entropy_coef": 0.01,
    "value_coef": 0.5, "max_grad_norm": 0.5, "sync_mode": "gradients", "max_staleness": 16,
    "max_episodes": None, "max_steps": 2000000, "target_return": 475.0,
    "heartbeat_interval_s": 2.0,
}


# ----------------------------------------------------------------------------------- helpers


def wait_for(condition: Callable[[], object], timeout_s: float, what: str) -> object:
    """Poll `condition` until it returns something truthy; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {last!r})")


def assert_error(reply: httpx.Response, status: int | None = None) -> str:
    """A 4xx with a JSON body holding a message; returns the body as text."""
    if status is None:
        assert 400 <= reply.status_code < 500, (reply.status_code, reply.text)
    else:
        assert reply.status_code == status, (reply.status_code, reply.text)
    assert reply.headers.get("content-type", "").startswith("application/json"), reply.headers
    body = reply.json()
    assert isinstance(body, dict) and body, body
    message = json.dumps(body)
    assert len(message) > 10, body
    return message


def is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


class StandIn:
    """A stand-in worker: answers 202 to every POST (200 to GET) and records what it was sent."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                with owner.lock:
                    owner.requests.append(
                        {
                            "path": self.path,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": body,
                        }
                    )
                self._reply(202, {"data": {"accepted": True}})

            def do_GET(self) -> None:  # noqa: N802
                self._reply(200, {"status": "ok", "state": "running"})

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((HOST, 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def starts(self) -> list[dict]:
        with self.lock:
            return [r for r in self.requests if r["path"].startswith("/start_worker")]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def non_loopback_ipv4() -> str | None:
    """An IPv4 address of this host that is not loopback, or None."""
    for probe in ("192.0.2.123", "10.255.255.255", "8.8.8.8"):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect((probe, 9))
            except OSError:
                continue
            ip = s.getsockname()[0]
        if not ip.startswith("127.") and ip != "0.0.0.0":
            try:
                free_port(ip)
            except OSError:
                continue
            return ip
    return None


@dataclass
class Procs:
    plain: LocalCluster
    token: LocalCluster
    remote: ServiceProcess | None
    standins: list[StandIn]
    tmp: Path

    @property
    def master(self) -> ServiceProcess:
        return self.plain.master

    @property
    def m(self) -> str:
        return self.plain.master.url

    @property
    def standin(self) -> StandIn:
        return self.standins[0]


@pytest.fixture(scope="session")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Procs]:
    tmp = tmp_path_factory.mktemp("blackbox")
    with pytest.MonkeyPatch.context() as mp:
        for key in list(os.environ):
            if key.startswith("A3C_"):
                mp.delenv(key)
        ports = [free_port(), free_port()]
        # The workers list with a comment, a blank line, both accepted forms, a trailing comment.
        workers_file = tmp / "workers.txt"
        workers_file.write_text(
            "# the black-box workers\n\n"
            f"{HOST}:{ports[0]}\n"
            f"http://{HOST}:{ports[1]}   # the second one\n"
        )
        env = {
            "A3C_PERSIST_INTERVAL_S": "1",
            "A3C_QUEUE_MAX": str(QUEUE_MAX),
            "A3C_MAX_BODY_BYTES": str(MAX_BODY),
            "A3C_MASTER_RETRY_S": "5",
        }
        plain = LocalCluster(
            tmp / "run", tmp / "logs", workers=[(HOST, p) for p in ports], env=env,
            workers_file=workers_file,
        )
        # The token cluster is bound to a non-loopback address when the host has one: a token
        # is what makes non-loopback clients welcome. Its master has A3C_MASTER_URL set.
        ip = non_loopback_ipv4()
        thost = ip or HOST
        token = LocalCluster(
            tmp / "trun", tmp / "tlogs", workers=[(thost, free_port(thost))], host=thost,
            master_port=free_port(thost), token=TOKEN,
            env={"A3C_MASTER_RETRY_S": "5", "A3C_MASTER_URL": MASTER_ALIAS},
        )
        remote = None
        if ip is not None:
            remote = ServiceProcess(
                "master.app:app", free_port(ip), tmp / "rlogs" / "master.log", host=ip,
                env={"A3C_RUN_DIR": str(tmp / "rrun"), "A3C_WORKERS_FILE": str(workers_file)},
            )
    everything = [*plain.processes, *token.processes, *([remote] if remote else [])]
    standins = [StandIn(), StandIn()]
    try:
        for p in everything:
            p.start()
        for p in everything:
            p.wait_healthy(60)
        yield Procs(plain, token, remote, standins, tmp)
    finally:
        plain.close()
        token.close()
        if remote is not None:
            remote.stop()
        for s in standins:
            s.close()
        for p in everything:
            assert not p.running(), f"{p.app} on port {p.port} is still running"


@pytest.fixture(scope="session")
def c() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30, trust_env=False) as client:
        yield client


@pytest.fixture(scope="session")
def tc() -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(timeout=30, trust_env=False, headers=headers) as client:
        yield client


def status(c: httpx.Client, m: str) -> dict:
    r = c.get(f"{m}/status")
    assert r.status_code == 200, r.text
    return r.json()


def ensure_not_running(c: httpx.Client, m: str) -> None:
    if status(c, m)["state"] == "running":
        assert c.post(f"{m}/stop").status_code < 300
        wait_for(lambda: status(c, m)["state"] != "running", 20, "the run to end")


def start_standin_run(
    c: httpx.Client, procs: Procs, m: str | None = None, **config: object
) -> dict:
    """Start a fresh run on the master whose only worker is a stand-in; returns the reply data."""
    m = m or procs.m
    ensure_not_running(c, m)
    body = {"workers": [procs.standin.url], "heartbeat_timeout_s": 3600, "seed": 1, **config}
    r = c.post(f"{m}/train", json=body)
    assert r.status_code == 202, r.text
    return r.json()["data"]


@pytest.fixture
def run(c: httpx.Client, procs: Procs) -> Iterator[dict]:
    """A fresh running run on the plain master with a stand-in worker (no real training)."""
    data = start_standin_run(c, procs)
    yield data
    with contextlib.suppress(httpx.HTTPError):
        c.post(f"{procs.m}/stop")


def get_weights(c: httpx.Client, m: str) -> tuple[int, dict[str, torch.Tensor]]:
    r = c.get(f"{m}/global_model_weights")
    assert r.status_code == 200, r.text
    assert "x-model-version" in r.headers, r.headers
    return int(r.headers["x-model-version"]), load(r.content)


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def push_gradients(
    c: httpx.Client, m: str, body: bytes, version: int, worker_id: str = "bb"
) -> httpx.Response:
    return c.post(
        f"{m}/gradients",
        content=body,
        headers={
            "Content-Type": "application/octet-stream",
            "X-Worker-Id": worker_id,
            "X-Model-Version": str(version),
        },
    )


def grads_like(weights: dict[str, torch.Tensor], value: float = 0.01) -> dict[str, torch.Tensor]:
    return {k: torch.full_like(t, value) for k, t in weights.items()}


def post_episode(c: httpx.Client, m: str, reward: float, length: int, wid: str = "bb") -> dict:
    r = c.post(f"{m}/episode", json={"worker_id": wid, "reward": reward, "length": length})
    assert r.status_code == 200, r.text
    return r.json()["data"]


def flags(body: object) -> list[bool]:
    """Every boolean in a reply (top level, and inside `data` when it is an object)."""
    found = []
    if isinstance(body, dict):
        for v in body.values():
            if isinstance(v, bool):
                found.append(v)
            elif isinstance(v, dict):
                found += [x for x in v.values() if isinstance(x, bool)]
    return found


# ------------------------------------------------------------------------------ health, status


def test_healthz_on_master_and_workers(c: httpx.Client, procs: Procs) -> None:
    for p in [*procs.plain.processes, *procs.token.processes]:
        r = c.get(f"{p.url}/healthz")  # no token, also on the token cluster
        assert r.status_code == 200, (p.app, r.text)
        assert r.json() == {"status": "ok"}


def test_status_has_every_listed_field(c: httpx.Client, procs: Procs, run: dict) -> None:
    s = status(c, procs.m)
    missing = [f for f in STATUS_FIELDS if f not in s]
    assert not missing, missing
    assert s["state"] == "running"
    assert s["run_id"] == run["run_id"] and isinstance(s["run_id"], str)
    assert s["env_id"] == "CartPole-v1"
    for f in ["global_episode", "global_steps", "model_version", "updates_applied",
              "updates_rejected", "queue_length", "queue_dropped"]:
        assert type(s[f]) is int and s[f] >= 0, (f, s[f])
    for f in ["best_score", "moving_average", "mean_return_100"]:
        assert s[f] is None or is_number(s[f]), (f, s[f])
    assert isinstance(s["solved"], bool) and s["solved"] is False
    assert is_number(s["elapsed_s"]) and s["elapsed_s"] >= 0
    assert isinstance(s["config"], dict)
    assert isinstance(s["workers"], list) and len(s["workers"]) == 1
    for w in s["workers"]:
        for f in ["worker_id", "url", "state", "last_seen_s", "episodes", "steps"]:
            assert f in w, (f, w)
        assert w["state"] in WORKER_STATES, w
        assert w["url"].rstrip("/").endswith(f"{HOST}:{procs.standin.port}"), w
        assert is_number(w["last_seen_s"]) and type(w["episodes"]) is int, w
        assert type(w["steps"]) is int, w


def test_status_config_is_resolved_with_the_readme_defaults(
    c: httpx.Client, procs: Procs, run: dict
) -> None:
    config = status(c, procs.m)["config"]
    assert config["seed"] == 1 and config["heartbeat_timeout_s"] == 3600
    wrong = {k: (v, config.get(k, "<absent>")) for k, v in CONFIG_DEFAULTS.items()
             if config.get(k, "<absent>") != v}
    assert not wrong, wrong


# ------------------------------------------------------------------------- seed-compatible state


def test_best_score_read_and_raise(c: httpx.Client, procs: Procs, run: dict) -> None:
    m = procs.m
    r = c.post(f"{m}/best_score", json={"data": 50, "worker_id": "bb"})
    assert r.status_code == 200, r.text
    assert r.json()["data"] == 50 and flags(r.json()) == [True], r.json()
    assert c.get(f"{m}/best_score").json()["data"] == 50
    r = c.post(f"{m}/best_score", json={"data": 20, "worker_id": "bb"})
    assert r.status_code == 200 and r.json()["data"] == 50 and flags(r.json()) == [False], r.text
    assert c.get(f"{m}/best_score").json() == {"data": 50}
    r = c.post(f"{m}/best_score", json={"data": 70.5, "worker_id": "bb"})
    assert r.json()["data"] == 70.5 and flags(r.json()) == [True], r.text
    assert status(c, m)["best_score"] == 70.5
    bad = c.post(f"{m}/best_score", json={"data": "lots", "worker_id": "bb"})
    assert "data" in assert_error(bad)
    assert c.get(f"{m}/best_score").json() == {"data": 70.5}


def test_global_episode_read_and_add(c: httpx.Client, procs: Procs, run: dict) -> None:
    m = procs.m
    n = c.get(f"{m}/global_episode").json()["data"]
    assert type(n) is int
    r = c.post(f"{m}/global_episode")
    assert r.status_code == 200 and r.json() == {"data": n + 1}, r.text
    r = c.post(f"{m}/global_episode", json={"data": 5})
    assert r.status_code == 200 and r.json() == {"data": n + 6}, r.text
    assert c.get(f"{m}/global_episode").json() == {"data": n + 6}
    assert status(c, m)["global_episode"] == n + 6
    assert_error(c.post(f"{m}/global_episode", json={"data": "many"}))
    assert c.get(f"{m}/global_episode").json() == {"data": n + 6}


def test_global_episode_adds_atomically(c: httpx.Client, procs: Procs, run: dict) -> None:
    m = procs.m
    n = c.get(f"{m}/global_episode").json()["data"]
    replies: list[int] = []

    def add() -> None:
        with httpx.Client(timeout=30, trust_env=False) as own:
            for _ in range(10):
                replies.append(own.post(f"{m}/global_episode").json()["data"])

    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(replies) == list(range(n + 1, n + 41))
    assert c.get(f"{m}/global_episode").json() == {"data": n + 40}


def test_global_moving_average_folding(c: httpx.Client, procs: Procs, run: dict) -> None:
    m = procs.m
    expected = None
    for r_ in [100.0, 0.0, 50.0, 500.0, 12.25]:
        expected = r_ if expected is None else 0.99 * expected + 0.01 * r_
        r = c.post(f"{m}/global_moving_average", json={"data": r_})
        assert r.status_code == 200, r.text
        assert r.json()["data"] == pytest.approx(expected, rel=1e-12, abs=1e-12), (r_, r.json())
    assert c.get(f"{m}/global_moving_average").json()["data"] == pytest.approx(expected, rel=1e-12)
    assert status(c, m)["moving_average"] == pytest.approx(expected, rel=1e-12)
    assert_error(c.post(f"{m}/global_moving_average", json={"data": "high"}))
    assert_error(c.post(f"{m}/global_moving_average", json={}))
    assert c.get(f"{m}/global_moving_average").json()["data"] == pytest.approx(expected, rel=1e-12)


def test_queue_fifo_empty_and_create_queue(c: httpx.Client, procs: Procs) -> None:
    m = procs.m
    r = c.post(f"{m}/create_queue")
    assert r.status_code == 200 and "data" in r.json(), r.text
    assert c.get(f"{m}/queue").json() == {"data": None, "empty": True}
    for x in [1.5, 2.5]:
        r = c.post(f"{m}/queue", json={"data": x})
        assert r.status_code == 200 and "data" in r.json(), r.text
    assert status(c, m)["queue_length"] == 2
    first, second = c.get(f"{m}/queue"), c.get(f"{m}/queue")
    assert first.status_code == 200 and first.json()["data"] == 1.5, first.text
    assert second.json()["data"] == 2.5, second.text
    r = c.get(f"{m}/queue")
    assert r.status_code == 200 and r.json() == {"data": None, "empty": True}, r.text
    c.post(f"{m}/queue", json={"data": 9})
    assert c.post(f"{m}/create_queue").status_code == 200
    assert c.get(f"{m}/queue").json() == {"data": None, "empty": True}
    assert status(c, m)["queue_length"] == 0
    assert_error(c.post(f"{m}/queue", json={"data": "nine"}))
    assert_error(c.post(f"{m}/queue", json={}))


def test_queue_is_bounded_dropping_the_oldest(c: httpx.Client, procs: Procs) -> None:
    m = procs.m
    c.post(f"{m}/create_queue")
    dropped = status(c, m)["queue_dropped"]
    for x in range(1, QUEUE_MAX + 3):
        assert c.post(f"{m}/queue", json={"data": x}).status_code == 200
    s = status(c, m)
    assert s["queue_length"] == QUEUE_MAX and s["queue_dropped"] == dropped + 2, s
    popped = [c.get(f"{m}/queue").json()["data"] for _ in range(QUEUE_MAX)]
    assert popped == list(range(3, QUEUE_MAX + 3))
    assert c.get(f"{m}/queue").json() == {"data": None, "empty": True}


def test_worker_registry_started_done_failed(c: httpx.Client, procs: Procs, run: dict) -> None:
    m = procs.m
    for wid in ["bb-a", "bb-b"]:
        r = c.post(f"{m}/worker_started", json={"worker_id": wid, "url": f"http://{HOST}:9"})
        assert r.status_code == 200 and "data" in r.json(), r.text
    ws = c.get(f"{m}/workers_status").json()["data"]
    by_id = {w["worker_id"]: w for w in ws["workers"]}
    assert {"bb-a", "bb-b"} <= by_id.keys(), ws
    assert ws["done"] is False and ws["active"] >= 2, ws

    r = c.post(f"{m}/worker_done", json={"worker_id": "bb-a"})
    assert r.status_code == 200 and "data" in r.json(), r.text
    r = c.post(f"{m}/worker_done", json={"worker_id": "bb-b", "error": "simulator crashed"})
    assert r.status_code == 200, r.text
    by_id = {w["worker_id"]: w for w in status(c, m)["workers"]}
    assert by_id["bb-a"]["state"] == "done", by_id
    assert by_id["bb-b"]["state"] == "failed", by_id
    assert "simulator crashed" in json.dumps(by_id["bb-b"]), by_id["bb-b"]
    ws = c.get(f"{m}/workers_status").json()["data"]
    assert {w["worker_id"]: w["state"] for w in ws["workers"]}["bb-b"] == "failed", ws

    # The stand-in (w1) is the last one not finished; once it is done, so is everybody.
    assert c.post(f"{m}/worker_done", json={"worker_id": "w1"}).status_code == 200
    ws = c.get(f"{m}/workers_status").json()["data"]
    assert ws["done"] is True and ws["active"] == 0, ws

    assert "worker_id" in assert_error(c.post(f"{m}/worker_started", json={"url": "http://x:1"}))
    assert "worker_id" in assert_error(c.post(f"{m}/worker_done", json={}))


# ------------------------------------------------------------------------------- run control


def test_train_202_reply_and_start_worker_calls(c: httpx.Client, procs: Procs) -> None:
    m = procs.m
    ensure_not_running(c, m)
    a, b = procs.standins
    before_a, before_b = len(a.starts()), len(b.starts())
    r = c.post(
        f"{m}/train",
        json={"workers": [a.url, f"{HOST}:{b.port}"], "heartbeat_timeout_s": 3600, "seed": 5},
    )
    assert r.status_code == 202, r.text
    data = r.json()["data"]
    assert isinstance(data["run_id"], str) and data["run_id"]
    assert len(data["workers"]) == 2, data
    for entry, s in zip(data["workers"], [a, b], strict=True):
        assert {"url", "started", "error"} <= entry.keys(), entry
        assert entry["url"].rstrip("/").endswith(f"{HOST}:{s.port}"), entry
        assert entry["started"] is True and entry["error"] is None, entry
    (start_a,), (start_b,) = a.starts()[before_a:], b.starts()[before_b:]
    # Without A3C_MASTER_URL or "master_url", workers get the URL /train was addressed to.
    assert start_a["body"]["master_url"].rstrip("/") == m, start_a
    assert [start_a["body"]["worker_id"], start_b["body"]["worker_id"]] == ["w1", "w2"]
    assert start_a["body"]["config"]["seed"] == 5, start_a
    assert start_a["body"].get("run_id") == data["run_id"], start_a
    assert status(c, m)["run_id"] == data["run_id"]

    again = c.post(f"{m}/train", json={"workers": [a.url], "heartbeat_timeout_s": 3600})
    assert_error(again, 409)
    assert status(c, m)["run_id"] == data["run_id"]
    assert len(a.starts()) == before_a + 1
    assert c.post(f"{m}/stop").status_code < 300


def test_train_master_url_in_body_is_sent_to_workers(c: httpx.Client, procs: Procs) -> None:
    alias = f"http://localhost:{procs.master.port}"
    before = len(procs.standin.starts())
    start_standin_run(c, procs, master_url=alias)
    (start,) = procs.standin.starts()[before:]
    assert start["body"]["master_url"].rstrip("/") == alias, start
    c.post(f"{procs.m}/stop")


def test_train_reports_an_unreachable_worker(c: httpx.Client, procs: Procs) -> None:
    m = procs.m
    ensure_not_running(c, m)
    dead = f"http://{HOST}:{free_port()}"
    r = c.post(
        f"{m}/train", json={"workers": [procs.standin.url, dead], "heartbeat_timeout_s": 3600}
    )
    assert r.status_code == 202, r.text
    ok, bad = r.json()["data"]["workers"]
    assert ok["started"] is True and ok["error"] is None, ok
    assert bad["started"] is False and isinstance(bad["error"], str) and bad["error"], bad
    c.post(f"{m}/stop")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"bogus_field": 1}, "bogus_field"),
        ({"lr": -1}, "lr"),
        ({"num_envs": "two"}, "num_envs"),
        ({"num_envs": 0}, "num_envs"),
        ({"sync_mode": "telepathy"}, "sync_mode"),
        ({"max_staleness": -1}, "max_staleness"),
        ({"gamma": 1.5}, "gamma"),
        ({"hidden_sizes": "big"}, "hidden_sizes"),
        ({"env_id": "NoSuchEnv-v0"}, "env_id"),
        ({"heartbeat_interval_s": 5, "heartbeat_timeout_s": 1}, "heartbeat_timeout_s"),
    ],
)
def test_train_rejects_bad_config_naming_the_field(
    c: httpx.Client, procs: Procs, body: dict, field: str
) -> None:
    m = procs.m
    ensure_not_running(c, m)
    before = status(c, m)["run_id"]
    r = c.post(f"{m}/train", json={"workers": [procs.standin.url], **body})
    assert field in assert_error(r, 422)
    s = status(c, m)
    assert s["state"] != "running" and s["run_id"] == before, s


def test_stop_finishes_the_run_and_workers_are_told(
    c: httpx.Client, procs: Procs, run: dict
) -> None:
    m = procs.m
    r = c.post(f"{m}/heartbeat", json={"worker_id": "w1"})
    assert r.status_code == 200 and r.json() == {"data": {"stop": False}}, r.text
    r = c.post(f"{m}/stop")
    assert 200 <= r.status_code < 300, r.text
    assert status(c, m)["state"] == "finished"
    r = c.post(f"{m}/heartbeat", json={"worker_id": "w1"})
    assert r.status_code == 200 and r.json() == {"data": {"stop": True}}, r.text
    assert post_episode(c, m, 10, 10, "w1")["stop"] is True


def test_stop_without_a_running_run_is_idempotent(c: httpx.Client, procs: Procs) -> None:
    # README: POST /stop is idempotent; `stopped` says whether it ended a running run.
    ensure_not_running(c, procs.m)
    before = status(c, procs.m)
    r = c.post(f"{procs.m}/stop")
    assert r.status_code == 200, r.text
    assert r.json()["data"]["stopped"] is False
    after = status(c, procs.m)
    assert after["state"] == before["state"] and after["run_id"] == before["run_id"]


# ---------------------------------------------------------------------- episodes and heartbeats


EPISODE_REPLY = ("global_episode", "moving_average", "best_score", "improved", "stop")


def test_episode_folds_into_every_statistic(c: httpx.Client, procs: Procs, run: dict) -> None:
    m = procs.m
    c.post(f"{m}/create_queue")
    first = post_episode(c, m, 37, 37)
    # API.md grows only by adding: its fields must be there with these values, others may follow.
    assert {k: first.get(k) for k in EPISODE_REPLY} == {
        "global_episode": 1, "moving_average": 37, "best_score": 37, "improved": True,
        "stop": False,
    }, first
    second = post_episode(c, m, 10, 10)
    avg = 0.99 * 37 + 0.01 * 10
    assert second["global_episode"] == 2 and second["best_score"] == 37, second
    assert second["moving_average"] == pytest.approx(avg, rel=1e-12), second
    assert second["improved"] is False and second["stop"] is False, second
    s = status(c, m)
    assert (s["global_episode"], s["global_steps"], s["best_score"]) == (2, 47, 37), s
    assert s["mean_return_100"] == pytest.approx(23.5) and s["queue_length"] == 2, s
    assert c.get(f"{m}/queue").json()["data"] == 37
    assert c.get(f"{m}/queue").json()["data"] == pytest.approx(avg, rel=1e-12)
    assert c.get(f"{m}/global_episode").json() == {"data": 2}
    assert c.get(f"{m}/best_score").json()["data"] == 37
    assert "reward" in assert_error(c.post(f"{m}/episode", json={"worker_id": "bb", "length": 1}))
    assert c.get(f"{m}/global_episode").json() == {"data": 2}


def test_mean_return_100_is_over_the_last_100(c: httpx.Client, procs: Procs, run: dict) -> None:
    for reward in range(1, 106):
        post_episode(c, procs.m, reward, 1)
    s = status(c, procs.m)
    assert s["global_episode"] == 105 and s["global_steps"] == 105, s
    assert s["mean_return_100"] == pytest.approx(sum(range(6, 106)) / 100), s


def test_run_finishes_on_max_episodes(c: httpx.Client, procs: Procs) -> None:
    m = procs.m
    start_standin_run(c, procs, max_episodes=3)
    replies = [post_episode(c, m, 10, 5) for _ in range(3)]
    assert [r["stop"] for r in replies] == [False, False, True], replies
    s = status(c, m)
    assert s["state"] == "finished" and s["solved"] is False and s["global_episode"] == 3, s
    r = c.post(f"{m}/heartbeat", json={"worker_id": "w1"})
    assert r.json() == {"data": {"stop": True}}, r.text


def test_run_finishes_when_target_return_is_reached(c: httpx.Client, procs: Procs) -> None:
    m = procs.m
    start_standin_run(c, procs, target_return=50)
    replies = [post_episode(c, m, 60, 5) for _ in range(100)]
    assert replies[-1]["stop"] is True, replies[-1]
    s = status(c, m)
    assert s["state"] == "finished" and s["solved"] is True, s
    assert s["mean_return_100"] == pytest.approx(60), s


def test_target_return_needs_a_full_window_of_100_episodes(
    c: httpx.Client, procs: Procs
) -> None:
    # README: like gymnasium's "solved", target_return is judged over 100 consecutive episodes;
    # mean_return_100 shows the mean of the episodes so far until there are 100.
    m = procs.m
    start_standin_run(c, procs, target_return=50)
    replies = [post_episode(c, m, 60, 5) for _ in range(99)]
    s = status(c, m)
    assert s["mean_return_100"] == pytest.approx(60), s
    assert s["state"] == "running" and s["solved"] is False, s
    assert not any(r["stop"] for r in replies)
    last = post_episode(c, m, 60, 5)
    s = status(c, m)
    assert last["stop"] is True, last
    assert s["state"] == "finished" and s["solved"] is True, s
    assert s["finish_reason"].startswith("solved"), s


def test_heartbeat_keeps_a_worker_running(c: httpx.Client, procs: Procs, run: dict) -> None:
    m = procs.m
    assert status(c, m)["workers"][0]["state"] in {"starting", "running"}
    r = c.post(f"{m}/heartbeat", json={"worker_id": "w1", "steps_per_s": 1000, "episodes": 3})
    assert r.status_code == 200 and r.json() == {"data": {"stop": False}}, r.text
    (w1,) = status(c, m)["workers"]
    assert w1["worker_id"] == "w1" and w1["state"] == "running", w1
    assert w1["last_seen_s"] < 5, w1
    assert "worker_id" in assert_error(c.post(f"{m}/heartbeat", json={"steps_per_s": 3}))


def test_silent_worker_becomes_lost_and_the_run_finishes(c: httpx.Client, procs: Procs) -> None:
    m = procs.m
    start_standin_run(c, procs, heartbeat_interval_s=0.1, heartbeat_timeout_s=0.5)
    s = wait_for(
        lambda: (s := status(c, m))["state"] == "finished" and s, 15, "the run to finish"
    )
    assert [w["state"] for w in s["workers"]] == ["lost"], s["workers"]


def test_lost_worker_comes_back_with_its_next_message(c: httpx.Client, procs: Procs) -> None:
    m = procs.m
    ensure_not_running(c, m)
    a, b = procs.standins
    r = c.post(f"{m}/train", json={"workers": [a.url, b.url], "heartbeat_interval_s": 0.1,
                                   "heartbeat_timeout_s": 1.0})
    assert r.status_code == 202, r.text

    def w1_lost_while_w2_beats() -> dict | None:
        assert c.post(f"{m}/heartbeat", json={"worker_id": "w2"}).status_code == 200
        states = {w["worker_id"]: w["state"] for w in status(c, m)["workers"]}
        return states if states.get("w1") == "lost" else None

    states = wait_for(w1_lost_while_w2_beats, 15, "w1 to be lost")
    assert states["w2"] == "running" and status(c, m)["state"] == "running", states
    r = c.post(f"{m}/heartbeat", json={"worker_id": "w1"})
    assert r.status_code == 200 and r.json() == {"data": {"stop": False}}, r.text
    states = {w["worker_id"]: w["state"] for w in status(c, m)["workers"]}
    assert states["w1"] == "running", states
    c.post(f"{m}/stop")


# ------------------------------------------------------------------------------------- weights


def test_weights_carry_the_version_and_honour_if_none_match(
    c: httpx.Client, procs: Procs, run: dict
) -> None:
    m = procs.m
    r = c.get(f"{m}/global_model_weights")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/octet-stream"), r.headers
    version = int(r.headers["x-model-version"])
    weights = load(r.content)
    assert weights and all(t.dtype == torch.float32 for t in weights.values())
    assert status(c, m)["model_version"] == version
    r304 = c.get(f"{m}/global_model_weights", headers={"If-None-Match": f'"{version}"'})
    assert r304.status_code == 304 and r304.content == b"", (r304.status_code, r304.content[:50])
    old = c.get(f"{m}/global_model_weights", headers={"If-None-Match": f'"{version + 7}"'})
    assert old.status_code == 200 and int(old.headers["x-model-version"]) == version
    assert same_weights(load(old.content), weights)


def test_a_new_run_never_reuses_a_model_version(c: httpx.Client, procs: Procs) -> None:
    m = procs.m
    start_standin_run(c, procs, seed=1)
    v0, w0 = get_weights(c, m)
    assert push_gradients(c, m, save(grads_like(w0)), v0).status_code == 200
    v1, w1 = get_weights(c, m)
    start_standin_run(c, procs, seed=2)  # stops the first run, builds fresh weights
    v2, w2 = get_weights(c, m)
    assert push_gradients(c, m, save(grads_like(w2)), v2).status_code == 200
    v3, w3 = get_weights(c, m)
    # A client that cached the first run's version v1 asks whether the weights changed.
    cached = c.get(f"{m}/global_model_weights", headers={"If-None-Match": f'"{v1}"'})
    c.post(f"{m}/stop")
    assert not same_weights(w2, w1) and not same_weights(w3, w1)
    assert cached.status_code == 200, f"304 for version {v1}, which named other weights"
    assert (v2, v3) == (v1 + 1, v1 + 2), (v0, v1, v2, v3)


def test_local_weights_temporary_and_global(c: httpx.Client, procs: Procs, run: dict) -> None:
    m = procs.m
    v0, w0 = get_weights(c, m)
    url = f"{m}/local_model_weights"
    other = {k: t + 1.0 for k, t in w0.items()}
    r = c.post(url, params={"worker_id": "bb", "temporary": "true"}, content=save(other),
               headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 200 and "data" in r.json(), r.text
    v1, w1 = get_weights(c, m)
    assert v1 == v0 and same_weights(w1, w0), "temporary=true changed the global weights"

    r = c.post(url, params={"worker_id": "bb", "temporary": "false"}, content=save(other),
               headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 200 and "data" in r.json(), r.text
    v2, w2 = get_weights(c, m)
    assert v2 == v0 + 1 and same_weights(w2, other)
    assert status(c, m)["model_version"] == v2


def test_local_weights_that_do_not_fit_are_refused(
    c: httpx.Client, procs: Procs, run: dict
) -> None:
    m = procs.m
    v0, w0 = get_weights(c, m)
    key = next(iter(w0))
    nan = {k: t.clone() for k, t in w0.items()}
    nan[key].view(-1)[0] = float("nan")
    missing = {k: t for k, t in w0.items() if k != key}
    for bad in [save(nan), save(missing), b"definitely not safetensors"]:
        r = c.post(f"{m}/local_model_weights", params={"worker_id": "bb", "temporary": "false"},
                   content=bad, headers={"Content-Type": "application/octet-stream"})
        assert_error(r)
    v1, w1 = get_weights(c, m)
    assert v1 == v0 and same_weights(w1, w0)


# ----------------------------------------------------------------------------------- gradients


def test_gradients_apply_and_return_the_new_weights(
    c: httpx.Client, procs: Procs, run: dict
) -> None:
    m = procs.m
    v0, w0 = get_weights(c, m)
    applied = status(c, m)["updates_applied"]
    body = save(grads_like(w0))
    for step in (1, 2):
        r = push_gradients(c, m, body, v0 + step - 1)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("application/octet-stream"), r.headers
        assert int(r.headers["x-model-version"]) == v0 + step, r.headers
        new = load(r.content)
        assert new.keys() == w0.keys()
        assert all(new[k].shape == w0[k].shape for k in w0)
        assert not any(torch.equal(new[k], w0[k]) for k in w0), "some weights did not move"
        v, current = get_weights(c, m)
        assert v == v0 + step and same_weights(current, new)
    s = status(c, m)
    assert s["model_version"] == v0 + 2 and s["updates_applied"] == applied + 2, s


def test_stale_gradients_are_409_and_nothing_is_applied(c: httpx.Client, procs: Procs) -> None:
    m = procs.m
    start_standin_run(c, procs, max_staleness=1)
    v0, w0 = get_weights(c, m)
    body = save(grads_like(w0))
    assert push_gradients(c, m, body, v0).status_code == 200
    assert push_gradients(c, m, body, v0 + 1).status_code == 200
    before = status(c, m)
    v, w = get_weights(c, m)
    assert v == v0 + 2
    assert_error(push_gradients(c, m, body, v0), 409)  # two versions old, max_staleness 1
    after = status(c, m)
    v_after, w_after = get_weights(c, m)
    assert v_after == v and same_weights(w_after, w)
    assert after["updates_applied"] == before["updates_applied"], after
    assert after["updates_rejected"] == before["updates_rejected"] + 1, after
    # Exactly max_staleness versions old is still accepted.
    r = push_gradients(c, m, body, v - 1)
    assert r.status_code == 200 and int(r.headers["x-model-version"]) == v + 1, r.text
    c.post(f"{m}/stop")


def _nan(g: dict) -> bytes:
    g = {k: t.clone() for k, t in g.items()}
    next(iter(g.values())).view(-1)[0] = float("nan")
    return save(g)


def _inf(g: dict) -> bytes:
    g = {k: t.clone() for k, t in g.items()}
    next(iter(g.values())).view(-1)[-1] = float("inf")
    return save(g)


def _missing(g: dict) -> bytes:
    return save(dict(list(g.items())[1:]))


def _extra(g: dict) -> bytes:
    return save({**g, "extra_head.weight": torch.zeros(3, 3)})


def _shape(g: dict) -> bytes:
    key = next(iter(g))
    return save({**g, key: torch.zeros(*g[key].shape, 2)})


def _dtype(g: dict) -> bytes:
    return save({k: t.double() for k, t in g.items()})


def _garbage(g: dict) -> bytes:
    return b"\x00" * 64


@pytest.mark.parametrize(
    "make_body", [_nan, _inf, _missing, _extra, _shape, _dtype, _garbage],
    ids=["nan", "inf", "missing", "extra", "shape", "dtype", "not-safetensors"],
)
def test_bad_gradients_are_422_and_nothing_is_applied(
    c: httpx.Client, procs: Procs, run: dict, make_body: Callable[[dict], bytes]
) -> None:
    m = procs.m
    v0, w0 = get_weights(c, m)
    applied = status(c, m)["updates_applied"]
    assert_error(push_gradients(c, m, make_body(grads_like(w0)), v0), 422)
    v1, w1 = get_weights(c, m)
    assert v1 == v0 and same_weights(w1, w0)
    assert status(c, m)["updates_applied"] == applied


def test_oversized_body_is_413(c: httpx.Client, procs: Procs, run: dict) -> None:
    m = procs.m
    v0, w0 = get_weights(c, m)
    r = push_gradients(c, m, b"\x00" * (MAX_BODY + 1), v0)
    assert r.status_code == 413, (r.status_code, r.text[:200])
    assert get_weights(c, m)[0] == v0


# ------------------------------------------------------------------------------------ workers


def test_worker_status_fields(c: httpx.Client, procs: Procs) -> None:
    for w in procs.plain.workers:
        s = status(c, w.url)
        for f in ["state", "worker_id", "master_url", "episodes", "steps", "last_reward",
                  "steps_per_s", "error", "run_id", "time"]:
            assert f in s, (f, s)
        assert s["state"] in WORKER_PROCESS_STATES, s


def test_worker_stop_when_idle_is_202(c: httpx.Client, procs: Procs) -> None:
    w = procs.plain.workers[1]
    wait_for(lambda: status(c, w.url)["state"] not in {"running", "stopping"}, 30, "idle worker")
    r = c.post(f"{w.url}/stop")
    assert r.status_code == 202, r.text


def test_worker_start_409_while_running_then_stop(c: httpx.Client, procs: Procs) -> None:
    m = procs.m
    run = start_standin_run(c, procs)
    w = procs.plain.workers[0]
    wait_for(lambda: status(c, w.url)["state"] not in {"running", "stopping"}, 30, "idle worker")
    body = {
        "master_url": m, "worker_id": "w9", "run_id": run["run_id"],
        "config": {"num_envs": 2, "seed": 3, "heartbeat_interval_s": 0.5},
    }
    no_master = {k: v for k, v in body.items() if k != "master_url"}
    assert "master_url" in assert_error(c.post(f"{w.url}/start_worker", json=no_master))
    assert status(c, w.url)["state"] not in {"running", "stopping"}
    r = c.post(f"{w.url}/start_worker", json=body)
    assert r.status_code == 202, r.text
    s = wait_for(
        lambda: (s := status(c, w.url))["state"] == "running" and s, 30, "the worker to run"
    )
    assert s["worker_id"] == "w9" and s["master_url"].rstrip("/") == m, s
    assert s["run_id"] == run["run_id"], s
    assert_error(c.post(f"{w.url}/start_worker", json=body), 409)
    # It trains against that master: registered there, and reporting.
    wait_for(
        lambda: any(x["worker_id"] == "w9" and x["state"] == "running"
                    for x in status(c, m)["workers"]),
        30, "the master to see w9 running",
    )
    wait_for(lambda: status(c, m)["updates_applied"] > 0, 30, "w9's gradients to arrive")
    r = c.post(f"{w.url}/stop")
    assert r.status_code == 202, r.text
    s = wait_for(
        lambda: (s := status(c, w.url))["state"] not in {"running", "stopping"} and s,
        30, "the worker to stop",
    )
    assert s["state"] != "failed" and s["error"] is None, s
    c.post(f"{m}/stop")


def test_short_real_training_run_finishes(c: httpx.Client, procs: Procs) -> None:
    m = procs.m
    ensure_not_running(c, m)
    for w in procs.plain.workers:
        wait_for(lambda w=w: status(c, w.url)["state"] not in {"running", "stopping"}, 30,
                 "idle workers")
    r = c.post(f"{m}/train", json={"num_envs": 2, "max_episodes": 30, "max_steps": None,
                                   "seed": 1})
    assert r.status_code == 202, r.text
    entries = r.json()["data"]["workers"]
    # Both workers of workers.txt (comment and blank line ignored, both URL forms accepted).
    assert [e["url"].rstrip("/").rsplit(":", 1)[1] for e in entries] == [
        str(w.port) for w in procs.plain.workers
    ], entries
    assert all(e["started"] is True and e["error"] is None for e in entries), entries
    s = wait_for(lambda: (s := status(c, m))["state"] == "finished" and s, 60, "the run to end")
    assert s["global_episode"] >= 30 and s["global_steps"] > 0, s
    assert s["mean_return_100"] is not None and s["model_version"] > 0, s
    ws = wait_for(
        lambda: (d := c.get(f"{m}/workers_status").json()["data"])["done"] and d, 30,
        "workers_status done",
    )
    states = {w["worker_id"]: w["state"] for w in ws["workers"]}
    assert states == {"w1": "done", "w2": "done"}, ws
    assert ws["active"] == 0, ws
    for w in procs.plain.workers:
        ws_ = wait_for(lambda w=w: (x := status(c, w.url))["state"] == "done" and x, 30,
                       "each worker to be done")
        assert ws_["episodes"] > 0 and ws_["error"] is None, ws_


# --------------------------------------------------------------------------- token and access

MASTER_ENDPOINTS = [
    ("GET", "/status", None),
    ("POST", "/train", {"heartbeat_timeout_s": 3600}),
    ("POST", "/stop", None),
    ("GET", "/best_score", None),
    ("POST", "/best_score", {"data": 1, "worker_id": "x"}),
    ("GET", "/global_episode", None),
    ("POST", "/global_episode", None),
    ("GET", "/global_moving_average", None),
    ("POST", "/global_moving_average", {"data": 1}),
    ("POST", "/create_queue", None),
    ("POST", "/queue", {"data": 1}),
    ("GET", "/queue", None),
    ("POST", "/worker_started", {"worker_id": "x", "url": "http://127.0.0.1:9"}),
    ("POST", "/worker_done", {"worker_id": "x"}),
    ("GET", "/workers_status", None),
    ("POST", "/local_model_weights?worker_id=x&temporary=false", None),
    ("GET", "/global_model_weights", None),
    ("POST", "/gradients", None),
    ("POST", "/episode", {"worker_id": "x", "reward": 1, "length": 1}),
    ("POST", "/heartbeat", {"worker_id": "x"}),
    ("GET", "/openapi.json", None),
    ("GET", "/docs", None),
]
WORKER_ENDPOINTS = [
    ("GET", "/status", None),
    ("POST", "/start_worker", {"master_url": "http://127.0.0.1:9", "worker_id": "x",
                               "config": {}}),
    ("POST", "/stop", None),
    ("GET", "/openapi.json", None),
]
BAD_AUTH = [{}, {"Authorization": "Bearer wrong-token"}, {"Authorization": f"Basic {TOKEN}"},
            {"Authorization": TOKEN}]


@pytest.mark.parametrize(
    ("who", "method", "path", "body"),
    [("master", *e) for e in MASTER_ENDPOINTS] + [("worker", *e) for e in WORKER_ENDPOINTS],
    ids=[f"master{p.split('?')[0]}-{mt}" for mt, p, _ in MASTER_ENDPOINTS]
    + [f"worker{p}-{mt}" for mt, p, _ in WORKER_ENDPOINTS],
)
def test_token_is_required_everywhere_but_healthz(
    c: httpx.Client, procs: Procs, who: str, method: str, path: str, body: dict | None
) -> None:
    p = procs.token.master if who == "master" else procs.token.workers[0]
    for headers in BAD_AUTH:
        r = c.request(method, f"{p.url}{path}", json=body, headers=headers)
        assert r.status_code == 401, (headers, r.status_code, r.text[:200])
        assert r.headers.get("content-type", "").startswith("application/json"), r.headers
        assert r.json(), r.text
    assert c.get(f"{p.url}/healthz").json() == {"status": "ok"}


def test_unauthorised_requests_change_nothing(
    c: httpx.Client, tc: httpx.Client, procs: Procs
) -> None:
    m = procs.token.master.url
    before = tc.get(f"{m}/global_episode").json()["data"]
    state = tc.get(f"{m}/status").json()["state"]
    assert c.post(f"{m}/global_episode").status_code == 401
    assert c.post(f"{m}/train", json={"workers": [procs.standin.url]}).status_code == 401
    assert tc.get(f"{m}/global_episode").json() == {"data": before}
    assert tc.get(f"{m}/status").json()["state"] == state


def test_right_token_works_both_ways(c: httpx.Client, tc: httpx.Client, procs: Procs) -> None:
    m, w = procs.token.master.url, procs.token.workers[0].url
    assert tc.get(f"{w}/status").status_code == 200
    assert tc.get(f"{m}/best_score").status_code == 200
    before = len(procs.standin.starts())
    run = start_standin_run(tc, procs, m=m)
    # The master sends the token to the workers it starts...
    (start,) = procs.standin.starts()[before:]
    assert start["headers"].get("authorization") == f"Bearer {TOKEN}", start["headers"]
    # A3C_MASTER_URL, when set, is the URL the workers are given.
    assert start["body"]["master_url"].rstrip("/") == MASTER_ALIAS, start["body"]
    # ...and a worker sends it to the master: it registers and pushes gradients there.
    body = {"master_url": m, "worker_id": "tw", "run_id": run["run_id"],
            "config": {"num_envs": 2, "seed": 2, "heartbeat_interval_s": 0.5}}
    r = tc.post(f"{w}/start_worker", json=body)
    assert r.status_code == 202, r.text
    wait_for(
        lambda: any(x["worker_id"] == "tw" and x["state"] == "running"
                    for x in tc.get(f"{m}/status").json()["workers"]),
        30, "the token worker to register",
    )
    wait_for(lambda: tc.get(f"{m}/status").json()["updates_applied"] > 0, 30, "gradients")
    assert tc.post(f"{m}/stop").status_code < 300
    s = wait_for(
        lambda: (s := tc.get(f"{w}/status").json())["state"] not in {"running", "stopping"}
        and s, 30, "the token worker to stop",
    )
    assert s["state"] == "done" and s["error"] is None, s


def test_non_loopback_client_without_token_is_403(c: httpx.Client, procs: Procs) -> None:
    if procs.remote is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    r = c.get(f"{procs.remote.url}/status")
    assert "A3C_TOKEN" in assert_error(r, 403)
    assert_error(c.post(f"{procs.remote.url}/global_episode"), 403)


# ------------------------------------------------------------------------------------- resume


def test_master_restarted_on_its_run_dir_resumes(
    c: httpx.Client, procs: Procs, tmp_path: Path
) -> None:
    env = {"A3C_RUN_DIR": str(tmp_path / "run"), "A3C_WORKERS_FILE": str(tmp_path / "none.txt")}
    (tmp_path / "none.txt").write_text("")
    first = ServiceProcess("master.app:app", free_port(), tmp_path / "m1.log", env=env)
    second = ServiceProcess("master.app:app", free_port(), tmp_path / "m2.log", env=env)
    try:
        first.start().wait_healthy(60)
        run = start_standin_run(c, procs, m=first.url)
        post_episode(c, first.url, 42, 42)
        v0, w0 = get_weights(c, first.url)
        assert push_gradients(c, first.url, save(grads_like(w0)), v0).status_code == 200
        before = status(c, first.url)
        _, weights = get_weights(c, first.url)
        first.stop()
        assert not first.running()
        second.start().wait_healthy(60)
        after = status(c, second.url)
        for f in ["state", "run_id", "global_episode", "global_steps", "best_score",
                  "moving_average", "model_version", "updates_applied"]:
            assert after[f] == before[f], (f, before[f], after[f])
        assert after["run_id"] == run["run_id"] and after["state"] == "running"
        v, resumed = get_weights(c, second.url)
        assert v == before["model_version"] and same_weights(resumed, weights)
    finally:
        first.stop()
        second.stop()
        assert not first.running() and not second.running()
