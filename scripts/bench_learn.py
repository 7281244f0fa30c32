"""Benchmark: env steps and wall time to each task's target, the cluster against Stable-Baselines3's
A2C with the RL Zoo's settings (and, with --learners, our learner in one process: A2C without HTTP).

    .venv/bin/python scripts/bench_learn.py [--tasks CartPole-v1,Acrobot-v1] [--seeds 3]
        [--learners cluster,sb3] [--workers 2] [--config '{"t_max": 5}'] [--json out.json]

Runs one after another, never two at once, alternating learners seed by seed. A run is solved when
the mean return of its last 100 training episodes reaches the target. SB3 trains for the RL Zoo's
budget of env steps (its n_timesteps, also the horizon of its linear learning-rate schedules); the
cluster for the task's budget below (its max_steps); both stop at a cap of seconds.
The cluster is a master and --workers workers on this host, each task with its preset (POST
/train {"env_id": ...}). SB3 needs the `bench` extra: ./scripts/setup_venv.sh bench.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.bench_solve import one_run  # noqa: E402

# task -> (target, env-step budget, seconds budget)
TASKS = {
    "CartPole-v1": (475.0, 500_000, 240.0),
    "Acrobot-v1": (-100.0, 500_000, 240.0),
    "Pendulum-v1": (-250.0, 2_000_000, 480.0),
    "LunarLander-v3": (200.0, 3_000_000, 720.0),
}

# RL Zoo 2.9.2, hyperparams/a2c.yml (rl_zoo3 is not a dependency: its settings are copied here).
ZOO = {
    "CartPole-v1": {"n_timesteps": 500_000, "n_envs": 8, "ent_coef": 0.0},
    "Acrobot-v1": {"n_timesteps": 500_000, "normalize": True, "n_envs": 16, "ent_coef": 0.0},
    "Pendulum-v1": {
        "n_timesteps": 1_000_000, "normalize": True, "n_envs": 8, "ent_coef": 0.0,
        "max_grad_norm": 0.5, "n_steps": 8,
        "gae_lambda": 0.9, "vf_coef": 0.4, "gamma": 0.9, "use_rms_prop": True,
        "normalize_advantage": False, "learning_rate": "lin_7e-4", "use_sde": True,
        "policy_kwargs": {"log_std_init": -2, "ortho_init": False},
    },
    "LunarLander-v3": {
        "n_timesteps": 200_000, "n_envs": 8, "gamma": 0.995, "n_steps": 5,
        "learning_rate": "lin_0.00083", "ent_coef": 0.00001,
    },
}


def run_sb3(env_id: str, seed: int, target: float, cap_s: float) -> dict:
    import torch
    from stable_baselines3 import A2C
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)  # as each of our workers; faster than 2 for these small networks
    hp = dict(ZOO[env_id])
    budget_steps = hp.pop("n_timesteps")
    n_envs = hp.pop("n_envs")
    envs = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    if hp.pop("normalize", False):
        envs = VecNormalize(envs, gamma=hp.get("gamma", 0.99))
    lr = hp.pop("learning_rate", 7e-4)
    if isinstance(lr, str):  # "lin_X": X falling linearly to 0 over n_timesteps
        start = float(lr.removeprefix("lin_"))
        lr = lambda remaining: remaining * start  # noqa: E731
    model = A2C("MlpPolicy", envs, learning_rate=lr, seed=seed, verbose=0, device="cpu", **hp)

    class UntilSolved(BaseCallback):
        def _init_callback(self) -> None:
            self.recent: deque[float] = deque(maxlen=100)
            self.started = time.monotonic()
            self.solved = False

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.recent.append(float(info["episode"]["r"]))
            full = len(self.recent) == 100
            self.solved = full and sum(self.recent) / 100 >= target
            return not self.solved and time.monotonic() - self.started < cap_s

    callback = UntilSolved()
    model.learn(total_timesteps=budget_steps, callback=callback)
    recent = callback.recent
    return {
        "solved": callback.solved,
        "env_steps": int(model.num_timesteps),
        "seconds": time.monotonic() - callback.started,
        "mean_return_100": sum(recent) / len(recent) if recent else None,
    }


def run_inprocess(env_id: str, seed: int, overrides: dict, budget: int) -> dict:
    from a3c_http.config import TrainConfig
    from a3c_http.learner import train

    r = train(TrainConfig(**{"env_id": env_id, "seed": seed, **overrides}), budget)
    return {"solved": r.solved, "env_steps": r.env_steps, "seconds": r.seconds,
            "mean_return_100": r.mean_return_100}


def run_one(learner: str, env_id: str, seed: int, args: argparse.Namespace) -> dict:
    target, budget, cap_s = TASKS[env_id]
    budget = args.budget or budget
    cap_s = args.cap or cap_s
    overrides = json.loads(args.config)
    if learner == "sb3":
        return run_sb3(env_id, seed, target, cap_s)
    if learner == "a2c":
        return run_inprocess(env_id, seed, overrides, budget)
    config = {"env_id": env_id, "max_steps": budget, **overrides}
    r = one_run(seed, args.workers, config, cap_s)
    return {k: r[k] for k in ("solved", "env_steps", "seconds", "mean_return_100")}


def summary(rows: list[dict], learners: list[str]) -> list[str]:
    lines = [f"{'learner':<8} {'solved':>6} {'env steps (median)':>19} {'wall s (median)':>16} "
             f"{'steps vs sb3':>13} {'time vs sb3':>12}"]
    med: dict[str, tuple[float, float]] = {}
    for learner in learners:
        mine = [r for r in rows if r["learner"] == learner]
        steps = statistics.median(r["env_steps"] for r in mine) if mine else float("nan")
        secs = statistics.median(r["seconds"] for r in mine) if mine else float("nan")
        med[learner] = (steps, secs)
    for learner in learners:
        steps, secs = med[learner]
        n_solved = sum(r["solved"] for r in rows if r["learner"] == learner)
        n = sum(r["learner"] == learner for r in rows)
        ref = med.get("sb3")
        # A ratio to a reference that did not solve every seed would compare with its budget.
        ref_solved = all(r["solved"] for r in rows if r["learner"] == "sb3")
        ratio = (f"{steps / ref[0]:>13.2f} {secs / ref[1]:>12.2f}"
                 if ref and ref_solved and learner != "sb3" else f"{'':>13} {'':>12}")
        lines.append(f"{learner:<8} {n_solved:>3}/{n:<2} {steps:>19,.0f} {secs:>16.1f} {ratio}")
    return lines


def _interrupt(signum, frame):  # noqa: ANN001
    raise KeyboardInterrupt  # so the cluster's `finally` ends every process it started


def main() -> None:
    signal.signal(signal.SIGTERM, _interrupt)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--learners", default="cluster,sb3", help="of cluster, sb3, a2c")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--config", default="{}", help="overrides for cluster and a2c, JSON")
    parser.add_argument("--budget", type=int, default=None, help="env steps (default per task)")
    parser.add_argument("--cap", type=float, default=None, help="seconds (default per task)")
    parser.add_argument("--json", type=Path, default=None, help="write every run's figures here")
    args = parser.parse_args()
    learners = args.learners.split(",")
    report: dict[str, list[dict]] = {}
    for env_id in args.tasks.split(","):
        if env_id not in TASKS:
            parser.error(f"unknown task {env_id!r}; known: {', '.join(TASKS)}")
        rows = report.setdefault(env_id, [])
        print(f"== {env_id} (target {TASKS[env_id][0]:g})", flush=True)
        for seed in range(args.seeds):
            for learner in learners:  # alternating: learner by learner within each seed
                r = {"learner": learner, "seed": seed, **run_one(learner, env_id, seed, args)}
                rows.append(r)
                mean = r["mean_return_100"]
                print(f"  {learner:<8} seed {seed}: {'solved' if r['solved'] else 'NOT solved'}"
                      f" at {r['env_steps']:,} env steps, {r['seconds']:.1f} s, mean return "
                      f"{'-' if mean is None else f'{mean:.1f}'}", flush=True)
        print("\n".join(summary(rows, learners)), flush=True)
        if args.json:
            args.json.write_text(json.dumps(report, indent=1))
    if args.json:
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
