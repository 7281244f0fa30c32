"""A cluster over mutual TLS, on real processes: a master with a receiver and two workers, each
serving HTTPS and calling the others over it (start, registration, pushes through the receiver's
port and the push process, weights), started and followed by `a3c-train --master https://...`,
trains CartPole-v1 to solved; meanwhile no one but a holder of a certificate of the cluster's CA
gets a connection, and the token still applies on top."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from a3c_http.testing.localcluster import LocalCluster, free_port
from tests.support.common import TOKEN
from tests.support.tls import make_files

pytestmark = pytest.mark.integration


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


def test_a_mutual_tls_cluster_trains_and_lets_in_only_its_own(tmp_path: Path) -> None:
    files = make_files(tmp_path / "certs")
    receivers = {"A3C_RECEIVERS": "1", "A3C_RECEIVERS_BIND": f"127.0.0.1:{free_port()}"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("A3C_")}
    env.update(files.env(), A3C_TOKEN=TOKEN)
    cluster = LocalCluster(
        tmp_path / "run", tmp_path / "logs",
        [("127.0.0.1", free_port()), ("127.0.0.1", free_port())],
        token=TOKEN, env={**files.env(), **receivers},
    )
    train = None
    try:
        cluster.start(timeout_s=120)
        assert cluster.master.url.startswith("https://")
        train = subprocess.Popen(
            [str(Path(sys.executable).with_name("a3c-train")), "--master", cluster.master.url,
             "--env", "CartPole-v1", "--every", "2"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
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
        out, _ = train.communicate(timeout=240)
        assert train.returncode == 0, out
        status = cluster.status()
        assert status["solved"], out
        assert status["fronts"]["pushes"] > 0  # the workers' pushes took the receiver's port
        assert all(w["url"].startswith("https://") for w in status["workers"])
    finally:
        if train is not None and train.poll() is None:
            train.kill()
            train.wait()
        cluster.close()
