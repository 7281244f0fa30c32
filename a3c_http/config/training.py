"""The training config's shared section: the fields and checks every algorithm has, whose
descriptions are the reference (the process settings read from the environment are
a3c_http/config/settings.py).

Each algorithm's room declares its own section, a subclass of `TrainConfig` with its `algo` and
its own fields, defaults and presets (a3c_http/algos/<algo>/config.py); the body of `POST /train`
is one of them, chosen by its `algo` (a3c_http/algos/registry.py `train_config`). The master
validates it, resolves what depends on the environment (`target_return`), saves it with the run
and sends it to every worker.
"""

from __future__ import annotations

import math
import os
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from a3c_http.config.hints import with_field_hints
from a3c_http.config.presets import with_preset
from a3c_http.envs.make import env_spec

# The largest seed torch.manual_seed takes (an unsigned 64-bit integer).
MAX_SEED = 2**64 - 1
# The widest per-worker log-std offset: e**3, twenty times the standard deviation, is plenty.
MAX_LOG_STD_SPREAD = 3.0


class TrainConfig(BaseModel):
    """What shapes one training run, as every algorithm has it. Never built itself: a run's
    config is its algorithm's section (a subclass that narrows `algo` to its own name), built by
    a3c_http/algos/registry.py `train_config`. A3C's defaults solve CartPole-v1 in a few minutes
    on two CPU cores with two workers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # What a section declares of its algorithm besides its fields: the values it starts from
    # before a task's preset, and its presets by env_id (a family's under its pattern, "ALE/*").
    # The network it trains is its algorithm's (a3c_http/algos/base.py `Algorithm.model`).
    defaults: ClassVar[dict[str, Any]] = {}
    presets: ClassVar[dict[str, dict[str, Any]]] = {}

    env_id: str = Field(
        "CartPole-v1",
        description="A gymnasium environment id. Box observations; Discrete or Box actions. "
        "ALE/... (the atari extra) and MinAtar/... (the minatar extra) are registered on use.",
    )
    preset: str | None = Field(
        None,
        description="The per-task preset (a3c_http/config/presets.py) whose values fill every "
        "field the body does not give. Absent: env_id's preset, if it has one, else its family's "
        "(ALE/*: every Atari game); null: none.",
    )
    env_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for gymnasium.make(env_id, ...)."
    )
    preprocess: Literal["none", "atari"] = Field(
        "none",
        description="atari: gymnasium's AtariPreprocessing (up to 30 no-ops after a reset, 4 "
        "frames a step max-pooled, 84x84 grayscale); the environment is made with frameskip=1.",
    )
    frame_stack: int = Field(1, ge=1, le=16, description="Observations stacked as channels (as "
                             "gymnasium's FrameStackObservation).")
    clip_reward: bool = Field(False, description="The loss learns from the sign of each reward "
                              "(-1, 0, +1), as the DQN and A3C papers on Atari; reported returns "
                              "stay the true ones.")
    life_loss: bool = Field(
        False,
        description="A lost life (Atari's `lives` info) ends the loss's bootstrapping as an "
        "episode end would; the episode itself, its return and the recurrent state go on.",
    )
    num_envs: int = Field(8, ge=1, le=256, description="Environments a worker steps in one batch.")
    hidden_sizes: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=lambda: [64, 64],
        min_length=0,
        max_length=8,
        description="Widths of the tanh layers of the policy and of the value network, over the "
        "flattened observation (encoder mlp) or the CNN's units (as SB3 puts its MLP after a "
        "custom CNN); [] puts the heads right on them (the A3C paper's Atari network).",
    )
    shared_torso: bool = Field(
        False,
        description="One torso for the policy and the value (the A3C paper's network); false: "
        "each has its own, as in SB3's A2C, so the value loss does not reshape the policy.",
    )
    encoder: Literal["mlp", "nature_cnn", "small_cnn"] = Field(
        "mlp",
        description="What turns an observation into features: mlp, tanh layers of hidden_sizes "
        "over the flattened observation; nature_cnn, the DQN paper's three convolutions and 512 "
        "units for 84x84 frames (about 1.7 million parameters with 4 frames); small_cnn, "
        "MinAtar's one 3x3 convolution of 16 filters and 128 units for small grids. The CNNs "
        "scale uint8 frames to [0, 1] and are shared by the policy and the value.",
    )
    core: Literal["none", "lstm"] = Field(
        "none",
        description="none: a feed-forward policy; lstm: an LSTM of lstm_size units between the "
        "encoder and the heads, whose state each environment carries from step to step and "
        "from rollout to rollout (reset where an episode starts), trained by backpropagation "
        "through each rollout. With lstm the mlp encoder is shared by the policy and the value.",
    )
    lstm_size: int = Field(128, ge=1, le=4096, description="Units of the lstm core.")
    lstm_first: bool = Field(False, description="With core lstm: the policy and the value each "
                             "have an LSTM of their own on the encoder's output, then ReLU layers "
                             "of hidden_sizes (RecurrentPPO's layout with the RL Zoo's settings); "
                             "false: tanh layers of hidden_sizes feed one LSTM. No effect "
                             "without a core.")
    log_std_init: float = Field(
        0.0, ge=-5, le=2, description="Initial log standard deviation of continuous actions."
    )
    normalize_obs: bool = Field(
        False,
        description="Normalise observations by a running mean and variance that all workers "
        "build together through the master (shipped and saved with the weights).",
    )
    normalize_reward: bool = Field(
        False,
        description="Scale rewards by the running standard deviation of the discounted return, "
        "shared like normalize_obs. Reported returns stay unscaled.",
    )
    optimizer: Literal["rmsprop", "rmsprop_tf", "adam"] = Field(
        "rmsprop",
        description="The master's optimizer: RMSprop (alpha 0.99, eps 1e-5) as SB3's A2C; "
        "rmsprop_tf, its TensorFlow form as the A3C paper and SB3's RMSpropTFLike for Atari (the "
        "mean square starts at ones, eps under the square root); or Adam.",
    )
    lr: float = Field(
        7e-4,
        gt=0,
        le=1,
        description="Learning rate of the master's optimizer "
        "(and of each worker's own optimizer with algo best_weights).",
    )
    lr_schedule: Literal["constant", "linear"] = Field(
        "constant",
        description="linear: the learning rate falls from lr to 0 as env steps approach max_steps.",
    )
    gamma: float = Field(0.99, ge=0, le=1, description="Discount factor.")
    gae_lambda: float = Field(
        1.0, ge=0, le=1, description="GAE lambda; 1.0 gives plain n-step returns as in A3C."
    )
    t_max: int = Field(5, ge=1, le=10_000, description="Steps per environment in one rollout.")
    entropy_coef: float = Field(0.0, ge=0, description="Weight of the entropy bonus.")
    value_coef: float = Field(0.5, ge=0, description="Weight of the value loss.")
    max_grad_norm: float = Field(
        0.5,
        gt=0,
        description="Gradients are clipped to this global L2 norm before they are sent; the "
        "master refuses (422) gradients whose norm is above it.",
    )
    algo: str = Field(
        "a3c",
        description="The algorithm, and with it the section of fields the config has besides "
        "these (docs/configuration.md): a3c, workers push gradients that the master applies as "
        "they come; a2c, the master waits for one gradient of each running worker for the "
        "current version and applies their mean in one step (see sync_timeout_s); best_weights, "
        "the original design, a worker whose episode beats the best score pushes its weights; "
        "ppo, impala: workers only act and push rollouts to a learner process beside the "
        "master, whose new weights ride back on the replies: distributed PPO, IMPALA (V-trace); "
        "dqn: asynchronous DQN and Gorila, each worker with its own epsilon and replay pushes "
        "DQN gradients against the master's target network; apex: Ape-X, actors with their own "
        "epsilons push prioritized transitions to the learner's replay. Each starts from its own "
        "defaults, then the task's preset. A config of before (with sync_mode) still opens, "
        "with a note.",
    )
    max_staleness: int = Field(
        128,
        ge=0,
        description="Gradients computed on weights more than this many versions old are "
        "refused with 409.",
    )
    staleness_scaling: Literal["none", "inverse"] = Field(
        "none",
        description="a3c and dqn: inverse divides the learning rate of each update by its "
        "staleness, the versions between the weights its gradients were computed on and the "
        "current ones (at least 1), as staleness-aware async SGD (Zhang et al., IJCAI 2016); "
        "none: every update takes the full learning rate. max_staleness still refuses older "
        "gradients. A large model with several workers learned reliably only with inverse or "
        'fewer pushes in flight (docs/performance.md, "Staleness").',
    )
    max_in_flight: int = Field(
        16,
        ge=0,
        le=64,
        description="Gradient pushes a worker keeps in flight while it collects its next "
        "rollouts (a3c, dqn): as many as the round trip needs, up to this many and never "
        "more than max_staleness. 0: wait for each reply before the next rollout; a2c "
        "always waits. A large model with several workers learned reliably only with 0 or 1 "
        '(docs/performance.md, "Staleness"). ppo and impala: at most 1 experience push. With 0 '
        "a ppo worker waits for each reply, which the master holds until the update that takes "
        "its rollout is published (a push that does not complete a batch up to sync_timeout_s, "
        "while at least queue_size workers run): every worker acts with the newest weights, as "
        "synchronous PPO. With 1 (the seed's DPPO) the workers act on while the learner "
        "updates, and what they collected meanwhile joins a later batch, a version or two old.",
    )
    wire_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="What the parameters' weights and gradients travel as between the master "
        "and the workers. bfloat16: half the bytes of each push and reply, every value rounded "
        "to bfloat16's 8-bit significand (a relative error of at most 2**-8); the running "
        "statistics still travel as float32, and the master keeps, steps and saves float32. "
        "A tensor body in another dtype than the run's is refused with 422.",
    )
    max_episodes: int | None = Field(None, ge=1, description="Finish after this many episodes.")
    max_steps: int | None = Field(
        2_000_000,
        ge=1,
        description="Finish after this many environment steps, all workers together, counting "
        "the steps of episodes still going on (env_steps in /status), so it also ends a task "
        "whose episodes never end.",
    )
    target_return: float | None = Field(
        None,
        description="Finish once the mean return of the last 100 episodes reaches this (judged "
        "once there are 100, like gymnasium's 'solved'), or that of the latest evaluation with "
        "solved_on=eval. Unset: the environment's reward_threshold (475 for CartPole-v1), if it "
        "has one.",
    )
    seed: int | None = Field(
        None,
        ge=0,
        le=MAX_SEED,
        description="Seed of the initial weights and the environments (worker W adds a hash "
        "of its id); unset draws one, saved with the run.",
    )
    heartbeat_interval_s: float = Field(
        2.0,
        gt=0,
        le=3600,
        description="A worker that had no reply from the master for this long sends a "
        "heartbeat (every gradient push already reports its progress); with algo best_weights, "
        "how often it reports and syncs weights.",
    )
    heartbeat_timeout_s: float = Field(
        30.0, gt=0, le=86_400, description="A worker silent for longer than this is marked lost."
    )
    start_timeout_s: float | None = Field(
        None,
        gt=0,
        le=86_400,
        description="A worker that accepted POST /start_worker but has not sent its first "
        "message within this is marked lost; unset: heartbeat_timeout_s. Raise it when starting "
        "a worker takes longer than a short heartbeat timeout.",
    )

    # Per-worker exploration (a3c_http/algos/exploration.py): worker k of n explores its own amount.
    entropy_coef_max: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="Spread entropy_coef over the workers: worker k (from 0: its place in the "
        "run's worker list, then the order in which workers joined) uses entropy_coef + "
        "(entropy_coef_max - entropy_coef) * s(k), s = 0, 1, 1/2, 1/4, 3/4, 1/8, ... (the "
        "midpoints of the gaps so far, so no worker needs to know how many will join). Unset: "
        "every worker uses entropy_coef.",
    )
    log_std_spread: float = Field(
        0.0,
        ge=0,
        le=MAX_LOG_STD_SPREAD,
        allow_inf_nan=False,
        description="Continuous actions only: worker k adds log_std_spread * s(k) (s as for "
        "entropy_coef_max) to the log standard deviation of its Gaussian policy, both to act "
        "and in its loss (the "
        "wider Gaussian is that worker's policy, so its gradients stay on-policy). 0: off; 422 "
        "for discrete actions.",
    )
    # Evaluation of the global network while it trains (master/background/evaluator.py).
    eval_every_updates: int | None = Field(
        None,
        ge=1,
        description="Play the global weights as the run's algorithm plays its policy (an "
        "actor-critic as it samples, from noise seeded per episode; a Q-network greedily) on the "
        "master's own environment copies whenever the model version has advanced by at least "
        "this many since the last evaluation started, and once more for the final weights when "
        "the run finishes; unset: no evaluation.",
    )
    eval_episodes: int = Field(
        10, ge=1, le=1000, description="Episodes each evaluation plays (their mean is reported)."
    )
    solved_on: Literal["train", "eval"] = Field(
        "train",
        description="What target_return is judged on: train, the mean return of the last 100 "
        "training episodes; eval, the mean return of the latest evaluation (needs "
        "eval_every_updates). Default: train for an actor-critic, whose training episodes sample "
        "the policy as a3c-evaluate plays it; eval for dqn and apex, whose Q-network "
        "a3c-evaluate plays greedily.",
    )

    # Refusing outlier updates (Gorila) and the rounds of algo a2c.
    outlier_sigma: float | None = Field(
        6.0,
        gt=0,
        allow_inf_nan=False,
        description="An update whose gradient norm (its log) is more than this many standard "
        "deviations above the mean of the last 100 updates of the same worker, or whose loss "
        "(the log of its size) is that far above theirs, is refused with 409 and counted in "
        "updates_refused_outlier; null turns the check off.",
    )
    outlier_warmup: int = Field(
        50,
        ge=1,
        le=100,
        description="Updates of a worker the outlier check needs before it judges that worker's "
        "(at most the window of 100).",
    )
    sync_timeout_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="a2c: a round applies what it gathered this long after its first "
        "gradient, without the running workers that did not send one. Must be below "
        "heartbeat_timeout_s. ppo with max_in_flight 0: how long a reply waits for the update that "
        "takes its rollout.",
    )

    @classmethod
    def algorithm(cls) -> type:
        """The algorithm class of this section (a3c_http/algos/base.py `Algorithm`), imported
        on first use so that a config is read without torch."""
        raise NotImplementedError(f"{cls.__name__} is the shared section, not an algorithm's")

    @model_validator(mode="wrap")
    @classmethod
    def _unknown_fields_say_what_was_meant(
        cls, data: Any, handler: ModelWrapValidatorHandler[TrainConfig]
    ) -> TrainConfig:
        """An unknown field stays refused (`extra="forbid"`) where it is; its message says what
        the user may have meant."""
        try:
            return handler(data)
        except ValidationError as exc:
            raise with_field_hints(exc, cls.model_fields) from None

    @field_validator(
        "lr", "gamma", "gae_lambda", "entropy_coef", "value_coef", "max_grad_norm", "target_return"
    )
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        return with_preset(data, cls.defaults, cls.presets)

    @field_validator("env_id")
    @classmethod
    def _registered(cls, v: str) -> str:
        try:
            env_spec(v)
        except ValueError as exc:  # the message alone, not "Value error, ..."
            raise PydanticCustomError("value_error", str(exc)) from None
        return v

    @model_validator(mode="after")
    def _fields_agree(self) -> TrainConfig:
        """Fields that must agree with each other; the message says what to change."""
        if self.normalize_obs and self.encoder != "mlp":
            raise ValueError(
                f"normalize_obs with encoder {self.encoder!r}: the CNN encoders scale image "
                "observations to [0, 1] instead of normalising them; leave normalize_obs false"
            )
        if self.lstm_first and self.core == "lstm" and self.shared_torso:
            raise ValueError("lstm_first gives the policy and the value a torso each after the "
                             "LSTM, and shared_torso one for both: leave one of them false")
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ValueError(
                "heartbeat_timeout_s must be larger than heartbeat_interval_s, "
                "or every worker would be marked lost between two heartbeats"
            )
        if self.solved_on == "eval" and self.eval_every_updates is None:
            raise ValueError(
                "solved_on='eval' needs eval_every_updates: without evaluations there is no "
                "evaluation to judge target_return on"
            )
        return self

    def resolved(self) -> TrainConfig:
        """The config with `target_return` and `seed` filled in, as saved with a run."""
        updates: dict[str, Any] = {}
        if self.target_return is None:
            threshold = env_spec(self.env_id).reward_threshold
            if threshold is not None:
                updates["target_return"] = float(threshold)
        if self.seed is None:
            updates["seed"] = int.from_bytes(os.urandom(4), "little") >> 1
        return self.model_copy(update=updates) if updates else self
