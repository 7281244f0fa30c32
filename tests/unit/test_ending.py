"""How a run says at its start that it will end (a3c_http/config/ending.py)."""

from __future__ import annotations

from a3c_http.algos.registry import train_config
from a3c_http.config.ending import how_it_ends


def _ends(**fields: object) -> str:
    return how_it_ends(train_config(**fields).resolved())


def test_a_run_with_a_target_names_it_and_its_budget() -> None:
    said = _ends(max_episodes=300)
    assert said == (
        "ends when the mean return of the last 100 episodes (the policy as it samples, as "
        "a3c-evaluate plays it) reaches 475, or at 2,000,000 env steps (max_steps), or after 300 "
        "episodes (max_episodes)"
    )


def test_each_algorithm_is_judged_by_default_on_the_policy_a3c_evaluate_plays() -> None:
    """A Q-network plays greedily: its runs are judged on greedy evaluations, not on the
    epsilon-greedy training episodes (also where no preset says so); an actor-critic plays as it
    samples, as its training episodes did."""
    for algo in ("dqn", "apex"):
        for env in ("CartPole-v1", "MountainCar-v0"):  # a preset of the Zoo's, and none
            said = _ends(algo=algo, env_id=env)
            assert "the latest evaluation (" in said and "played greedily" in said, said
    for algo in ("a3c", "a2c", "ppo", "impala"):
        assert "as it samples, as a3c-evaluate plays it" in _ends(algo=algo)
    assert "training episodes (exploring; a3c-evaluate plays greedily)" in _ends(
        algo="dqn", solved_on="train"
    )


def test_a_run_that_cannot_be_solved_says_so_and_what_ends_it() -> None:
    said = _ends(env_id="Pendulum-v1", preset=None, max_steps=50_000)
    assert said.startswith("ends at 50,000 env steps (max_steps): Pendulum-v1 has no ")
    assert "never solved; set target_return" in said
    never = _ends(env_id="Pendulum-v1", preset=None, max_steps=None)
    assert never.startswith("never ends by itself") and never.endswith("or POST /stop")
