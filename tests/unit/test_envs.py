"""The environment factory (a3c_http/envs/make.py): the wrappers a config asks for, the families
that live in packages of their own, and what to install when one is missing."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation, RecordEpisodeStatistics
from pydantic import ValidationError

from a3c_http.algos.registry import model_for, train_config
from a3c_http.envs import make as envs
from a3c_http.envs.make import env_for


def test_an_atari_preset_gets_the_papers_frames() -> None:
    config = train_config(env_id="ALE/Pong-v5")
    assert (config.preprocess, config.frame_stack, config.encoder) == ("atari", 4, "nature_cnn")
    env = env_for(config)
    try:
        assert isinstance(env, RecordEpisodeStatistics)  # outermost: true returns, every life
        assert isinstance(env.env, envs.StackFrames)
        assert isinstance(env.env.env, AtariPreprocessing)
        assert env.unwrapped._frameskip == 1  # the wrapper skips (and max-pools) the frames
        obs, info = env.reset(seed=0)
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8 and "lives" in info
    finally:
        env.close()


def test_a_minatar_preset_builds_its_small_cnn_over_the_grids_as_they_come() -> None:
    config = train_config(env_id="MinAtar/Breakout-v1")
    assert config.encoder == "small_cnn" and config.preset == "MinAtar/Breakout-v1"
    env = env_for(config)
    try:
        obs, _ = env.reset(seed=0)
        assert obs.shape == (4, 10, 10, 4) and obs.dtype == np.bool_  # 4 grids of 4 channels
    finally:
        env.close()
    encoder = model_for(config).encoder
    assert encoder.channels_last and encoder.stack == 4


def test_a_family_whose_package_is_missing_says_which_extra_installs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "ale_py", None)  # as where ale-py is not installed
    monkeypatch.setattr(envs, "_registered", set())
    with pytest.raises(ValidationError) as caught:
        train_config(env_id="ALE/Pong-v5", preset=None)
    message = str(caught.value)
    assert "ALE/Pong-v5 needs the packages of the atari extra" in message
    assert "./scripts/setup_venv.sh atari" in message


def test_stack_frames_gives_what_gymnasiums_frame_stack_gives() -> None:
    ours, theirs = (wrap(gym.make("CartPole-v1"), 3) for wrap in (envs.StackFrames,
                                                                   FrameStackObservation))
    assert ours.observation_space == theirs.observation_space
    for episode in range(2):  # the second begins after a reset: no frame of the first is left
        a, _ = ours.reset(seed=episode)
        b, _ = theirs.reset(seed=episode)
        for step in range(12):
            assert np.array_equal(a, b), (episode, step)
            a = ours.step(step % 2)[0]
            b = theirs.step(step % 2)[0]
    ours.close()
    theirs.close()


# -- environments of a user's module: `module:Name` ---------------------------------------------

USER_MODULE = '''
import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Walk right: +1 at the end, 3 steps."""

    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length=3):
        self.length = length

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += int(action)
        done = self.t >= self.length
        return np.full(1, self.t / self.length, np.float32), float(done), done, False, {}


def make_corridor(length=5):
    return Corridor(length)


NOT_AN_ENV = 3
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """A module of the user's, `user_envs`, importable and allowed; the ids it gets registered are
    removed afterwards."""
    (tmp_path / "user_envs.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("A3C_ENV_MODULES", "user_envs")
    before = set(gym.registry)
    yield "user_envs"
    for name in set(gym.registry) - before:
        del gym.registry[name]
    sys.modules.pop("user_envs", None)


def test_a_class_of_a_module_that_registers_nothing_is_its_entry_point(user_module: str) -> None:
    config = train_config(env_id="user_envs:Corridor", max_steps=None)
    env = env_for(config)
    try:
        assert type(env.unwrapped).__name__ == "Corridor" and env.unwrapped.length == 3
        assert env.spec.max_episode_steps is None  # nothing but the class itself
    finally:
        env.close()
    assert envs.env_spec("user_envs:make_corridor").entry_point == "user_envs:make_corridor"
    env = envs.make_env("user_envs:make_corridor", {"length": 7})
    assert env.unwrapped.length == 7
    env.close()


def test_a_misspelt_module_is_named_as_missing_not_as_not_allowed(user_module: str) -> None:
    missing = "no module named 'user_envz' on this host; did you mean 'user_envs'"
    with pytest.raises(ValueError, match=missing):
        envs.env_spec("user_envz:Corridor")
    with pytest.raises(ValueError, match="'json' is not in A3C_ENV_MODULES"):  # there, not allowed
        envs.env_spec("json:Corridor")


def test_a_process_that_never_validated_the_config_registers_the_entry_point_when_it_makes_it(
    user_module: str,
) -> None:
    """The master's evaluation process (spawned) makes the environment of a config it was given:
    make_env registers the entry point there too."""
    assert "Corridor" not in gym.registry
    env = envs.make_env("user_envs:Corridor", {})
    assert type(env.unwrapped).__name__ == "Corridor"
    env.close()


def test_an_entry_point_must_be_an_env_class_or_a_function(user_module: str) -> None:
    with pytest.raises(ValidationError) as caught:
        train_config(env_id="user_envs:NOT_AN_ENV")
    message = str(caught.value)
    assert "importing 'user_envs' did not register it" in message
    assert "defines no gymnasium.Env class or function of that name" in message
    assert "NOT_AN_ENV" not in gym.registry


def test_an_entry_point_of_a_module_not_allowed_is_not_imported(
    user_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("A3C_ENV_MODULES", "")
    with pytest.raises(ValidationError, match="'user_envs' is not in A3C_ENV_MODULES"):
        train_config(env_id="user_envs:Corridor")
    assert "user_envs" not in sys.modules
    monkeypatch.setattr(envs, "_allowed_here", set())
    envs.allow_modules(["user_envs"])  # what a process allows itself (a3c_http.api)
    assert train_config(env_id="user_envs:Corridor", max_steps=None).env_id == "user_envs:Corridor"
