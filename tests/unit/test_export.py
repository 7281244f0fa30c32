"""a3c-export (a3c_http/policy/export.py): a run folder's policy as a TorchScript or ONNX file that
plays its task, from raw observations, to exactly the returns of the project's evaluation; and the
command's refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import tests.support.envs  # noqa: F401  (registers Knobs-v0)
from a3c_http.algos.registry import model_for, train_config
from a3c_http.config.files import saved_config
from a3c_http.config.training import TrainConfig
from a3c_http.envs.make import env_for
from a3c_http.policy.evaluation import (
    MAX_EPISODE_STEPS,
    episode_noise,
    eval_seed,
    evaluate,
    step_noise,
)
from a3c_http.policy.export import METADATA, main, sidecar
from a3c_http.store.runstore import RunStore, Snapshot
from a3c_http.wire import tensors as wire
from tests.support.run_folders import make_run

EPISODES = 6  # played side by side in one batch, as evaluation plays up to 16
CASES = {
    # discrete, MLP, normalised observations; weights set to a controller that balances the pole
    "cartpole": {"env_id": "CartPole-v1", "normalize_obs": True, "hidden_sizes": [4]},
    # continuous, normalised observations; the scaled policy head puts means beyond the Box
    "pendulum": {"env_id": "Pendulum-v1", "normalize_obs": True},
    # bool images [10, 10, 4] through a CNN, and a recurrent core
    "minatar_lstm": {
        "env_id": "MinAtar/Breakout-v1", "encoder": "small_cnn", "core": "lstm", "lstm_size": 32,
    },
    # a Q-network (algo dqn and apex), dueling: its greedy action
    "cartpole_q": {"env_id": "CartPole-v1", "algo": "dqn", "dueling": True, "hidden_sizes": [8]},
    # SAC's squashed mean and Ape-X DPG's actor: continuous actions played deterministically
    "pendulum_sac": {"env_id": "Pendulum-v1", "algo": "sac", "hidden_sizes": [8]},
    "pendulum_dpg": {"env_id": "Pendulum-v1", "algo": "apex_dpg", "hidden_sizes": [8]},
    # a Box whose dimensions have ranges of their own (tests/support/envs.py)
    "knobs_sac": {"env_id": "Knobs-v0", "algo": "sac", "hidden_sizes": [8]},
}
# A step of an exported policy: a batch of raw observations and the state -> actions and state.
Step = Callable[..., tuple[np.ndarray, ...]]
# torch 2.10+ deprecates TorchScript in favour of torch.export; its files still load.
# An export says nothing but where it wrote: no warning of the trace's (its constants included).
pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated"),
    pytest.mark.filterwarnings("error::torch.jit.TracerWarning"),
]


def project_returns(folder: Path, episodes: int) -> tuple[float, ...]:
    """What the project's evaluation (scripts/evaluate.py's path) gets for the run folder."""
    snap = RunStore(folder).load()
    return evaluate(saved_config(snap.config), snap.weights, episodes).returns


def play(step: Step, meta: dict[str, Any], config: TrainConfig, episodes: int) -> list[float]:
    """Episode i on its own environment, reset with the evaluation's seed of episode i, all
    stepped in one batch (a finished one on its last observation) as evaluation steps them, with
    the state zeros at the start and, for a sampled policy, the noise of the evaluation's episode
    i, as the description says."""
    envs = [env_for(config) for _ in range(episodes)]
    noise = [episode_noise(config.seed, i) for i in range(episodes)] if meta["noise"] else None
    obs = np.stack([env.reset(seed=eval_seed(config.seed, i))[0] for i, env in enumerate(envs)])
    assert obs.dtype.name == meta["observation"]["dtype"]
    assert list(obs.shape[1:]) == meta["observation"]["shape"]
    state = []
    if meta["recurrent"]:
        state = [np.zeros((episodes, meta["recurrent"]["state_size"]), np.float32)] * 2
    returns, lengths, playing = [0.0] * episodes, [0] * episodes, set(range(episodes))
    while playing:
        draws = [] if noise is None else [np.stack([step_noise(n, envs[0].action_space)
                                                     for n in noise])]  # fmt: skip
        action, *state = step(obs, *draws, *state)
        for i in sorted(playing):
            fit = int(action[i]) if meta["action"]["type"] == "discrete" else action[i]
            obs[i], reward, terminated, truncated, _ = envs[i].step(fit)
            returns[i] += float(reward)
            lengths[i] += 1
            if terminated or truncated or lengths[i] >= MAX_EPISODE_STEPS:
                playing.discard(i)
    for env in envs:
        env.close()
    return returns


def torchscript_step(path: Path) -> Step:
    policy = torch.jit.load(str(path))

    def step(obs: np.ndarray, *state: np.ndarray) -> tuple[np.ndarray, ...]:
        out = policy(torch.as_tensor(obs), *(torch.as_tensor(s) for s in state))
        return tuple(t.numpy() for t in out) if isinstance(out, tuple) else (out.numpy(),)

    return step


def onnx_step(path: Path, meta: dict[str, Any]) -> Step:
    import onnxruntime as ort
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert json.loads(session.get_modelmeta().custom_metadata_map[METADATA]) == meta

    def step(obs: np.ndarray, *state: np.ndarray) -> tuple[np.ndarray, ...]:
        return tuple(session.run(None, dict(zip(meta["inputs"], (obs, *state), strict=True))))

    return step


def export(run: Path, out: Path, fmt: str) -> dict[str, Any]:
    assert main([str(run), str(out), "--format", fmt]) == 0
    return json.loads(sidecar(out).read_text())


@pytest.mark.parametrize("case", CASES)
def test_the_exported_policy_plays_to_the_returns_of_the_projects_evaluation(
    tmp_path: Path, case: str
) -> None:
    config, _ = make_run(tmp_path / "run", **CASES[case])
    expected = project_returns(tmp_path / "run", EPISODES)
    meta = export(tmp_path / "run", tmp_path / "policy.pt", "torchscript")
    assert meta["env_id"] == config.env_id and meta["model_version"] == 42
    assert meta["seed"] == config.seed
    assert play(torchscript_step(tmp_path / "policy.pt"), meta, config, EPISODES) == list(
        expected
    )
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (the export extra)")
    meta = export(tmp_path / "run", tmp_path / "policy.onnx", "onnx")
    returns = play(onnx_step(tmp_path / "policy.onnx", meta), meta, config, EPISODES)
    if meta["action"]["type"] == "discrete":
        assert returns == list(expected)
    else:  # onnxruntime's kernels round differently from torch's: the last bits of the actions
        assert returns == pytest.approx(expected, rel=1e-5)
    assert len(set(expected)) > 1  # episodes that differ: the actions depend on the observation


@pytest.mark.parametrize("case", ["cartpole", "pendulum"])
def test_the_observation_statistics_are_folded_in(tmp_path: Path, case: str) -> None:
    """On observations from far around the task's: the same greedy actions as the network with
    its statistics; and they matter (the network without them acts otherwise)."""
    config, model = make_run(tmp_path / "run", **CASES[case])
    meta = export(tmp_path / "run", tmp_path / "policy.pt", "torchscript")
    policy = torch.jit.load(str(tmp_path / "policy.pt"))
    obs = torch.randn(512, *meta["observation"]["shape"]) * 3
    noise = torch.rand(512) if case == "cartpole" else torch.randn(512, 1)
    with torch.no_grad():
        mine = policy(obs, noise)
        theirs = model.drawn(model.act(obs)[0], noise)
        del model.obs_rms
        unnormalised = model.drawn(model.act(obs)[0], noise)
    if meta["action"]["type"] == "discrete":
        assert torch.equal(mine, theirs) and len(set(mine.tolist())) == 2
    else:
        low, high = meta["action"]["low"][0], meta["action"]["high"][0]
        assert torch.equal(mine, theirs.clamp(low, high))
        assert mine.min() == low and mine.max() == high  # clipped on both sides
    assert not torch.equal(theirs, unnormalised)


@pytest.mark.parametrize("lstm_first", [False, True])
def test_the_recurrent_state_goes_in_and_out(
    tmp_path: Path, lstm_first: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """(obs, noise, h, c) -> (action, h, c), the state of the network's own steps; zeros start
    it. With `lstm_first` the value's own LSTM is not part of acting: the file carries the
    policy's (h, c) only."""
    _, model = make_run(tmp_path / "run", **CASES["minatar_lstm"], lstm_first=lstm_first)
    meta = export(tmp_path / "run", tmp_path / "policy.pt", "torchscript")
    assert meta["inputs"] == ["obs", "noise", "h", "c"]
    assert meta["outputs"] == ["action", "h_out", "c_out"]
    assert "(obs, noise, h, c) -> (action, h_out, c_out)" in capsys.readouterr().out
    assert meta["observation"] == {"shape": [4, 10, 10, 4], "dtype": "bool", "input_dtype": "bool"}
    policy = torch.jit.load(str(tmp_path / "policy.pt"))
    obs = torch.rand(5, 3, 4, 10, 10, 4) < 0.2  # 5 steps of 3 environments, 4 frames each
    h = c = torch.zeros(3, 32)
    state = model.initial_state(3)
    with torch.no_grad():
        for t in range(5):
            noise = torch.rand(3)
            action, h, c = policy(obs[t], noise, h, c)
            dist, _, state = model.act(obs[t], state)
            assert torch.equal(action, model.drawn(dist, noise))
            assert torch.equal(h, state[0]) and torch.equal(c, state[1])
    assert h.abs().sum() > 0


README_EXAMPLE = """
import gymnasium as gym, torch
policy, env = torch.jit.load("policy.pt"), gym.make("CartPole-v1")
torch.manual_seed(0)
obs, _ = env.reset(seed=0)
done = total = 0
while not done:
    action = policy(torch.as_tensor(obs)[None], torch.rand(1))[0]  # noise: an actor-critic's
    obs, reward, terminated, truncated, _ = env.step(int(action))
    total, done = total + reward, terminated or truncated
print(total)
"""


@pytest.mark.integration  # a child process: plain PyTorch, where a3c_http cannot be imported
def test_the_docs_example_plays_it_in_plain_pytorch(tmp_path: Path) -> None:
    """In a process where this project cannot be imported: the file is all it needs (the example
    of docs/guide/export.md)."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "export.md").read_text()
    assert README_EXAMPLE.strip() in page
    _, model = make_run(tmp_path / "run", **CASES["cartpole"])
    export(tmp_path / "run", tmp_path / "policy.pt", "torchscript")
    blocked = "import sys; sys.modules['a3c_http'] = None\n"
    played = subprocess.run(
        [sys.executable, "-c", blocked + README_EXAMPLE], cwd=tmp_path,
        capture_output=True, text=True, timeout=60,
    )
    assert played.returncode == 0, played.stderr

    env = gym.make("CartPole-v1")  # the same episode with the project's network
    torch.manual_seed(0)
    obs, _ = env.reset(seed=0)
    done, total = False, 0.0
    while not done:
        with torch.no_grad():
            action = model.drawn(model.act(torch.as_tensor(obs)[None])[0], torch.rand(1))[0]
        obs, reward, terminated, truncated, _ = env.step(int(action))
        total, done = total + float(reward), terminated or truncated
    assert float(played.stdout.split()[-1]) == total


def error_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("a3c-export: error: "), err
    return err


def test_a_bad_run_folder_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "policy.pt"
    assert main([str(tmp_path / "nowhere"), str(out)]) == 2
    assert "no such folder" in error_line(capsys)
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), str(out)]) == 2
    assert "not a run folder" in error_line(capsys)
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "run.db").write_bytes(b"not a database, " * 100)
    assert main([str(tmp_path / "garbage"), str(out)]) == 2
    assert "cannot be read" in error_line(capsys)
    for name, config, weights in (
        ("unweighted", train_config(seed=1).model_dump(), None),
        ("misconfigured", {**train_config(seed=1).model_dump(), "env_id": "CartPol-v1"}, b"x"),
        ("mismatched", train_config(seed=1, hidden_sizes=[8]).model_dump(),
         wire.encode(model_for(train_config(seed=1)).state_dict())),
    ):
        store = RunStore.acquire(tmp_path / name)
        store.save(Snapshot(config=config, state={"run_id": "r1"}, weights=weights))
        store.close()
    assert main([str(tmp_path / "unweighted"), str(out)]) == 2
    assert "no weights yet" in error_line(capsys)
    assert main([str(tmp_path / "misconfigured"), str(out)]) == 2
    assert "env_id" in error_line(capsys)
    assert main([str(tmp_path / "mismatched"), str(out)]) == 2
    assert "weights do not load" in error_line(capsys)
    assert not out.exists() and not sidecar(out).exists()


def test_onnx_without_its_package_names_the_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_run(tmp_path / "run", **CASES["cartpole"])
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` now fails, as without it
    assert main([str(tmp_path / "run"), str(tmp_path / "p.onnx"), "--format", "onnx"]) == 1
    assert "a3c-http[export]" in error_line(capsys)
    assert not (tmp_path / "p.onnx").exists()
