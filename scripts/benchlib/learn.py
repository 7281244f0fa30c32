"""Benchmark: env steps and wall time to each task's target, the cluster against a reference:
Stable-Baselines3's A2C with the RL Zoo's settings (for MinAtar/Breakout-v1 with the MinAtar
paper's small CNN), SB3-contrib's RecurrentPPO for the memory task a3c_http/CueMemory-v0 (and,
with --learners, our learner in one process: A2C without HTTP).

    .venv/bin/python scripts/bench.py learn [--tasks CartPole-v1,Acrobot-v1] [--seeds 3]
        [--learners cluster,sb3] [--workers 2] [--config '{"core": "none"}'] [--json out.json]

Runs one after another, never two at once, alternating learners seed by seed. Most tasks stop at
their target: a run is solved when the mean return of its last 100 training episodes reaches it
(with --algo dqn or apex, against SB3's DQN: that of greedy episodes on both sides, tasks.py
GREEDY), and the summary compares env steps and wall time. A task marked "at budget"
(MinAtar/Breakout-v1) trains every learner to the same budget of env steps (--budget changes it
for all) and reports the mean return of the last 100 episodes there (dqn, apex: of the greedy
evaluation of their final weights); the summary compares mean returns and wall time.
On the other tasks SB3 trains for the RL Zoo's budget of env steps (its n_timesteps, also the
horizon of its linear learning-rate schedules), RecurrentPPO and the cluster for the task's budget
below (the cluster's max_steps); every learner stops at a cap of seconds.
The cluster is a master and --workers workers on this host, each task with its preset (POST
/train {"env_id": ...}) and the --config overrides. The references need the `bench` extra:
./scripts/setup_venv.sh bench (SB3, SB3-contrib, Box2D, MinAtar). The tasks are in tasks.py, the
references in sb3.py.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
from pathlib import Path

from scripts.benchlib.cluster import fresh_run
from scripts.benchlib.options import seed_list
from scripts.benchlib.procs import interrupt
from scripts.benchlib.sb3 import (
    run_recurrent_ppo,
    run_sb3,
    run_sb3_dqn,
    run_sb3_offpolicy,
    run_sb3_ppo,
)
from scripts.benchlib.tasks import (
    CONTINUOUS_TASKS,
    GREEDY_CLUSTER,
    RECURRENT,
    TASKS,
    Task,
    greedy_of,
    require_env,
    task_of,
)

# The cluster's algos that learn continuous actions off-policy, against SB3's SAC and TD3.
CONTINUOUS = ("sac", "apex_dpg")


def run_inprocess(env_id: str, seed: int, overrides: dict, budget: int) -> dict:
    from a3c_http.algos.a3c.single_process import train
    from a3c_http.algos.registry import train_config

    r = train(train_config(**{"env_id": env_id, "seed": seed, **overrides}), budget)
    return {"solved": r.solved, "env_steps": r.env_steps, "seconds": r.seconds,
            "mean_return_100": r.mean_return_100}


def run_one(learner: str, env_id: str, seed: int, args: argparse.Namespace) -> dict:
    task = task_of(env_id, args.algo)
    budget = args.budget or task.budget
    cap_s = args.cap or task.cap_s
    # At budget: a target no run reaches, so that ours train to max_steps as SB3 does; else the
    # task's (Pendulum has no reward_threshold of its own).
    target = {"target_return": task.target if task.stop_at_target else 1e9}
    overrides = {**target, **json.loads(args.config)}
    if learner in ("sb3", "td3") and args.algo in CONTINUOUS:
        kind = "TD3" if learner == "td3" else "SAC"
        r = run_sb3_offpolicy(kind, env_id, seed, task, cap_s, budget, args.algo)
    elif learner == "sb3" and env_id in RECURRENT:
        r = run_recurrent_ppo(env_id, seed, task, cap_s, budget)
    elif learner == "sb3" and args.algo in ("dqn", "apex"):
        r = run_sb3_dqn(env_id, seed, task, cap_s, None if task.stop_at_target else budget)
    elif learner == "sb3" and args.algo != "a3c":
        r = run_sb3_ppo(env_id, seed, task, cap_s, None if task.stop_at_target else budget)
    elif learner == "sb3":
        r = run_sb3(env_id, seed, task, cap_s, None if task.stop_at_target else budget)
    elif learner == "a2c":
        r = run_inprocess(env_id, seed, overrides, budget)
    else:  # the cluster with --algo, or its own A3C ("a3c")
        algo = "a3c" if learner == "a3c" else args.algo
        # SB3's SAC and TD3 train to the task's budget as the cluster does (their presets' own,
        # the Zoo's, are shorter than some seeds need); the others to the Zoo's.
        same_budget = algo == "a3c" or algo in CONTINUOUS or not task.stop_at_target
        max_steps = {"max_steps": budget} if same_budget else {}
        greedy = GREEDY_CLUSTER.get(env_id, {}) if algo in ("dqn", "apex") else {}
        config = {"env_id": env_id, "algo": algo, **max_steps, **greedy, **overrides}
        r = fresh_run(seed, args.workers, config, cap_s)
        r = {k: r[k] for k in ("solved", "env_steps", "seconds", "mean_return_100", "eval_return")}
    if greedy_of(env_id, args.algo) and not task.stop_at_target:  # judged on greedy episodes
        r["train_return_100"], r["mean_return_100"] = r["mean_return_100"], r.get("eval_return")
    if not task.stop_at_target:  # reached: the mean return at the budget is at the target
        r["solved"] = r["mean_return_100"] is not None and r["mean_return_100"] >= task.target
    return r


def reference(learners: list[str]) -> str:
    """What the other learners are compared with: SB3 when it runs, else the cluster's A3C."""
    return "sb3" if "sb3" in learners else "a3c" if "a3c" in learners else learners[-1]


def summary(rows: list[dict], learners: list[str], task: Task | None = None) -> list[str]:
    ref_name = reference(learners)
    if task is not None and not task.stop_at_target:
        return summary_at_budget(rows, learners)
    lines = [f"{'learner':<8} {'solved':>6} {'env steps (median)':>19} {'wall s (median)':>16} "
             f"{'steps vs ' + ref_name:>13} {'time vs ' + ref_name:>12}"]
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
        ref = med.get(ref_name)
        # A ratio to a reference that did not solve every seed would compare with its budget.
        ref_solved = all(r["solved"] for r in rows if r["learner"] == ref_name)
        ratio = (f"{steps / ref[0]:>13.2f} {secs / ref[1]:>12.2f}"
                 if ref and ref_solved and learner != ref_name else f"{'':>13} {'':>12}")
        lines.append(f"{learner:<8} {n_solved:>3}/{n:<2} {steps:>19,.0f} {secs:>16.1f} {ratio}")
    return lines


def summary_at_budget(rows: list[dict], learners: list[str]) -> list[str]:
    """Each learner's median mean return at the budget and median wall time, with the ratios of
    the others' to the reference's (`reference`; the bar: a return ratio of at least 1 at a time
    ratio of at most 1)."""
    ref_name = reference(learners)
    lines = [f"{'learner':<8} {'reached':>7} {'mean return (median)':>21} {'wall s (median)':>16} "
             f"{'return vs ' + ref_name:>14} {'time vs ' + ref_name:>12}"]
    med: dict[str, tuple[float, float]] = {}
    for learner in learners:
        means = [r["mean_return_100"] for r in rows
                 if r["learner"] == learner and r["mean_return_100"] is not None]
        secs = [r["seconds"] for r in rows if r["learner"] == learner]
        med[learner] = (statistics.median(means) if means else float("nan"),
                        statistics.median(secs) if secs else float("nan"))
    ref = med.get(ref_name)
    for learner in learners:
        mean, secs = med[learner]
        n_reached = sum(r["solved"] for r in rows if r["learner"] == learner)
        n = sum(r["learner"] == learner for r in rows)
        # A ratio of returns means "as good" only over a positive reference.
        ratio = (f"{mean / ref[0]:>14.2f} {secs / ref[1]:>12.2f}"
                 if ref and ref[0] > 0 and learner != ref_name else f"{'':>14} {'':>12}")
        lines.append(f"{learner:<8} {n_reached:>4}/{n:<2} {mean:>21.2f} {secs:>16.1f} {ratio}")
    return lines


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    signal.signal(signal.SIGTERM, interrupt)  # so the cluster's `finally` ends every process
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default=None, help="default: every task of the algo")
    parser.add_argument(
        "--seeds", default="3",
        help="how many seeds (N: 0 to N-1; default 3), or which ones, comma-separated with a "
        "comma at least (`1,2`; `5,`)",
    )  # fmt: skip
    parser.add_argument(
        "--algo", default="a3c", choices=("a3c", "ppo", "impala", "dqn", "apex", *CONTINUOUS),
        help="the cluster's algo; sb3 is then SB3's PPO for ppo and impala, its DQN for dqn and "
        "apex, its SAC for sac and apex_dpg (default a3c)",
    )  # fmt: skip
    parser.add_argument(
        "--learners", default="cluster,sb3",
        help="of cluster, sb3, a2c (in one process), a3c (the cluster's A3C), td3 (SB3's TD3, "
        "with --algo sac or apex_dpg)",
    )  # fmt: skip
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--config", default="{}", help="overrides for cluster and a2c, JSON")
    parser.add_argument("--budget", type=int, default=None, help="env steps (default per task)")
    parser.add_argument("--cap", type=float, default=None, help="seconds (default per task)")
    parser.add_argument("--json", type=Path, default=None, help="write every run's figures here")
    args = parser.parse_args(argv)
    seeds = seed_list(args.seeds, parser)
    learners = args.learners.split(",")
    report: dict[str, list[dict]] = {}
    known = CONTINUOUS_TASKS if args.algo in CONTINUOUS else TASKS
    env_ids = (args.tasks or ",".join(known)).split(",")
    for env_id in env_ids:
        if env_id not in known:
            parser.error(f"unknown task {env_id!r}; known: {', '.join(known)}")
        try:
            require_env(env_id)
        except RuntimeError as exc:
            parser.error(str(exc))
    try:
        for env_id in env_ids:
            run_task(env_id, seeds, learners, args, report)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: every process of the run was ended meanwhile
        done = sum(len(rows) for rows in report.values())
        kept = f"; their figures are in {args.json}" if args.json and done else ""
        print(f"interrupted after {done} finished runs{kept}", flush=True)
        return 130
    if args.json:
        print(f"figures written to {args.json}")
    return 0


def run_task(env_id: str, seeds: list[int], learners: list[str], args: argparse.Namespace,
             report: dict[str, list[dict]]) -> None:
    """Every seed of `env_id` with each learner in turn, its rows added to `report` and the
    whole report written to `args.json` after each run, so an interrupted benchmark keeps the
    runs it finished."""
    task = task_of(env_id, args.algo)
    rows = report.setdefault(env_id, [])
    refs = {"a3c": "SB3's A2C", "dqn": "SB3's DQN", "apex": "SB3's DQN", "sac": "SB3's SAC",
            "apex_dpg": "SB3's SAC"}  # fmt: skip
    ref = "SB3-contrib's RecurrentPPO" if env_id in RECURRENT else (
        refs.get(args.algo, "SB3's PPO")
    )
    how = "stop there" if task.stop_at_target else f"at {args.budget or task.budget:,} steps"
    print(f"== {env_id} (target {task.target:g}, {how}; sb3: {ref})", flush=True)
    for seed in seeds:
        for learner in learners:  # alternating: learner by learner within each seed
            r = {"learner": learner, "seed": seed, **run_one(learner, env_id, seed, args)}
            rows.append(r)
            if args.json:
                args.json.write_text(json.dumps(report, indent=1))
            mean = r["mean_return_100"]
            done = "solved" if task.stop_at_target else "reached the target"
            print(f"  {learner:<8} seed {seed}: {done if r['solved'] else 'NOT ' + done}"
                  f" at {r['env_steps']:,} env steps, {r['seconds']:.1f} s, mean return "
                  f"{'-' if mean is None else f'{mean:.1f}'}", flush=True)
    print("\n".join(summary(rows, learners, task)), flush=True)
