"""`a3c-evaluate RUN_DIR [--episodes N] [--video DIR]`: play a run's global weights.

Loads the run folder's weights (with the running statistics of a normalising model, which travel in
them) and its config, plays N episodes as the run's algorithm plays its policy, the policy the run
was judged on (a3c_http/policy/evaluation.py: an actor-critic as it samples, from seeded noise; a
Q-network greedily), prints a table, and as its last line one JSON object: mean_return,
std_return, mean_length, episodes, env_id, played ("sample" or "greedy"), model_version, run_id,
returns.
`--video DIR` records every episode with gymnasium's RecordVideo (needs moviepy, and pygame to
draw the classic-control tasks: the `video` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from pathlib import Path

import gymnasium as gym
import torch
from gymnasium.error import DependencyNotInstalled

from a3c_http.algos.registry import algorithm_class
from a3c_http.config.files import RunFolderError, read_run
from a3c_http.envs.make import MissingDependency, env_for
from a3c_http.policy.evaluation import evaluate


def video_env(config, folder: Path):  # noqa: ANN001, ANN201
    """A factory of environments that record each episode into `folder`."""
    from gymnasium.wrappers import RecordVideo

    def make(i: int) -> gym.Env:
        env = env_for(config, render_mode="rgb_array")
        with warnings.catch_warnings():
            if i > 0:  # the first environment made the folder: no files are overwritten
                warnings.filterwarnings("ignore", ".*Overwriting existing videos")
            return RecordVideo(
                env, str(folder), episode_trigger=lambda _: True,
                name_prefix=f"eval-env{i}", disable_logger=True,
            )

    return make


def play(argv: list[str] | None = None) -> dict:
    """What `a3c-evaluate` does with `argv`: its summary (the last line it prints)."""
    parser = argparse.ArgumentParser(
        prog="a3c-evaluate", description="Play a run folder's global weights."
    )
    parser.add_argument("run_dir", type=Path, help="a run folder, e.g. runs/latest")
    parser.add_argument("--episodes", type=int, default=10, help="episodes to play (10)")
    parser.add_argument("--video", type=Path, default=None, help="record them into this folder")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error("--episodes must be at least 1")
    try:
        config, snap = read_run(args.run_dir)
    except RunFolderError as exc:
        raise SystemExit(f"a3c-evaluate: {exc}") from None
    config = config.resolved()
    torch.set_num_threads(1)
    make_env = None
    if args.video is not None:
        # Frames are drawn off-screen (rgb_array) and nothing is played: without these, SDL looks
        # for a display and a sound server when pygame starts, and on a host with neither (a
        # server, a container) prints "XDG_RUNTIME_DIR is invalid or not set" to stderr.
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        make_env = video_env(config, args.video)
    try:
        with warnings.catch_warnings():  # a recorder closed by a failure has nothing to save
            warnings.filterwarnings("ignore", ".*zero frames to save")
            result = evaluate(config, snap.weights, args.episodes, make_env)
    except MissingDependency as exc:  # the environment's own packages: what to install
        raise SystemExit(str(exc)) from None
    except DependencyNotInstalled as exc:  # else only rendering needs extra packages
        raise SystemExit(
            f"--video needs a package that is not installed ({exc}). The `video` extra has what "
            "the environments gymnasium ships need (moviepy, pygame): pip install "
            "'a3c-http[video]' (in a checkout: ./scripts/setup_venv.sh video)"
        ) from None
    print(f"{'episode':>8}  {'return':>10}")
    for i, ret in enumerate(result.returns):
        print(f"{i:>8}  {ret:>10.2f}")
    plays = algorithm_class(config).plays
    played = "as the policy samples (seeded noise)" if plays == "sample" else "greedily"
    print(f"mean {result.mean_return:.2f} +- {result.std_return:.2f} over {result.episodes} "
          f"episodes of {config.env_id} played {played}, as its run was judged "
          f"(mean length {result.mean_length:.1f})")
    if args.video is not None:
        print(f"videos: {args.video}")
    summary = {
        "mean_return": result.mean_return,
        "std_return": result.std_return,
        "mean_length": result.mean_length,
        "episodes": result.episodes,
        "env_id": config.env_id,
        "played": plays,
        "model_version": snap.state.get("model_version"),
        "run_id": snap.state.get("run_id"),
        "returns": list(result.returns),
    }
    print(json.dumps(summary))
    return summary


def main(argv: list[str] | None = None) -> int:
    play(argv)
    return 0
