"""The Python API without a cluster (a3c_http/api/): how `train`'s `env` becomes an env_id every
host can make, what a local cluster's processes are given, the errors `train` raises before
anything starts or with no master to reach, and `load_policy`'s Policy on run folders made here:
raw observations, the run's normalisation and recurrent state, actor-critics and Q-networks.

The runs themselves, on real processes: tests/cluster/test_python_api.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import a3c_http
from a3c_http.api import environments, training
from a3c_http.api.environments import EnvChoiceError, resolve
from a3c_http.api.policy import Policy
from a3c_http.envs import make as envs
from a3c_http.policy import evaluation
from a3c_http.policy.evaluation import episode_noise, eval_seed, step_noise
from tests.support.run_folders import make_run

ROOT = Path(__file__).resolve().parents[2]
WEBCRAWL = ROOT / "examples" / "webcrawl"


@pytest.fixture
def webcrawl(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The example package importable here, as a user's own (examples/webcrawl on sys.path)."""
    monkeypatch.syspath_prepend(str(WEBCRAWL))
    monkeypatch.delenv("A3C_ENV_MODULES", raising=False)
    monkeypatch.setattr(envs, "_allowed_here", set())
    import webcrawl

    return webcrawl


class EnvOfMain(gym.Env):
    pass


EnvOfMain.__module__ = "__main__"  # as a class defined in the script that runs


# -- env ------------------------------------------------------------------------------------------


def test_gymnasiums_ids_and_module_ids_go_as_they_are(webcrawl: Any) -> None:
    assert resolve("CartPole-v1").env_id == "CartPole-v1"
    assert resolve("a3c_http/CueMemory-v0").env_id == "a3c_http/CueMemory-v0"
    choice = resolve("webcrawl:WebCrawl-v0")
    assert (choice.env_id, choice.modules, choice.paths) == (
        "webcrawl:WebCrawl-v0", ("webcrawl",), (str(WEBCRAWL),),
    )  # fmt: skip


def test_an_id_registered_here_by_a_users_module_is_sent_with_that_module(webcrawl: Any) -> None:
    assert resolve("WebCrawl-v0").env_id == "webcrawl.env:WebCrawl-v0"
    # the package that holds the registration's entry point, where the caller names it
    assert resolve("WebCrawl-v0", ["webcrawl"]).env_id == "webcrawl:WebCrawl-v0"


def test_a_module_that_registers_one_environment_names_it(webcrawl: Any) -> None:
    assert resolve(webcrawl).env_id == "webcrawl:WebCrawl-v0"
    assert resolve("webcrawl").env_id == "webcrawl:WebCrawl-v0"
    with pytest.raises(EnvChoiceError, match="'json' registered no environment of its own"):
        resolve("json")


def test_an_entry_point_is_named_by_the_outermost_package_that_exports_it(webcrawl: Any) -> None:
    choice = resolve(webcrawl.WebCrawlEnv)
    assert choice.env_id == "webcrawl:WebCrawlEnv" and choice.modules == ("webcrawl",)
    envs.allow_modules(choice.modules)
    spec = envs.env_spec(choice.env_id)  # what every host does with it
    assert spec.entry_point == "webcrawl:WebCrawlEnv"
    del gym.registry["WebCrawlEnv"]


def test_an_entry_point_the_workers_cannot_import_is_refused_here() -> None:
    with pytest.raises(EnvChoiceError, match=r"script that runs \(__main__\).*module of its own"):
        resolve(EnvOfMain)

    class Local(gym.Env):
        pass

    with pytest.raises(EnvChoiceError, match="not defined at the top level"):
        resolve(Local)
    with pytest.raises(EnvChoiceError, match="is a class but not a gymnasium.Env"):
        resolve(Path)


def test_an_unknown_id_is_refused_here_and_left_to_a_remote_master() -> None:
    with pytest.raises(EnvChoiceError, match="did you mean 'CartPole-v1'"):
        resolve("CartPol-v1")
    assert resolve("CartPol-v1", strict=False).env_id == "CartPol-v1"


def test_a_local_clusters_processes_import_the_module_as_this_process_does(
    webcrawl: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("A3C_ENV_MODULES", "tests.support.envs")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["relative/envs", "/srv/envs"]))
    env = training._process_env(resolve("webcrawl:WebCrawl-v0"))
    assert env["A3C_ENV_MODULES"] == "tests.support.envs,webcrawl"
    assert env["PYTHONPATH"].split(os.pathsep) == [
        str(WEBCRAWL), str(tmp_path / "relative" / "envs"), "/srv/envs",
    ]  # fmt: skip
    # an installed module needs no folder: every process of this Python imports it
    assert environments.import_root("gymnasium") is None


# -- train's errors -------------------------------------------------------------------------------


def no_cluster(*args: object, **kwargs: object) -> None:
    raise AssertionError("nothing may start")


@pytest.mark.parametrize(
    ("env", "kwargs", "message"),
    [
        ("CartPol-v1", {}, "unknown gymnasium environment 'CartPol-v1'; did you mean"),
        ("CartPole-v1", {"config": {"learning_rate": 1e-3}}, "did you mean 'lr'?"),
        ("CartPole-v1", {"config": {"env_id": "x"}}, "env_id is train's `env`"),
        ("CartPole-v1", {"config": {"lr": -1}}, "the config is refused: lr: "),
        ("CartPole-v1", {"workers": 0}, "workers: at least 1"),
        ("CartPole-v1", {"config": {"workers": ["h:1"]}}, "workers only with master="),
        ("Pendulum-v1", {"config": {"preset": None, "max_steps": None}}, "give train() a timeout"),
        ("CartPole-v1", {"master": "10.0.0.1:33333"}, "expected a URL such as"),
        ("CartPole-v1", {"master": "http://127.0.0.1:9"}, "cannot reach the master at"),
    ],
)
def test_what_a_user_can_mend_is_one_train_error_before_anything_starts(
    env: str, kwargs: dict, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(training, "LocalCluster", no_cluster)
    with pytest.raises(a3c_http.TrainError) as caught:
        a3c_http.train(env, progress=False, **kwargs)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    error = caught.value  # no traceback of ours chained to it
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)


# -- load_policy ----------------------------------------------------------------------------------

CASES = {
    # recurrent and normalising: the state and the statistics both matter
    "lstm": {"env_id": "CartPole-v1", "core": "lstm", "lstm_size": 8, "normalize_obs": True},
    # Box actions, clipped to the Box (the scaled head puts means beyond it)
    "pendulum": {"env_id": "Pendulum-v1", "normalize_obs": True},
    # a Q-network (dqn and apex runs)
    "q": {"env_id": "CartPole-v1", "algo": "dqn", "dueling": True, "hidden_sizes": [8]},
}


def played(policy: Policy, episodes: int) -> list[float]:
    """The returns of a user's loop: raw observations in, the state carried, episode i reset
    with the evaluation's seed of episode i and, for a policy played as it samples, drawn with
    the evaluation's noise of episode i."""
    returns = []
    env = policy.make_env()
    for i in range(episodes):
        obs, _ = env.reset(seed=eval_seed(policy.config.seed, i))
        rng = episode_noise(policy.config.seed, i)
        state, total, done, steps = None, 0.0, False, 0
        while not done and steps < 300:
            noise = step_noise(rng, env.action_space) if policy.plays == "sample" else None
            action, state = policy.act(obs, state, noise=noise)
            assert policy.action_space.contains(action)
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done, steps = total + float(reward), terminated or truncated, steps + 1
        returns.append(total)
    env.close()
    return returns


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_loaded_policy_plays_raw_observations_as_the_projects_evaluation(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, _ = make_run(tmp_path, **CASES[case])
    policy = a3c_http.load_policy(tmp_path)
    assert policy.run_id == "r1" and policy.recurrent == (case == "lstm")
    monkeypatch.setattr(evaluation, "MAX_PARALLEL_ENVS", 1)  # one episode a batch, as played here
    monkeypatch.setattr(evaluation, "MAX_EPISODE_STEPS", 300)
    if config.env_id == "Pendulum-v1":  # 200 steps an episode: three are enough
        assert played(policy, 3) == list(policy.evaluate(3).returns)
    else:
        assert played(policy, 6) == list(policy.evaluate(6).returns)


def test_the_recurrent_state_goes_in_and_out(tmp_path: Path) -> None:
    make_run(tmp_path, **CASES["lstm"])
    policy = a3c_http.load_policy(tmp_path)
    h, c = policy.initial_state()
    assert h.shape == c.shape == (1, 8) and not h.any()
    env = policy.make_env()
    obs, _ = env.reset(seed=0)
    _, state = policy.act(obs)
    assert state[0].abs().sum() > 0
    # a batch acts as its rows one by one, each with its own state
    batch = np.stack([obs, obs * 0.5])
    actions, states = policy.act(batch, policy.initial_state(2), deterministic=True)
    assert actions.shape == (2,)
    for row in range(2):
        action, own = policy.act(batch[row], deterministic=True)
        assert action == actions[row]
        assert torch.allclose(own[0][0], states[0][row], atol=1e-6)
    # memory: the same observation after another history acts from another state
    _, later = policy.act(obs, state)
    assert not torch.allclose(later[0], state[0])
    sampled, _ = policy.act(obs, deterministic=False)
    assert sampled in (0, 1)
    env.close()


def test_a_feed_forward_policy_has_no_state(tmp_path: Path) -> None:
    make_run(tmp_path, **CASES["q"])
    policy = a3c_http.load_policy(tmp_path)
    assert policy.initial_state() == ()
    action, state = policy.act(np.zeros(4, dtype=np.float32))
    assert isinstance(action, int) and state == ()
    with pytest.raises(ValueError, match=r"expected \(4,\)"):
        policy.act(np.zeros(3))


def test_a_folder_that_holds_no_policy_is_one_train_error(tmp_path: Path) -> None:
    with pytest.raises(a3c_http.TrainError, match="not a run folder"):
        a3c_http.load_policy(tmp_path)


def test_the_policy_of_a_custom_environment_needs_its_module_allowed(
    webcrawl: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("A3C_ENV_MODULES", "webcrawl")  # the run was made where it was allowed
    make_run(tmp_path, env_id="webcrawl:WebCrawl-v0")
    monkeypatch.delenv("A3C_ENV_MODULES")
    with pytest.raises(a3c_http.TrainError) as caught:
        a3c_http.load_policy(tmp_path)
    assert "'webcrawl' is not in A3C_ENV_MODULES" in str(caught.value)
    policy = a3c_http.load_policy(tmp_path, env_modules=["webcrawl"])
    assert policy.observation_space.shape == (9,)
    assert len(policy.play(2, seed=0)) == 2
    assert sys.modules["webcrawl"] is webcrawl
