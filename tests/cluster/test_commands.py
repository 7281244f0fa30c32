"""The commands `pip install .` gives (a3c_http/cli/): each declared and resolvable, the services'
flags handed to uvicorn, `a3c-train --master` against a stand-in master and against the master
in-process, `a3c-plot` without matplotlib; and, as real processes, the services' commands and
the main job through its script."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
import setuptools
from fastapi.testclient import TestClient

from a3c_http.cli import plot, remote, servers, train
from a3c_http.config.workerlist import WorkerListError
from a3c_http.local.cluster import free_port, wait_for
from tests.support.master_api import _clean_env as _clean_env
from tests.support.master_api import client as client
from tests.support.master_api import launched as launched
from tests.support.master_api import start_run

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SCRIPTS = PYPROJECT["project"]["scripts"]
COMMANDS = [
    "a3c-master", "a3c-worker", "a3c-train", "a3c-evaluate", "a3c-plot", "a3c-export", "a3c-certs",
    "a3c-hosts",
]  # fmt: skip


def test_the_package_declares_the_eight_commands_in_packages_it_ships() -> None:
    assert sorted(SCRIPTS) == sorted(COMMANDS)
    find = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
    packages = setuptools.find_packages(str(ROOT), include=find["include"])
    for name, target in SCRIPTS.items():
        module = target.partition(":")[0]
        assert module.rpartition(".")[0] in packages, f"{name}: {module} is not in the wheel"


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_resolves_to_a_callable(name: str) -> None:
    module, _, attr = SCRIPTS[name].partition(":")
    assert callable(getattr(importlib.import_module(module), attr))


def test_the_services_commands_hand_their_flags_to_uvicorn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(servers.uvicorn, "run", lambda app, **kw: calls.append((app, kw)))
    assert servers.master([]) == 0
    assert servers.worker(["--host", "0.0.0.0", "--port", "8002", "--log-level", "warning",
                           "--http", "h11", "--forwarded-allow-ips", "10.0.0.1",
                           "--timeout-graceful-shutdown", "20"]) == 0  # fmt: skip
    assert calls == [
        ("master.app:app", {"host": "127.0.0.1", "port": 33333, "log_level": None,
                            "http": "auto", "forwarded_allow_ips": None,
                            "timeout_graceful_shutdown": None}),
        ("worker.app:app", {"host": "0.0.0.0", "port": 8002, "log_level": "warning",
                            "http": "h11", "forwarded_allow_ips": "10.0.0.1",
                            "timeout_graceful_shutdown": 20}),
    ]  # fmt: skip
    assert servers.parser("a3c-worker", "a worker", 8001).parse_args([]).port == 8001


# -- a3c-train --master ---------------------------------------------------------------------


def a_status(state: str, run_id: str | None, **extra: Any) -> dict[str, Any]:
    return {
        "state": state, "run_id": run_id, "elapsed_s": 1.0, "global_episode": 3,
        "global_steps": 300, "mean_return_100": 20.0, "best_score": 30.0, "updates_applied": 9,
        "workers": [{"state": "running"}], "solved": False, "finish_reason": None,
        "resume_error": None, **extra,
    }  # fmt: skip


class StandInMaster:
    """A master at http://m:33333 (an httpx transport): it takes POST /train with `answer`, and
    its run is `running` for `polls` status reads, then `finished` as `end` says. `interrupt_at`:
    the status read at which a Ctrl-C arrives."""

    def __init__(
        self,
        answer: tuple[int, dict] = (202, {"data": {"run_id": "r1", "workers": []}}),
        polls: int = 2,
        end: dict[str, Any] | None = None,
        interrupt_at: int | None = None,
    ) -> None:
        self.answer, self.polls, self.interrupt_at = answer, polls, interrupt_at
        self.end = end or {"solved": True, "finish_reason": "solved"}
        self.requests: list[httpx.Request] = []
        self.reads = 0
        self.started = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        assert request.url.host == "m" and request.url.port == 33333
        if request.url.path == "/train":
            self.started = self.answer[0] == 202
            return httpx.Response(self.answer[0], json=self.answer[1])
        if request.url.path == "/stop":
            self.polls = 0
            self.end = {"solved": False, "finish_reason": "stopped by POST /stop"}
            return httpx.Response(200, json={"stopped": True})
        assert request.url.path == "/status"
        if not self.started:
            return httpx.Response(200, json=a_status("idle", None))
        self.reads += 1
        if self.reads == self.interrupt_at:
            raise remote.Stopped("SIGINT")
        if self.reads <= self.polls:
            return httpx.Response(200, json=a_status("running", "r1"))
        return httpx.Response(200, json=a_status("finished", "r1", **self.end))

    def paths(self) -> list[str]:
        return [f"{r.method} {r.url.path}" for r in self.requests]


def on_stand_in(master: StandInMaster, body: dict[str, Any] | None = None, **kw: Any) -> int:
    options = {"time_cap": None, "every": 0.0, **kw}
    return remote.on_master(
        "http://m:33333", body or {}, transport=httpx.MockTransport(master), **options
    )


def test_master_mode_posts_the_config_with_the_token_and_follows_the_run_to_its_end(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setenv("A3C_TOKEN", "t0k3n")
    config = tmp_path / "run.toml"
    config.write_text('env_id = "Acrobot-v1"\nlr = 0.001\n[env_kwargs]\nmax_episode_steps = 200\n')
    body = train.run_config([str(config)], env=None)
    master = StandInMaster()
    assert on_stand_in(master, body) == 0
    assert master.paths()[:2] == ["GET /status", "POST /train"]
    assert json.loads(master.requests[1].content) == {
        "env_id": "Acrobot-v1",
        "lr": 0.001,
        "env_kwargs": {"max_episode_steps": 200},
    }
    assert all(r.headers["authorization"] == "Bearer t0k3n" for r in master.requests)
    assert "POST /stop" not in master.paths()
    out = capsys.readouterr().out
    assert "run r1 started on http://m:33333" in out and "run finished: solved" in out
    assert out.rstrip().endswith("SOLVED")

    unsolved = StandInMaster(end={"solved": False, "finish_reason": "max_steps reached"})
    assert on_stand_in(unsolved) == 1


def test_master_mode_stops_its_run_at_the_time_cap_and_when_interrupted() -> None:
    capped = StandInMaster(polls=10**6)
    assert on_stand_in(capped, time_cap=0.0) == 1
    assert capped.paths().count("POST /stop") == 1
    interrupted = StandInMaster(polls=10**6, interrupt_at=2)
    assert on_stand_in(interrupted) == 1
    assert interrupted.paths()[-1] == "POST /stop"


def test_master_mode_leaves_a_running_run_alone_and_exits_2_when_nothing_started(
    capsys: pytest.CaptureFixture,
) -> None:
    busy = StandInMaster(answer=(409, {"detail": "a run is running: POST /stop it first"}))
    assert on_stand_in(busy) == 2
    assert "POST /stop" not in busy.paths()
    assert "error: a run is running: POST /stop it first" in capsys.readouterr().err
    refused = StandInMaster(answer=(422, {"detail": "lr: Input should be greater than 0"}))
    assert on_stand_in(refused) == 2
    assert capsys.readouterr().err == (
        "error: the master refused the config: lr: Input should be greater than 0\n"
    )

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("Connection refused", request=request)

    assert remote.on_master("http://m:33333", {}, None, 0.0, httpx.MockTransport(down)) == 2
    assert capsys.readouterr().err.startswith("error: http://m:33333: Connection refused")
    assert train.main(["--master", "m:33333"]) == 2
    assert "expected a URL such as http://10.0.0.10:33333" in capsys.readouterr().err


def test_a_runs_saved_config_json_starts_the_same_run_on_a_master(
    client: TestClient, launched: list, tmp_path: Path
) -> None:
    """The master in-process: its first run's config.json, handed to `a3c-train --config`, is
    accepted by POST /train as it is and gives a run of the same config (its seed too)."""
    (tmp_path / "workers.txt").write_text("127.0.0.1:9001\n")
    first = start_run(client, env_id="Acrobot-v1", lr=0.001, num_envs=4)["run_id"]
    assert client.post("/stop", json={}).status_code == 200
    saved = tmp_path / "run" / "config.json"
    assert json.loads(saved.read_text())["run_id"] == first

    body = train.run_config([str(saved)], env=None)
    assert remote.follow_on_master(client, "http://testserver", body, 0.0, 0.0) == 1  # capped
    second = json.loads(saved.read_text())
    assert second["run_id"] != first
    assert launched[1]["config"] == launched[0]["config"]
    assert launched[1]["config"].lr == 0.001 and launched[1]["config"].normalize_obs


# -- a3c-train on this host, a3c-plot -------------------------------------------------------


def test_without_a_workers_file_the_main_job_starts_two_local_workers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("A3C_WORKERS_FILE", raising=False)
    assert train._workers(None) == (train.DEFAULT_WORKERS, None)
    (tmp_path / "workers.txt").write_text("127.0.0.1:8005\n")
    assert train._workers(None) == (["http://127.0.0.1:8005"], Path("workers.txt"))
    monkeypatch.setenv("A3C_WORKERS_FILE", str(tmp_path / "other.txt"))
    with pytest.raises(WorkerListError, match="cannot read the workers file .*other.txt"):
        train._workers(None)


def test_plot_without_matplotlib_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails, as without
    assert plot.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: {plot.INSTALL}\n"
    assert "pip install 'a3c-http[plot]'" in plot.INSTALL


# -- real processes -------------------------------------------------------------------------


def get(url: str) -> httpx.Response:
    return httpx.get(url, timeout=5, trust_env=False)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("A3C_")}
    return {**env, **extra}


@pytest.mark.integration  # the commands' processes: they serve, and end on SIGTERM
def test_the_services_commands_serve_and_end_on_sigterm(tmp_path: Path) -> None:
    procs = {}
    for name in ("master", "worker"):
        port = free_port()
        code = f"import sys; from a3c_http.cli.servers import {name}; sys.exit({name}())"
        procs[name] = (port, subprocess.Popen(
            [sys.executable, "-c", code, "--port", str(port), "--log-level", "warning"],
            cwd=ROOT, env=clean_env(A3C_RUN_DIR=str(tmp_path / "run")),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        ))  # fmt: skip
    try:
        for port, _ in procs.values():
            url = f"http://127.0.0.1:{port}/healthz"
            wait_for(lambda url=url: get(url).status_code == 200, 60, url)
        status = get(f"http://127.0.0.1:{procs['master'][0]}/status").json()
        assert status["state"] == "idle"
        assert (tmp_path / "run" / ".a3c.lock").exists()  # the master's own A3C_RUN_DIR
    finally:
        for _, proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=30) for _, proc in procs.values()]
    assert all(code in (0, -signal.SIGTERM) for code in codes), codes


@pytest.mark.integration  # the main job through its script: processes it starts and ends
def test_the_quickstart_script_trains_to_its_target_and_plots(tmp_path: Path) -> None:
    workers = tmp_path / "workers.txt"
    workers.write_text(f"127.0.0.1:{free_port()}\n")
    toml = tmp_path / "run.toml"
    toml.write_text("target_return = 30.0\nseed = 1\nnum_envs = 4\n")
    done = subprocess.run(
        [sys.executable, "scripts/run_local.py", "--port", str(free_port()),
         "--workers-file", str(workers), "--run-dir", str(tmp_path / "runs" / "latest"),
         "--config", str(toml), "--every", "0.5"],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rstrip().endswith("SOLVED")
    assert "run finished: solved" in done.stdout
    assert (tmp_path / "runs" / "latest" / "rewards.png").stat().st_size > 10_000
    saved = json.loads((tmp_path / "runs" / "latest" / "config.json").read_text())
    assert saved["target_return"] == 30.0 and saved["seed"] == 1 and saved["num_envs"] == 4
