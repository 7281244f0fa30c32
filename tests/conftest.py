"""Shared fixtures. The real processes of the integration tests: one cluster for the whole
session (`cluster`), which every test gets back up and idle, since a worker serves run after run."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from typing import BinaryIO

import pytest
import torch

from a3c_http.local.cluster import ROOT, LocalCluster, ServiceProcess, free_port
from a3c_http.server import logs
from a3c_http.testing.standin import StandInWorker
from tests.support.common import MAX_BODY, TOKEN
from tests.support.log_capture import CapturedEvents
from tests.support.zygote import Zygote


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> Iterator[None]:
    # The tests use tiny tensors: on a busy 2-core machine extra intra-op threads only contend
    # (the rollout tests ran 10x slower with torch's default).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True, scope="session")
def _preloaded_services() -> Iterator[None]:
    """Masters and workers started by ServiceProcess are forked from a process that imported
    torch and the web stack once (tests/support/zygote.py), where it can start them as a new
    interpreter would: about 1.5 s of CPU less for each of the 30 or so the suite starts."""
    zygotes: list[Zygote] = []  # started at the first service, so runs that start none skip it
    plain = ServiceProcess.launch

    first = threading.Lock()

    def launch(cmd: list[str], env: dict[str, str], log: BinaryIO) -> object:
        with first:
            if not zygotes:
                zygotes.append(Zygote(ROOT))
        zygote = zygotes[0]
        return zygote.launch(cmd, env, log) if zygote.serves(cmd, env) else plain(cmd, env, log)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ServiceProcess, "launch", staticmethod(launch))
        yield
    for zygote in zygotes:
        zygote.close()


@pytest.fixture(scope="session")
def session_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A master and three workers with a token (so every real run carries it both ways), a
    persist interval of 1 s (a killed master loses at most that), a body limit of MAX_BODY, and
    the test environments allowed (`tests.support.envs`)."""
    tmp = tmp_path_factory.mktemp("cluster")
    with pytest.MonkeyPatch.context() as mp:
        for key in list(os.environ):
            if key.startswith("A3C_"):
                mp.delenv(key)
        cluster = LocalCluster(
            tmp / "run",
            tmp / "logs",
            workers=[
                ("127.0.0.1", free_port()),
                ("127.0.0.1", free_port()),
                ("127.0.0.1", free_port(), {"A3C_MASTER_RETRY_S": "3"}),
            ],
            token=TOKEN,
            env={
                "A3C_PERSIST_INTERVAL_S": "1",
                "A3C_ENV_MODULES": "tests.support.envs",
                "A3C_MAX_BODY_BYTES": str(MAX_BODY),
            },
        )
    try:
        cluster.start(timeout_s=120)
        yield cluster
    finally:
        cluster.close()
        left = [f"{p.app} on port {p.port}" for p in cluster.processes if p.running()]
        assert not left, f"still running: {left}"


@pytest.fixture
def cluster(session_cluster: LocalCluster) -> LocalCluster:
    """The session cluster, every process up (a test before may have killed some) and no run
    running: each test starts the runs it needs."""
    session_cluster.start(timeout_s=120)
    session_cluster.stop_run()
    return session_cluster


@pytest.fixture(scope="session")
def standin() -> Iterator[StandInWorker]:
    """A stand-in worker host with the session cluster's token."""
    with StandInWorker(token=TOKEN) as s:
        yield s


@pytest.fixture
def captured_events(caplog: pytest.LogCaptureFixture) -> Iterator[CapturedEvents]:
    """The records of our `a3c` loggers, through caplog (tests/support/log_capture.py), set up as a
    service sets them up by default (info)."""
    logs.configure()
    events = CapturedEvents(caplog)
    logger = logging.getLogger("a3c")
    logger.addHandler(events.handler)
    try:
        yield events
    finally:
        logger.removeHandler(events.handler)
