"""How a run ends, in one sentence for its start: what `a3c-train` prints, what POST /train
answers (`ends`) and what the master logs. It names the episodes the target is judged on and how
they played the policy, the way a3c-evaluate, a3c-export and load_policy play it (the algorithm's
`plays`, a3c_http/algos/base.py). A run on an environment with no `reward_threshold` and no
`target_return` cannot be solved: it says so, and what ends it instead."""

from __future__ import annotations

from a3c_http.algos.registry import algorithm_class
from a3c_http.config.training import TrainConfig


def how_it_ends(config: TrainConfig) -> str:
    """`config` resolved (`TrainConfig.resolved`: its target_return filled in where the
    environment has a reward_threshold)."""
    ways = []
    if config.target_return is not None:
        ways.append(f"when {judged_on(config)} reaches {config.target_return:g}")
    if config.max_steps is not None:
        ways.append(f"at {config.max_steps:,} env steps (max_steps)")
    if config.max_episodes is not None:
        ways.append(f"after {config.max_episodes:,} episodes (max_episodes)")
    said = "ends " + ", or ".join(ways) if ways else "never ends by itself"
    if config.target_return is None:
        said += (
            f": {config.env_id} has no reward_threshold and no target_return is set, so it is "
            "never solved"
            + ("; set target_return to stop when it is good enough" if ways else "")
            + ("" if ways else "; set target_return, max_steps or max_episodes, or POST /stop")
        )
    return said


def judged_on(config: TrainConfig) -> str:
    """What a run's target is judged on, and how those episodes play the policy."""
    sampled = algorithm_class(config).plays == "sample"
    if config.solved_on == "eval":
        played = "as it samples" if sampled else "greedily"
        return (
            f"the mean return of the latest evaluation ({config.eval_episodes} episodes played "
            f"{played}, as a3c-evaluate plays them)"
        )
    if sampled:
        return (
            "the mean return of the last 100 episodes (the policy as it samples, as a3c-evaluate "
            "plays it)"
        )
    return (
        "the mean return of the last 100 training episodes (exploring; a3c-evaluate plays "
        "greedily)"
    )
