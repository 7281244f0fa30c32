"""A cluster over mutual TLS, on real processes: a master with a receiver and two workers, each
serving HTTPS and calling the others over it (start, registration, rollouts through the receiver's
port and the push process, weights), trains a short PPO run on CartPole-v1 that
`a3c-train --master https://...` starts and follows and the Python API follows too
(`a3c_http.attach`); meanwhile no one but a holder of a certificate of the cluster's CA gets a
connection, and the token still applies on top. An idle client's connection does not keep the
master from stopping on SIGTERM (it would wait for its TLS close_notify)."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import a3c_http
from a3c_http.local.cluster import LocalCluster, free_port, wait_for
from a3c_http.net import tls
from tests.support.common import TOKEN
from tests.support.tls import make_files

pytestmark = pytest.mark.integration

PPO_RUN = {"algo": "ppo", "num_envs": 2, "t_max": 8, "max_episodes": 20, "seed": 7}


def _context(trust: Path | None, cert: Path | None, key: Path | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(trust) if trust else None)
    if cert and key:
        context.load_cert_chain(str(cert), str(key))
    return context


def _refused(url: str, verify: ssl.SSLContext | bool) -> bool:
    """True when GET `url` gets no HTTP reply at all (the connection or the handshake fails)."""
    try:
        with httpx.Client(verify=verify, trust_env=False, timeout=10) as client:
            client.get(url)
    except httpx.TransportError:
        return True
    return False


def test_a_mutual_tls_cluster_trains_and_lets_in_only_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = make_files(tmp_path / "certs")
    receivers = {"A3C_RECEIVERS": "1", "A3C_RECEIVERS_BIND": f"127.0.0.1:{free_port()}"}
    for name in [n for n in os.environ if n.startswith("A3C_")]:
        monkeypatch.delenv(name)
    cluster = LocalCluster(
        tmp_path / "run", tmp_path / "logs",
        [("127.0.0.1", free_port()), ("127.0.0.1", free_port())],
        token=TOKEN, env={**files.env(), **receivers},
    )
    try:
        cluster.start(timeout_s=120)
        assert cluster.master.url.startswith("https://")
        for name, value in files.env().items():  # this process: a client of the cluster
            monkeypatch.setenv(name, value)
        # a3c-train --master over TLS starts the run and follows it to its end.
        env = {**os.environ, "A3C_TOKEN": TOKEN}
        train = subprocess.Popen(
            [str(Path(sys.executable).with_name("a3c-train")), "--master", cluster.master.url,
             "--config", json.dumps(PPO_RUN), "--every", "1"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            ours = _context(files.ca, files.cert, files.key)
            receiver = f"https://127.0.0.1:{receivers['A3C_RECEIVERS_BIND'].rsplit(':', 1)[1]}"
            for base in (cluster.master.url, cluster.workers[0].url, receiver):
                health = f"{base}/healthz"
                assert _refused(health.replace("https://", "http://"), False), "plain HTTP"
                assert _refused(health, _context(files.ca, None, None)), "no certificate"
                assert _refused(
                    health, _context(files.ca, files.stranger_cert, files.stranger_key)
                ), "a certificate of another CA"
                assert _refused(health, _context(None, files.cert, files.key)), (
                    "a client that does not trust the cluster's CA"
                )
                with httpx.Client(verify=ours, trust_env=False, timeout=10) as client:
                    assert client.get(health).status_code == 200
            with httpx.Client(verify=ours, trust_env=False, timeout=10) as client:
                assert client.get(f"{cluster.master.url}/status").status_code == 401  # no token
            # The Python API follows the same run over TLS.
            run_id = wait_for(lambda: cluster.status()["run_id"], 60, "a3c-train's run")
            run = a3c_http.attach(cluster.master.url, token=TOKEN, progress=False)
            assert run.id == run_id
            assert run.wait(timeout_s=240)["finish_reason"] == "max_episodes=20 reached"
            out, err = train.communicate(timeout=120)
        finally:
            if train.poll() is None:
                train.kill()
                train.wait(timeout=30)
        assert "run finished: max_episodes=20 reached" in out, out + err
        assert train.returncode == 1  # followed to its end over TLS, and not solved
        # Its rollouts took the receiver's port and reached the learner (every push, one route).
        status, _ = cluster.wait_workers_settled()
        used = status["learner"]["rollouts_used"]
        assert used > 0 and status["learner"]["updates"] > 0
        assert status["fronts"]["pushes"] >= used
        assert all(w["url"].startswith("https://") for w in status["workers"])
        # The API's client and the workers' still hold idle connections to the master; SIGTERM
        # ends the master (its shutdown save included) in the time TLS allows it, not the 30 s
        # asyncio would wait.
        stopping = time.monotonic()
        assert cluster.master.stop() == -signal.SIGTERM
        assert time.monotonic() - stopping < tls.TLS_SHUTDOWN_S + 5
    finally:
        cluster.close()
