"""The environment factory (a3c_http/envs/make.py): the wrappers a config asks for, the families
that live in packages of their own, and what to install when one is missing."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation, RecordEpisodeStatistics
from pydantic import ValidationError

from a3c_http.config.training import TrainConfig
from a3c_http.envs import make as envs
from a3c_http.envs.make import env_for
from a3c_http.models.actor_critic import model_for


def test_an_atari_preset_gets_the_papers_frames() -> None:
    config = TrainConfig(env_id="ALE/Pong-v5")
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
    config = TrainConfig(env_id="MinAtar/Breakout-v1")
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
        TrainConfig(env_id="ALE/Pong-v5", preset=None)
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
