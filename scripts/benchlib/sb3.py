"""The references of `bench.py learn` (scripts/benchlib/learn.py): Stable-Baselines3's A2C, PPO
and DQN with the RL Zoo's settings (scripts/benchlib/zoo.py) and SB3-contrib's RecurrentPPO, each
in this process on one thread, stopped at its task's target or cap of seconds. SB3 is imported
only when one runs (the `bench` extra)."""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any

from scripts.benchlib.tasks import GREEDY, LSTM_HP, RECURRENT, Task, greedy_of, require_env
from scripts.benchlib.zoo import ZOO, ZOO_DQN, ZOO_PPO, ZOO_PPO_LSTM, ZOO_SAC, ZOO_TD3


def minatar_cnn() -> type:
    """The MinAtar paper's network (Young and Tian 2019) as an SB3 features extractor: 16 3x3
    filters with stride 1, then 128 units. MinAtar's observations are (10, 10, channels) bools,
    channels last: SB3 takes them as they come (not as images), so they are permuted here."""
    import torch
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
    from torch import nn

    class MinAtarCNN(BaseFeaturesExtractor):
        def __init__(self, observation_space: Any, features_dim: int = 128) -> None:
            super().__init__(observation_space, features_dim)
            height, width, channels = observation_space.shape
            self.net = nn.Sequential(
                nn.Conv2d(channels, 16, 3, stride=1), nn.ReLU(), nn.Flatten(),
                nn.Linear(16 * (height - 2) * (width - 2), features_dim), nn.ReLU(),
            )

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return self.net(obs.permute(0, 3, 1, 2).float())

    return MinAtarCNN


def _classes(policy_kwargs: dict[str, Any]) -> dict[str, Any]:
    """ZOO's policy_kwargs with the names of classes replaced by the classes."""
    from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike
    from torch import nn

    known = {"RMSpropTFLike": RMSpropTFLike, "MinAtarCNN": minatar_cnn(), "ReLU": nn.ReLU}
    return {k: known.get(v, v) if isinstance(v, str) else v for k, v in policy_kwargs.items()}


def _watch(
    target: float, cap_s: float, stop_at_target: bool, greedy: tuple[Any, int] | None = None
) -> Any:
    """An SB3 callback that keeps the last 100 episode returns and stops the learner at the cap
    of seconds, and once they reach the target when the task stops there. `greedy`: (a function
    of the model that plays its greedy episodes and returns their mean return, every how many
    env steps): judge the target on that instead, as the cluster's `solved_on: "eval"`."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Watch(BaseCallback):
        def _init_callback(self) -> None:
            self.recent: deque[float] = deque(maxlen=100)
            self.started = time.monotonic()
            self.solved = False
            self.next_eval = greedy[1] if greedy else 0
            self.eval_return: float | None = None  # the latest greedy evaluation's

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.recent.append(float(info["episode"]["r"]))
            if greedy is None:
                full = len(self.recent) == 100
                self.solved = full and sum(self.recent) / 100 >= target
            elif self.num_timesteps >= self.next_eval:
                self.next_eval += greedy[1]
                mean = greedy[0](self.model)
                self.solved, self.eval_return = bool(mean >= target), float(mean)
            stop = self.solved and stop_at_target
            return not stop and time.monotonic() - self.started < cap_s

    return Watch()


def _learn(model: Any, budget: int, callback: Any) -> dict:
    model.learn(total_timesteps=budget, callback=callback)
    recent = callback.recent
    return {
        "solved": callback.solved,
        "env_steps": int(model.num_timesteps),
        "seconds": time.monotonic() - callback.started,
        "mean_return_100": sum(recent) / len(recent) if recent else None,
        "eval_return": callback.eval_return,
    }


def run_sb3(env_id: str, seed: int, task: Task, cap_s: float, budget: int | None = None) -> dict:
    """SB3's A2C with ZOO's settings for `env_id`, for `budget` env steps (default: the Zoo's)."""
    import torch
    from stable_baselines3 import A2C
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecFrameStack, VecNormalize

    require_env(env_id)
    torch.set_num_threads(1)  # as each of our workers; faster than 2 for these small networks
    hp = dict(ZOO[env_id])
    zoo_steps = hp.pop("n_timesteps")
    budget_steps = budget or zoo_steps
    n_envs = hp.pop("n_envs")
    envs = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    if hp.pop("normalize", False):
        envs = VecNormalize(envs, gamma=hp.get("gamma", 0.99))
    if frames := hp.pop("frame_stack", 0):
        envs = VecFrameStack(envs, frames, channels_order="last")
    lr = hp.pop("learning_rate", 7e-4)
    if isinstance(lr, str):  # "lin_X": X falling linearly to 0 over n_timesteps
        start = float(lr.removeprefix("lin_"))
        lr = lambda remaining: remaining * start  # noqa: E731
    if "policy_kwargs" in hp:
        hp["policy_kwargs"] = _classes(hp["policy_kwargs"])
    model = A2C("MlpPolicy", envs, learning_rate=lr, seed=seed, verbose=0, device="cpu", **hp)
    return _learn(model, budget_steps, _watch(task.target, cap_s, task.stop_at_target))


def run_sb3_ppo(env_id: str, seed: int, task: Task, cap_s: float, budget: int | None) -> dict:
    """SB3's PPO with ZOO_PPO's settings for `env_id`, for `budget` env steps (default: the
    Zoo's)."""
    from stable_baselines3 import PPO

    envs, hp, budget_steps = _zoo_ppo(env_id, seed, ZOO_PPO[env_id], budget)
    model = PPO("MlpPolicy", envs, seed=seed, verbose=0, device="cpu", **hp)
    return _learn(model, budget_steps, _watch(task.target, cap_s, task.stop_at_target))


def _zoo_ppo(env_id: str, seed: int, zoo: dict[str, Any], budget: int | None) -> tuple:
    """The vectorised environments, the keyword arguments and the env steps of a PPO (or
    RecurrentPPO) with the Zoo's settings `zoo` for `env_id`, for `budget` env steps (default:
    the Zoo's)."""
    import torch
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecFrameStack, VecNormalize

    require_env(env_id)
    torch.set_num_threads(1)
    hp = dict(zoo)
    budget_steps = budget or hp.pop("n_timesteps")
    hp.pop("n_timesteps", None)
    envs = make_vec_env(env_id, n_envs=hp.pop("n_envs"), seed=seed)
    if hp.pop("normalize", False):
        envs = VecNormalize(envs, gamma=hp.get("gamma", 0.99))
    if frames := hp.pop("frame_stack", 0):
        envs = VecFrameStack(envs, frames, channels_order="last")
    for name in ("learning_rate", "clip_range"):
        value = hp.get(name)
        if isinstance(value, str):  # "lin_X": X falling linearly to 0 over n_timesteps
            start = float(value.removeprefix("lin_"))
            hp[name] = lambda remaining, start=start: remaining * start
    if "policy_kwargs" in hp:
        hp["policy_kwargs"] = _classes(hp["policy_kwargs"])
    return envs, hp, budget_steps


def run_sb3_dqn(env_id: str, seed: int, task: Task, cap_s: float, budget: int | None) -> dict:
    """SB3's DQN with ZOO_DQN's settings for `env_id`, for `budget` env steps (default: the
    task's)."""
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecFrameStack

    require_env(env_id)
    torch.set_num_threads(1)
    hp = dict(ZOO_DQN[env_id])
    hp.pop("n_timesteps")
    envs = make_vec_env(env_id, n_envs=1, seed=seed)
    if frames := hp.pop("frame_stack", 0):
        envs = VecFrameStack(envs, frames, channels_order="last")
    if "policy_kwargs" in hp:
        hp["policy_kwargs"] = _classes(hp["policy_kwargs"])
    model = DQN("MlpPolicy", envs, seed=seed, verbose=0, device="cpu", **hp)
    eval_envs = make_vec_env(env_id, n_envs=1, seed=seed + 10_000)
    if frames:
        eval_envs = VecFrameStack(eval_envs, frames, channels_order="last")
    episodes, every = GREEDY[env_id]

    def evaluate(model: Any) -> float:
        from stable_baselines3.common.evaluation import evaluate_policy

        return float(evaluate_policy(model, eval_envs, episodes, deterministic=True)[0])

    watch = _watch(task.target, cap_s, task.stop_at_target, (evaluate, every))
    return _learn(model, budget or task.budget, watch)


def _as_the_cluster_plays(
    env_id: str, env_kwargs: dict[str, Any], seed: int, episodes: int
) -> Any:
    """A function of an SB3 model: the mean return of its deterministic policy over `episodes`
    episodes whose resets are seeded as the cluster's master seeds its evaluations of a run of
    `seed` (a3c_http/policy/evaluation.py `eval_seed`), so both sides are judged on the same
    initial states, the same ones at every evaluation."""
    import gymnasium as gym

    from a3c_http.policy.evaluation import eval_seed

    env = gym.make(env_id, **env_kwargs)

    def evaluate(model: Any) -> float:
        total = 0.0
        for i in range(episodes):
            obs, _ = env.reset(seed=eval_seed(seed, i))
            done = False
            while not done:
                action, _ = model.predict(obs, deterministic=True)
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                done = terminated or truncated
        return total / episodes

    return evaluate


def run_sb3_offpolicy(
    kind: str, env_id: str, seed: int, task: Task, cap_s: float, budget: int | None, algo: str
) -> dict:
    """SB3's SAC or TD3 (`kind`) with ZOO_SAC's or ZOO_TD3's settings for `env_id`, for `budget`
    env steps (default: the task's), judged as the cluster's `algo` is (greedy_of)."""
    import numpy as np
    import stable_baselines3
    import torch
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise

    require_env(env_id)
    # Every core, PyTorch's default: their 256-unit layers on batches of 256 take two threads
    # faster than one (SAC on Pendulum: 10.9 against 14.7 ms an env step on 2 cores).
    torch.set_num_threads(os.cpu_count() or 1)
    hp = dict((ZOO_SAC if kind == "SAC" else ZOO_TD3)[env_id])
    hp.pop("n_timesteps")
    env_kwargs = hp.pop("env_kwargs", {})
    envs = make_vec_env(env_id, n_envs=1, seed=seed, env_kwargs=env_kwargs)
    value = hp.get("learning_rate")
    if isinstance(value, str):  # "lin_X": X falling linearly to 0 over the run
        start = float(value.removeprefix("lin_"))
        hp["learning_rate"] = lambda remaining, start=start: remaining * start
    if hp.pop("noise_type", None) == "normal":
        dims = envs.action_space.shape[-1]
        hp["action_noise"] = NormalActionNoise(np.zeros(dims), hp.pop("noise_std") * np.ones(dims))
    model = getattr(stable_baselines3, kind)(
        "MlpPolicy", envs, seed=seed, verbose=0, device="cpu", **hp
    )
    greedy = greedy_of(env_id, algo)
    if greedy is not None:
        episodes, every = greedy
        greedy = (_as_the_cluster_plays(env_id, env_kwargs, seed, episodes), every)
    watch = _watch(task.target, cap_s, task.stop_at_target, greedy)
    return _learn(model, budget or task.budget, watch)


def run_recurrent_ppo(env_id: str, seed: int, task: Task, cap_s: float, budget: int) -> dict:
    """SB3-contrib's RecurrentPPO with an LSTM policy: the Zoo's settings where it has them
    (ZOO_PPO_LSTM), else its defaults but for RECURRENT's."""
    from sb3_contrib import RecurrentPPO

    envs, hp, _ = _zoo_ppo(env_id, seed, ZOO_PPO_LSTM.get(env_id) or RECURRENT.get(env_id, LSTM_HP),
                           budget)  # fmt: skip
    model = RecurrentPPO("MlpLstmPolicy", envs, seed=seed, verbose=0, device="cpu", **hp)
    return _learn(model, budget, _watch(task.target, cap_s, task.stop_at_target))
