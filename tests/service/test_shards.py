"""A run with parameter-server shards (master/shards/): an in-process master whose shards are real
processes on loopback ports; the test plays the worker's three steps (stage, commit, fetch). The
shards' step itself is tests/unit/test_shard_step.py's; a worker's pushes to them in a run of real
processes, and a shard killed there, tests/cluster/test_shard_runs.py's."""

from __future__ import annotations

import copy
import json
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from a3c_http.algos.registry import train_config
from a3c_http.config.settings import Settings
from a3c_http.local.cluster import ServiceProcess, free_port, wait_for
from a3c_http.optim.flatnet import FlatNetwork
from a3c_http.wire.tensors import Layout
from master.app import create_app
from tests.support.common import OCTET, master_running, pid_running

GRADIENT = 1e-3  # every value of a push's gradients: a norm of 0.1 for the default model
SECRET = "a-secret-of-the-masters-calls"  # the master's calls to the shards started elsewhere


def plan(c) -> dict:  # noqa: ANN001 (a TestClient)
    r = c.get("/shards")
    assert r.status_code == 200, r.text
    return r.json()


def stage(c, seq: int, gradient: torch.Tensor, worker: str = "w1") -> list[dict]:  # noqa: ANN001
    """Stage `gradient` on every shard: their receipts."""
    p = plan(c)
    receipts = []
    for shard in p["shards"]:
        part = gradient[shard["lo"] : shard["hi"]]
        headers = {
            **OCTET, "X-Worker-Id": worker, "X-A3C-Seq": str(seq), "X-A3C-Shard-Epoch": p["epoch"],
        }  # fmt: skip
        body = Layout([("slice", (part.numel(),))], part.numel()).encode(part)
        r = httpx.post(f"{shard['url']}/shard/stage", content=body, headers=headers)
        assert r.status_code == 200, r.text
        receipts.append(r.json())
    return receipts


def commit(c, seq: int, receipts: list[dict], version: int | None = None, **extra):  # noqa: ANN001
    body = {
        "worker_id": "w1", "seq": seq, "receipts": receipts,
        "version": c.app.state.cluster.params.version if version is None else version,
        "report": json.dumps({"episodes": [[10.0, 10]]}), **extra,
    }  # fmt: skip
    return c.post("/shards/commit", json=body)


def shard_weights(c, version: int) -> torch.Tensor:  # noqa: ANN001
    parts = []
    for shard in plan(c)["shards"]:
        r = httpx.get(f"{shard['url']}/shard/weights", params={"version": version})
        assert r.status_code == 200, r.text
        assert int(r.headers["X-Model-Version"]) == version
        n = shard["hi"] - shard["lo"]
        parts.append(Layout([("slice", (n,))], n).decode(r.content)[0])
    return torch.cat(parts)


def shard_versions(c) -> list[int]:  # noqa: ANN001
    return [s["version"] for s in c.get("/status").json()["shards"]]


def local_settings(tmp_path: Path, **overrides: object) -> Settings:
    """A tokenless master's settings over its own folder (and `shards_urls`, with their secret)."""
    secret = {"shards_secret": SECRET} if overrides.get("shards_urls") else {}
    return Settings(
        run_dir=tmp_path / "run", workers_file=tmp_path / "w.txt", token=None, **secret,
        **overrides,
    )  # fmt: skip


@contextmanager
def running_master(settings: Settings) -> Iterator[TestClient]:
    """A master in-process over `settings`, running a run with 2 shards and one worker, w1."""
    with TestClient(create_app(settings), client=("127.0.0.1", 50000)) as c:
        urls = ["http://127.0.0.1:9001"]
        _, (worker,) = c.app.state.cluster.start_run(train_config(seed=1, shards=2), urls)
        assert c.post("/worker_started", json={"worker_id": worker}).status_code == 200
        yield c


@pytest.fixture
def sharded(tmp_path: Path):
    with master_running(tmp_path, shards=2) as c:
        yield c


def test_a_push_is_applied_by_every_shard_as_the_master_would_step_it_or_by_none(
    sharded,
) -> None:
    c = sharded
    params = c.app.state.cluster.params
    start = params.version
    # The step the master would take on its own network without shards, on a copy of it.
    expected = FlatNetwork(copy.deepcopy(params.net.model), c.app.state.cluster.ledger.config)
    n = params.net.layout.n_params
    gradient = torch.full((n,), GRADIENT)
    receipts = stage(c, 1, gradient)
    forged = [{**receipts[0], "sumsq": receipts[0]["sumsq"] / 4}, receipts[1]]
    too_large = stage(c, 2, torch.full((n,), 1.0))  # a norm of about 96: never clipped to 0.5
    refusals = [
        (commit(c, 1, receipts[:1]), 422, "one receipt of each of the 2 shards"),
        (commit(c, 1, forged), 422, "not the one it gave"),
        (commit(c, 1, [{**receipts[0], "epoch": "old"}, receipts[1]]), 409, "epoch 'old'"),
        (commit(c, 2, too_large), 422, "above max_grad_norm"),
        (commit(c, 1, receipts, run_id="another"), 409, "run"),
        (commit(c, 1, receipts, version=2**40), 409, "never had"),  # its report is counted
        # A number past any honest count would make the worker's later pushes look like retries.
        (commit(c, 2**70, receipts), 422, "seq"),
    ]
    for r, status, words in refusals:
        assert r.status_code == status, r.text
        assert words in r.json()["detail"]
    # A worker may stage and fetch, never apply, open or read a shard: the master's calls only.
    url = plan(c)["shards"][0]["url"]
    decision = {"version": start + 1, "worker": "w1", "seq": 1, "lr": 1.0}
    own = [
        httpx.post(f"{url}/shard/apply", json={"epoch": plan(c)["epoch"], "decisions": [decision]}),
        httpx.post(f"{url}/shard/open", content=b"{}", headers=OCTET),
        httpx.get(f"{url}/shard/state"),
    ]
    assert [r.status_code for r in own] == [403] * 3, [r.text for r in own]
    assert params.version == start and shard_versions(c) == [start, start]
    assert c.get("/status").json()["global_episode"] == 1  # the stale one's report

    # The staged push is still whole: its genuine commit is applied by both, not a retry, and
    # is the master's own step.
    r = commit(c, 1, receipts)
    assert r.status_code == 200, r.text
    assert r.json()["version"] == start + 1 and not r.json()["duplicate"]
    expected.step([gradient])
    torch.testing.assert_close(shard_weights(c, start + 1), expected.params.detach())
    assert shard_versions(c) == [start + 1] * 2
    # The master's own weights are the shards' at that version (gathered).
    whole = c.get("/global_model_weights")
    assert int(whole.headers["X-Model-Version"]) == start + 1
    torch.testing.assert_close(params.net.params.detach(), expected.params.detach())
    # A retry of the commit is answered, not applied again.
    again = commit(c, 1, receipts)
    assert again.status_code == 200 and again.json()["duplicate"]
    assert params.version == start + 1


def test_a_shard_killed_puts_every_shard_back_at_the_last_gathered_weights(sharded) -> None:
    c = sharded
    params = c.app.state.cluster.params
    n = params.net.layout.n_params
    assert commit(c, 1, stage(c, 1, torch.full((n,), GRADIENT))).status_code == 200
    gathered = c.get("/global_model_weights")  # the master's copy, at this version
    at = int(gathered.headers["X-Model-Version"])
    kept = params.net.params.detach().clone()
    assert commit(c, 2, stage(c, 2, torch.full((n,), -GRADIENT))).status_code == 200
    victim = c.get("/status").json()["shards"][1]["pid"]
    os.kill(victim, signal.SIGKILL)

    def back() -> bool:
        shards = c.get("/status").json()["shards"]
        return (
            all(s["alive"] for s in shards)
            and shards[1]["pid"] != victim
            and (len({s["version"] for s in shards}) == 1 and shards[0]["version"] > at + 1)
        )

    wait_for(back, 60, "the shards put back after one was killed")
    version = params.version
    assert shard_versions(c) == [version, version]
    torch.testing.assert_close(shard_weights(c, version), kept)  # the push after `at` is lost
    assert c.get("/status").json()["state"] == "running"
    # Pushes go on at the new version.
    assert commit(c, 3, stage(c, 3, torch.full((n,), GRADIENT))).status_code == 200
    wait_for(lambda: shard_versions(c) == [version + 1] * 2, 10, "both shards apply it")


def test_a_reopened_master_opens_its_shards_at_the_saved_weights(tmp_path: Path) -> None:
    settings = local_settings(tmp_path)
    with running_master(settings) as c:
        state = c.app.state.cluster
        n = state.params.net.layout.n_params
        assert commit(c, 1, stage(c, 1, torch.full((n,), GRADIENT))).status_code == 200
        assert state.persist(force=True)
        saved, version = state.params.net.params.detach().clone(), state.params.version
        pids = [s["pid"] for s in c.get("/status").json()["shards"]]
    # A master that ends ends its shards; the run in its folder is still running.
    wait_for(lambda: not any(pid_running(p) for p in pids), 10, "the shards end with the master")
    with TestClient(create_app(settings), client=("127.0.0.1", 50000)) as c:
        status = c.get("/status").json()
        assert status["state"] == "running"
        at = status["model_version"]
        assert at >= version and [s["version"] for s in status["shards"]] == [at, at]
        torch.testing.assert_close(shard_weights(c, at), saved)
        c.app.state.cluster.finish("the test is over")


def test_a_dqn_runs_target_network_is_the_shards(tmp_path: Path) -> None:
    with master_running(tmp_path, algo="dqn", shards=2, target_update=2) as c:
        params = c.app.state.cluster.params
        start, n = params.version, params.net.layout.n_params
        expected = FlatNetwork(copy.deepcopy(params.net.model), c.app.state.cluster.ledger.config)
        gradient = torch.full((n,), GRADIENT)
        at: dict[int, torch.Tensor] = {}
        for seq in (1, 2, 3):
            assert commit(c, seq, stage(c, seq, gradient)).status_code == 200
            expected.step([gradient])
            at[start + seq] = expected.params.detach().clone()
        # Refreshed two versions past the first target (the run's start), not at the third.
        r = c.get("/target_model_weights")
        assert r.status_code == 200, r.text
        assert int(r.headers["X-Model-Version"]) == start + 2
        torch.testing.assert_close(params.net.wire.decode(r.content)[0], at[start + 2])
        torch.testing.assert_close(shard_weights(c, start + 3), at[start + 3])


@pytest.fixture
def remote_shards(tmp_path: Path):
    """Two shards started elsewhere (`uvicorn master.shards.app:app`), as a host's supervisor
    would start them, on free loopback ports."""
    procs = [
        ServiceProcess(
            "master.shards.app:app", free_port(), tmp_path / f"shard{i}.log",
            env={"A3C_SHARDS_SECRET": SECRET},
        ).start()
        for i in range(2)
    ]  # fmt: skip
    try:
        for proc in procs:
            proc.wait_healthy()
        yield procs
    finally:
        for proc in procs:
            proc.stop()


def test_a_shard_started_elsewhere_is_waited_for_and_one_that_never_comes_back_ends_the_run(
    tmp_path: Path, remote_shards: list[ServiceProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = local_settings(tmp_path, shards_urls=tuple(p.url for p in remote_shards))
    with running_master(settings) as c:
        state = c.app.state.cluster
        assert [s["url"] for s in plan(c)["shards"]] == [p.url for p in remote_shards]
        n = state.params.net.layout.n_params
        assert commit(c, 1, stage(c, 1, torch.full((n,), GRADIENT))).status_code == 200
        c.get("/global_model_weights")  # gathered at this version
        kept, at = state.params.net.params.detach().clone(), state.params.version
        assert commit(c, 2, stage(c, 2, torch.full((n,), GRADIENT))).status_code == 200
        remote_shards[1].kill()
        wait_for(lambda: plan(c)["down"] is not None, 10, "the master to see the shard down")
        # Nothing is taken while it is down: 503 (Retry-After), whatever the receipts.
        r = commit(c, 3, [{"shard": i, "epoch": "e", "sumsq": 0.0, "receipt": "r"} for i in (0, 1)])
        assert r.status_code == 503 and "resetting the shards" in r.json()["detail"], r.text
        remote_shards[1].start().wait_healthy()  # the host's supervisor starts it again

        def back() -> bool:
            p = plan(c)
            versions = {s["version"] for s in c.get("/status").json()["shards"]}
            return p["down"] is None and len(versions) == 1 and versions.pop() > at + 1

        wait_for(back, 60, "every shard back at one version")
        version = state.params.version
        torch.testing.assert_close(shard_weights(c, version), kept)
        assert commit(c, 4, stage(c, 4, torch.full((n,), GRADIENT))).status_code == 200
        # Applied by both, the one started again too (at its old URL: no stale connection to it).
        wait_for(lambda: shard_versions(c) == [version + 1] * 2, 10, "both shards apply it")

        # One that nobody starts again: after its tries (one, here, of half a second) the run
        # ends, keeping the network as last gathered under a version of its own.
        monkeypatch.setattr("master.shards.coordinator.REMOTE_WAIT_S", 0.5)
        monkeypatch.setattr("master.shard_runs.RESTARTS", 1)
        c.get("/global_model_weights")
        kept = state.params.net.params.detach().clone()
        assert commit(c, 5, stage(c, 5, torch.full((n,), GRADIENT))).status_code == 200
        decided = state.params.version
        remote_shards[0].kill()
        wait_for(lambda: c.get("/status").json()["state"] == "finished", 30, "the run's end")
        status = c.get("/status").json()
        assert "could not be started again" in status["finish_reason"], status["finish_reason"]
        assert status["shards"] is None and status["model_version"] > decided
        torch.testing.assert_close(state.params.net.params.detach(), kept)
