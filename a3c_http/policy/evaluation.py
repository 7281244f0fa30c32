"""Evaluation: play a set of weights as the run's algorithm plays its policy, and report the mean
return.

The master evaluates its global weights while the run trains (master/background/evaluator.py runs
`serve` in a child process of its own); a3c-evaluate, load_policy's `evaluate` and scripts call
`evaluate` on a saved `weights.safetensors`. The policy acts as its algorithm `plays` it
(a3c_http/algos/base.py): an actor-critic's as it samples (`ActorCritic.drawn`, the Gaussian's
draw clipped to the Box), a Q-network's greedily. Episode `i` of an evaluation is always reset
with the same seed, derived from the run's seed, and its draws come from noise seeded alike
(`episode_noise`), so two evaluations differ only by their weights, and an exported policy given
the same noise plays the same episodes (a3c_http/policy/export.py).
"""

from __future__ import annotations

import signal
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

import gymnasium as gym
import numpy as np
import torch

from a3c_http.algos.registry import algorithm_class, model_for
from a3c_http.config.training import TrainConfig
from a3c_http.envs.make import env_for
from a3c_http.envs.rollout import obs_tensor
from a3c_http.models.actor_critic import ActorCritic
from a3c_http.wire import tensors as wire

# Added to the run's seed, so that the evaluation's episodes are not the workers' first ones
# (worker_seed adds a hash of the worker's id instead).
EVAL_SEED_OFFSET = 1_000_003
# Environments stepped together in one batch of the network (episodes beyond wait for a free one).
MAX_PARALLEL_ENVS = 16
# An episode of an environment without a time limit of its own is cut here, so that an evaluation
# always ends.
MAX_EPISODE_STEPS = 100_000


@dataclass(frozen=True)
class EvalResult:
    mean_return: float
    std_return: float  # population standard deviation of the episodes' returns
    episodes: int
    mean_length: float
    returns: tuple[float, ...]


def eval_seed(run_seed: int, episode: int) -> int:
    """The reset seed of one evaluation episode, below 2**31 as gymnasium takes it."""
    return (run_seed + EVAL_SEED_OFFSET + episode) % 2**31


def episode_noise(run_seed: int, episode: int) -> np.random.Generator:
    """The noise that draws the actions of one evaluation episode (`ActorCritic.drawn`): one
    uniform number a step for a discrete action, one standard normal a dimension for a Box."""
    return np.random.default_rng([eval_seed(run_seed, episode), 1])


def step_noise(rng: np.random.Generator, space: gym.Space) -> np.ndarray:
    """One step's noise from `rng` for an action of `space` (`episode_noise`)."""
    if isinstance(space, gym.spaces.Box):
        return rng.standard_normal(int(np.prod(space.shape)), dtype=np.float32)
    return np.float32(rng.random())


def load_model(config: TrainConfig, weights: bytes) -> ActorCritic:
    """The network of `config` with its whole state_dict (parameters and buffers) from a
    safetensors body, checked by `wire.decode`."""
    model = model_for(config)
    model.load_state_dict(wire.decode(weights, wire.spec_of(model)))
    return model.eval()


def evaluate(
    config: TrainConfig,
    weights: bytes,
    episodes: int | None = None,
    make_env: Callable[[int], gym.Env] | None = None,
) -> EvalResult:
    """Play `episodes` (default: `config.eval_episodes`) episodes of `config.env_id` with the
    policy of `weights` as the run's algorithm plays it, on fresh environments seeded from
    `config.seed`. `make_env(i)`:
    the i-th environment (default the run's, a3c_http/envs/make.py `env_for`), e.g. one that records
    videos (scripts/evaluate.py)."""
    model = load_model(config, weights)
    n = config.eval_episodes if episodes is None else episodes
    with torch.no_grad():
        returns, lengths = play(model, config, n, make_env)
    return EvalResult(
        mean_return=statistics.fmean(returns),
        std_return=statistics.pstdev(returns),
        episodes=n,
        mean_length=statistics.fmean(lengths),
        returns=tuple(returns),
    )


def play(
    model: ActorCritic,
    config: TrainConfig,
    episodes: int,
    make_env: Callable[[int], gym.Env] | None = None,
) -> tuple[list[float], list[int]]:
    """The return and length of each of `episodes` episodes, played as the run's algorithm plays
    its policy, up to MAX_PARALLEL_ENVS at a time in one batch. Episode `i` is reset with
    `eval_seed(seed, i)` whichever environment plays it, draws its actions from
    `episode_noise(seed, i)`, and begins with a fresh recurrent state, so the result depends on
    the weights and the seed only. Returns are the sums of the environment's own rewards (never
    clipped, over every life)."""
    seed = config.seed or 0
    sampled = algorithm_class(config).plays == "sample"
    make_env = make_env or (lambda _: env_for(config))
    envs = [make_env(i) for i in range(min(episodes, MAX_PARALLEL_ENVS))]
    try:
        space = envs[0].action_space
        timed = envs[0].spec is not None and envs[0].spec.max_episode_steps is not None
        cap = None if timed else MAX_EPISODE_STEPS
        returns, lengths = [0.0] * episodes, [0] * episodes
        upcoming = iter(range(episodes))
        playing: dict[int, int] = {}  # environment -> the episode it plays
        noise: dict[int, np.random.Generator] = {}  # environment -> its episode's noise
        obs: dict[int, np.ndarray] = {}
        state = model.initial_state(len(envs))  # one row per slot, zeroed where an episode starts
        starts = torch.ones(len(envs), dtype=torch.bool)
        for slot, env in enumerate(envs):
            playing[slot] = next(upcoming)
            obs[slot], _ = env.reset(seed=eval_seed(seed, playing[slot]))
            noise[slot] = episode_noise(seed, playing[slot])
        while playing:
            # Every slot steps its network (a finished one on its last observation, ignored), so
            # that the rows of the state stay the slots'.
            batch = obs_tensor(np.stack([obs[s] for s in range(len(envs))]))
            dist, _, state = model.act(batch, state, starts)
            if sampled:  # a finished slot's draw is made too, and ignored
                draws = np.stack([step_noise(noise[s], space) for s in range(len(envs))])
                actions = model.drawn(dist, torch.from_numpy(draws)).numpy()
            else:
                actions = model.greedy(dist).numpy()
            starts.zero_()
            for slot in list(playing):
                action = actions[slot]
                episode = playing[slot]
                obs[slot], reward, terminated, truncated, _ = envs[slot].step(
                    _fit(action, space)
                )
                returns[episode] += float(reward)
                lengths[episode] += 1
                if terminated or truncated or (cap is not None and lengths[episode] >= cap):
                    following = next(upcoming, None)
                    if following is None:
                        del playing[slot]
                    else:
                        playing[slot] = following
                        obs[slot], _ = envs[slot].reset(seed=eval_seed(seed, following))
                        noise[slot] = episode_noise(seed, following)
                        starts[slot] = True
        return returns, lengths
    finally:
        for env in envs:
            env.close()


def _fit(action: np.ndarray, space: gym.Space) -> int | np.ndarray:
    """The network's action as the environment takes it, as the workers' rollouts send it: the
    index as an int, or clipped to the Box."""
    if isinstance(space, gym.spaces.Box):
        return np.clip(action, space.low, space.high).astype(space.dtype)
    return int(action)


def serve(conn: Connection) -> None:
    """The loop of an evaluation process: receive `(config, weights)`, answer `("ok",
    EvalResult)` or `("error", message)`, until `None` or the parent's end of the pipe closes.
    Ctrl-C in a terminal reaches the whole process group: the parent decides when this ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)  # one core for environment stepping; the workers need the others
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        config, weights = job
        try:
            reply = ("ok", evaluate(config, weights))
        except Exception as exc:  # the parent records it; this process serves the next one
            reply = ("error", f"{type(exc).__name__}: {exc}")
        conn.send(reply)
