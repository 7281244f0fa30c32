"""The Python API on real processes, with the worked example of an environment of one's own
(examples/webcrawl, on sys.path as a user's folder would be): its script trains it through
`a3c_http.train` on a cluster it starts here, until solved, then plays the policy loaded from the
run folder to the threshold;
and on a running master (`master=`): a worker that cannot import the module is one TrainError
that says so, and the run on the workers that can is solved and played from the master's
weights."""

from __future__ import annotations

import importlib.util
import os
import statistics
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest

import a3c_http
from a3c_http.local.cluster import LocalCluster, free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
WEBCRAWL = ROOT / "examples" / "webcrawl"
ENV_ID = "webcrawl:WebCrawl-v0"
TOKEN = "python-api-token"


@pytest.fixture
def user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> float:
    """A user's process: in a folder of their own, the example's folder on sys.path (as a
    script beside it has it), no A3C_ variable set; the environment's reward_threshold."""
    for name in list(os.environ):
        if name.startswith("A3C_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(WEBCRAWL))
    import webcrawl  # noqa: F401  (registers WebCrawl-v0)

    return float(gym.spec("WebCrawl-v0").reward_threshold)


def test_the_example_trains_here_and_plays(
    user: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """examples/webcrawl/train.py as a user runs it, from a folder of their own: the run it
    gets from `a3c_http.train` on a cluster started here is solved and kept in ./runs, its
    processes ended, its history read from the folder, its policy loaded from there."""
    runs: list[a3c_http.Run] = []
    real = a3c_http.train
    monkeypatch.setattr(a3c_http, "train", lambda *a, **k: runs.append(real(*a, **k)) or runs[-1])
    spec = importlib.util.spec_from_file_location("webcrawl_train", WEBCRAWL / "train.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main(["--seed", "5", "--episodes", "50"]) == 0  # solved, played at threshold
    out = capsys.readouterr().out
    assert "solved: run " in out and "found 5 on-topic pages" in out

    (run,) = runs
    assert run.folder.parent == tmp_path / "runs" and run.folder.name.startswith("WebCrawl-v0-")
    assert (run.folder / "run.db").is_file()
    assert not any(p.running() for p in run._cluster.processes)  # ended, by their pids
    assert run.status()["finish_reason"].startswith("solved")
    history = run.history()  # from the folder: the master is gone
    # (episodes that ended while the run did are counted after it: as many or more)
    assert len(history.episodes) >= run.result["global_episode"] >= 100
    returns = history.returns
    best = max(statistics.fmean(returns[i - 100 : i]) for i in range(100, len(returns) + 1))
    assert best >= user - 1e-6  # the window that solved it
    assert a3c_http.load_policy(run.folder, env_modules=["webcrawl"]).run_id == run.id


@pytest.fixture
def remote(user: float, tmp_path: Path) -> Iterator[LocalCluster]:
    """A running master and two workers, as on other hosts: the master and the first worker
    import the example (A3C_ENV_MODULES and PYTHONPATH), the second allows it but lacks it."""
    has_it = {"A3C_ENV_MODULES": "webcrawl", "PYTHONPATH": str(WEBCRAWL)}
    cluster = LocalCluster(
        tmp_path / "master-host" / "run",
        tmp_path / "master-host" / "logs",
        [("127.0.0.1", free_port(), has_it), ("127.0.0.1", free_port(), {})],
        token=TOKEN,
        env={"A3C_ENV_MODULES": "webcrawl"},
    )
    cluster.master.env.update(has_it)
    try:
        yield cluster.start(timeout_s=120)
    finally:
        cluster.close()


def test_train_on_a_running_master(remote: LocalCluster) -> None:
    url = remote.master.url
    with pytest.raises(a3c_http.TrainError) as caught:
        a3c_http.train(ENV_ID, master=url, token=TOKEN, progress=False)
    message = str(caught.value)
    assert "a worker cannot train it" in message and remote.workers[1].url in message
    assert "cannot import 'webcrawl': No module named 'webcrawl'" in message
    assert remote.status()["state"] == "finished"  # the run it started is stopped
    remote.wait_workers_settled()

    good = remote.workers[0].url
    with a3c_http.train(
        ENV_ID, master=url, token=TOKEN, config={"workers": [good], "seed": 4}, timeout_s=90,
        progress=False,
    ) as run:
        assert run.solved and not run.local, run.result
        assert run.folder == (remote.run_dir).resolve()  # on the master's host, as /status says
        assert len(run.history().episodes) >= 100
        # the master's global weights, over HTTP (how they play: the example's test, above)
        assert run.policy().run_id == run.id
    assert remote.master.running()  # not ours to end
