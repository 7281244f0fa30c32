"""The config fields every algorithm with a learner beside the master shares (ppo, impala, apex,
apex_dpg, sac): the base of their sections, torch-free as every config section is."""

from __future__ import annotations

from pydantic import Field, model_validator

from a3c_http.config.training import TrainConfig


class LearnerConfig(TrainConfig):
    """A run whose workers push experience to one learner process beside the master."""

    queue_size: int = Field(
        2,
        ge=1,
        le=1024,
        description="The rollouts (t_max x num_envs steps each) one update of "
        "the learner takes. Twice as many may wait for it; beyond that a push's reply is held "
        "until there is room (the seed's bounded queue).",
    )
    max_policy_lag: int = Field(
        4,
        ge=0,
        description="A rollout acted by weights more than this many versions "
        "older than the learner's is dropped when the learner takes it (counted in /status "
        "learner.dropped_stale); impala corrects the lag of the rest with V-trace.",
    )
    learner_threads: int = Field(
        0,
        ge=0,
        le=256,
        description="The learner's threads on a CPU (PyTorch's intra-op threads), at most the "
        "master host's cores; 0: half its cores, at least 1, the other half left to workers on "
        "the same host. A learner whose actors' work is light (sac and apex_dpg on vector "
        "observations) takes them all. Several threads spin between operations, and while "
        "the learner waits (a core each); on a host busier than its cores they wait for each "
        "other instead: set 1 there.",
    )
    learners: int = Field(
        1,
        ge=1,
        le=64,
        description="Learner processes beside the master that learn as one (data-parallel, "
        "a3c_http/optim/team.py): each takes its share of the environments of an update's "
        "queue_size rollouts (Ape-X: its shard of the replay, and of batch_size and "
        "learning_starts), and their gradients are averaged before every step (gloo on CPUs, "
        "NCCL with a GPU each). At most num_envs x queue_size; learner_threads is shared "
        "among them.",
    )
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda(:\d+)?|mps)$",
        description="Where the learner runs: auto (the master host's first GPU "
        "when torch sees one, else the CPU), cpu, cuda, cuda:N or mps. A device the master host "
        "does not have is refused with 422.",
    )

    @model_validator(mode="after")
    def _a_rollout_for_every_learner(self) -> LearnerConfig:
        environments = self.num_envs * self.queue_size
        if self.learners > environments:
            raise ValueError(
                f"learners {self.learners} is more than the {environments} environments of an "
                "update (num_envs x queue_size): each learner takes a share of them, one at least"
            )
        return self


def replay_never_fills(buffer_size: int, learning_starts: int, learners: int = 1) -> str | None:
    """Why a replay of `buffer_size` would never hold `learning_starts` transitions (each of
    `learners` keeping its share of both, as a3c_http/algos/replay_learner.py shares them), so
    that no gradient step would ever be taken; None where it fills."""
    shard = max(1, buffer_size // learners)
    starts = max(-(-learning_starts // learners), 1)
    if starts <= shard:
        return None
    team = f" (each of {learners} learners keeps {shard} and waits for {starts})"
    return (
        f"learning_starts {learning_starts} is more than the replay holds"
        f"{team if learners > 1 else ''}: buffer_size {buffer_size}, so no gradient step would "
        "ever be taken"
    )
