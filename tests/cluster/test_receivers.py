"""The master's receivers (master/ingress/receivers.py, master/ingress/receiver.py): processes that
take gradient pushes on a port of their own and hand them to the master. What only real processes
show: pushes through the receivers are counted exactly as the master's own port counts them, under
load and with retries; a receiver answers as the master's port does; a receiver that dies is started
again; and the receivers end with a killed master and come back with it. A real run's gradients and
rollouts through them: tests/cluster/test_mutual_tls.py."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from a3c_http.algos.registry import model_for, train_config
from a3c_http.local.cluster import (
    ServiceProcess,
    free_port,
    stat_fields,
    wait_for,
)
from a3c_http.testing.standin import StandInWorker
from a3c_http.wire.tensors import Layout
from tests.support.common import AUTH, OCTET, STAND_IN_RUN, TOKEN

pytestmark = pytest.mark.integration

JSON = {"Content-Type": "application/json"}
LAYOUT = Layout.of(model_for(train_config()))
GRADIENTS = LAYOUT.encode(torch.full((LAYOUT.numel,), 1e-4))


def receivers_env(tmp: Path, port: int) -> dict[str, str]:
    return {
        "A3C_RUN_DIR": str(tmp / "run"),
        "A3C_WORKERS_FILE": str(tmp / "workers.txt"),
        "A3C_PERSIST_INTERVAL_S": "1",
        "A3C_RECEIVERS": "2",
        "A3C_RECEIVERS_BIND": f"127.0.0.1:{port}",
    }


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """A master with two receivers and the token, running a run of a stand-in worker."""
    tmp = tmp_path_factory.mktemp("receivers")
    with pytest.MonkeyPatch.context() as mp:
        for key in list(os.environ):
            if key.startswith("A3C_"):
                mp.delenv(key)
        proc = ServiceProcess(
            "master.app:app", free_port(), tmp / "master.log",
            env=receivers_env(tmp, free_port()), token=TOKEN,
        )
    try:
        proc.start().wait_healthy(60)
        yield proc
    finally:
        proc.stop()


def status(http: httpx.Client, master: ServiceProcess) -> dict:
    reply = http.get(f"{master.url}/status")
    reply.raise_for_status()
    return reply.json()


def push(http: httpx.Client, url: str, worker: str, version: int, seq: int) -> httpx.Response:
    headers = {**OCTET, "X-Worker-Id": worker, "X-Model-Version": str(version)}
    headers["X-A3C-Seq"] = str(seq)
    return http.post(f"{url}/gradients", content=GRADIENTS, headers=headers)


def test_pushes_through_the_receivers_are_counted_once_each_and_answered_as_the_master_does(
    master: ServiceProcess, standin: StandInWorker
) -> None:
    with httpx.Client(headers=AUTH, timeout=60, trust_env=False) as http:
        train = {**STAND_IN_RUN, "workers": [standin.url], "max_staleness": 10_000}
        assert http.post(f"{master.url}/train", json=train).status_code == 202
        receivers = status(http, master)["fronts"]
        assert receivers["count"] == receivers["alive"] == 2
        receiver = f"http://127.0.0.1:{receivers['port']}"
        assert standin.starts()[-1]["body"]["push_url"] == receiver
        before = status(http, master)
        workers, per_worker = 6, 25

        def pusher(n: int) -> None:
            with httpx.Client(headers=AUTH, timeout=60, trust_env=False) as own:
                own.post(f"{master.url}/worker_started", json={"worker_id": f"p{n}"})
                for seq in range(1, per_worker + 1):
                    assert push(own, receiver, f"p{n}", 0, seq).status_code == 200
                    retry = push(own, receiver, f"p{n}", 0, seq)  # the reply was lost: again
                    assert retry.headers["X-A3C-Duplicate"] == "1"

        threads = [threading.Thread(target=pusher, args=(n,)) for n in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        after = status(http, master)
        assert after["updates_applied"] - before["updates_applied"] == workers * per_worker
        assert after["fronts"]["pushes"] - receivers["pushes"] == 2 * workers * per_worker
        # A receiver answers what the master's own port answers.
        for url in (master.url, receiver):
            assert push(http, url, "stranger", 0, 1).status_code == 409
            bad = http.post(f"{url}/gradients", content=GRADIENTS, headers={**OCTET})
            assert bad.status_code == 422 and "X-Worker-Id" in bad.json()["detail"]
            tokenless = httpx.post(f"{url}/gradients", content=GRADIENTS, headers=OCTET)
            assert tokenless.status_code == 401
        assert http.get(f"{receiver}/status").status_code == 404  # the rest is the master's port


def test_a_receiver_that_dies_is_started_again_and_all_end_and_come_back_with_their_master(
    master: ServiceProcess,
) -> None:
    """One test, so that one master shows both (the killed master ends the module's)."""
    with httpx.Client(headers=AUTH, timeout=60, trust_env=False) as http:
        first = status(http, master)["fronts"]["pids"]
        os.kill(first[0], signal.SIGKILL)
        receivers = wait_for(
            lambda: (f := status(http, master)["fronts"])["alive"] == 2
            and first[0] not in f["pids"] and f,
            30, "the receiver to be started again",
        )
        assert first[1] in receivers["pids"]

        master.kill()
        for pid in receivers["pids"]:
            wait_for(lambda pid=pid: not _alive(pid), 30, f"receiver {pid} to end")
        master.start().wait_healthy(60)
        again = status(http, master)["fronts"]
        assert again["alive"] == 2 and again["port"] == receivers["port"]
        assert set(again["pids"]).isdisjoint(receivers["pids"])


def _alive(pid: int) -> bool:
    fields = stat_fields(pid)  # None once it is gone; "Z": ended, not yet reaped
    return fields is not None and fields[0] != "Z"
