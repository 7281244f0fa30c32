"""The config fields the off-policy algorithms of continuous actions share (sac, apex_dpg): a
replay beside the master that one learner samples, and target networks moved towards the online
ones. Torch-free, as every config section is."""

from __future__ import annotations

from pydantic import Field, model_validator

from a3c_http.algos.learner_config import LearnerConfig, replay_never_fills


class OffPolicyConfig(LearnerConfig):
    """A run whose actors fill a replay beside the master that one learner samples, learning an
    actor and its critics (a3c_http/algos/continuous.py)."""

    learners: int = Field(
        1,
        ge=1,
        le=1,
        description="sac and apex_dpg: one learner (their actor's, critics' and entropy "
        "coefficient's optimizers are not averaged over a team).",
    )
    buffer_size: int = Field(
        1_000_000,
        ge=1,
        le=10_000_000,
        description="sac and apex_dpg: the transitions the replay beside the master holds (the "
        "oldest are overwritten; it is set out in full at the first transition).",
    )
    learning_starts: int = Field(
        100,
        ge=0,
        description="sac and apex_dpg: transitions the replay holds before the first gradient "
        "step.",
    )
    gradient_steps: int = Field(
        1,
        ge=1,
        le=100_000,
        description="sac and apex_dpg: learner steps on each queue_size rollouts that arrive. "
        "t_max x num_envs x queue_size of them is one step an env step, as SB3's train_freq 1 "
        "and gradient_steps 1; the master holds the actors' pushes while the learner is behind.",
    )
    batch_size: int = Field(
        256, ge=1, le=1_000_000, description="Transitions in one minibatch from the replay."
    )
    n_step: int = Field(
        1, ge=1, le=1000, description="sac and apex_dpg: the steps of each transition's return."
    )
    tau: float = Field(
        0.005,
        gt=0,
        le=1,
        description="sac and apex_dpg: how far the target networks move towards the online ones "
        "at each target update (Polyak averaging; 1: copied, a hard update).",
    )
    target_update: int = Field(
        1,
        ge=1,
        description="sac and apex_dpg: learner steps between two target updates (with tau 1 "
        "and 1,000 here, the target is the network of 1,000 steps before).",
    )
    prioritized_alpha: float = Field(
        0.0,
        ge=0,
        le=1,
        description="sac and apex_dpg: how much the priorities shape sampling (0: uniform, "
        "SAC's; Ape-X DPG's 0.6).",
    )
    prioritized_beta: float = Field(
        0.4,
        ge=0,
        le=1,
        description="sac and apex_dpg: the importance weights' exponent at the start, annealed "
        "linearly to 1 as env steps approach max_steps.",
    )

    @model_validator(mode="after")
    def _continuous_fits(self) -> OffPolicyConfig:
        problems = {
            "core": (self.core != "none", "its actor and critics are feed-forward; leave core "
                     "'none'"),
            "encoder": (self.encoder != "mlp", "its networks read flat observations: encoder "
                        "'mlp'"),
            "normalize_reward": (self.normalize_reward, "the replay keeps the rewards as they are"),
            "normalize_obs": (self.normalize_obs, "the replay keeps the observations as they are"),
        }  # fmt: skip
        for field, (bad, why) in problems.items():
            if bad:
                raise ValueError(f"{field}={getattr(self, field)!r} with algo {self.algo!r}: {why}")
        if never := replay_never_fills(self.buffer_size, self.learning_starts, self.learners):
            raise ValueError(never)
        return self
